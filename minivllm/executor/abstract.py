"""Executor: the engine core's handle on the devices (vLLM twin: vllm/v1/executor/abstract.py).

The core calls `execute_model(scheduler_output)` once a step and gets the driver's (rank 0's)
ModelRunnerOutput; `initialize_cache(vllm_config)` sets a configuration on every worker (the
engine's start and LLMEngine.reconfigure); `free(seq_ids)` drops finished samples' state on
every worker. Each is one `collective_rpc`: the same Worker method on every rank, the driver's
answer returned. `executor_class` (minivllm/executor/__init__.py) picks the executor from
`distributed_executor_backend` (vLLM: Executor.get_class).

Left out, compared with vLLM: the Ray executor, pipeline parallelism's batch queue, and
asynchronous (non-blocking) execute_model.
"""

from __future__ import annotations

from minivllm.config import VllmConfig


class Executor:
    driver_worker = None                     # rank 0's Worker, in the core's process

    def collective_rpc(self, method: str, *args):
        """Run Worker.method(*args) on every worker; the driver's result."""
        raise NotImplementedError

    @property
    def num_blocks(self) -> int:
        return self.driver_worker.model_runner.num_blocks

    @property
    def num_cpu_blocks(self) -> int:
        return self.driver_worker.model_runner.num_cpu_blocks

    def initialize_cache(self, vllm_config: VllmConfig) -> None:
        """Set vllm_config on every worker's loaded weights: format, state, pool, compilation."""
        self.collective_rpc("initialize_cache", vllm_config)
        self.collective_rpc("compile_or_warm_up_model")

    def execute_model(self, scheduler_output):
        return self.collective_rpc("execute_model", scheduler_output)

    def free(self, seq_ids: list[int]) -> None:
        if seq_ids:
            self.collective_rpc("free", seq_ids)

    def prompt_logits(self, token_ids: list[int], block_table: list[int]):
        return self.collective_rpc("prompt_logits", token_ids, block_table)

    def shutdown(self) -> None:
        """Stop the workers, if any ran elsewhere."""
