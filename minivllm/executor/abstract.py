"""Executor: the engine core's handle on the devices (vLLM twin: vllm/v1/executor/abstract.py).

The core calls `execute_model(scheduler_output)` once a step and gets the driver's (rank 0's)
ModelRunnerOutput (finished requests reach the workers inside the next SchedulerOutput, as in
V1: no call of their own); `initialize_cache(vllm_config)` sets a configuration on every worker
(the engine's start and LLMEngine.reconfigure). Each is one `collective_rpc`: the same Worker
method on every rank, the driver's answer returned. `executor_class`
(minivllm/executor/__init__.py) picks the executor from `distributed_executor_backend` (vLLM:
Executor.get_class).

Pipeline parallelism and async scheduling: `max_concurrent_batches` (pp, or 2; 1 otherwise)
says how many steps the core may keep in flight, and `execute_model(so, non_block=True)`
starts one and returns what its `.result()` finishes (MultiprocExecutor, UniProcExecutor).
"""

from __future__ import annotations

from minivllm.config import VllmConfig
from minivllm.core.kv_cache import KVCacheConfig


class Executor:
    driver_worker = None                     # the sampling rank's Worker, in the core's process
    max_concurrent_batches = 1               # steps in flight at once (pp, async scheduling)

    def collective_rpc(self, method: str, *args):
        """Run Worker.method(*args) on every worker; the driver's result."""
        raise NotImplementedError

    @property
    def tp(self):
        """The driver's TensorParallelGroup (its collective counters, for lesson 15), or None."""
        return self.driver_worker.tp

    @property
    def pp(self):
        """The driver's PipelineParallelGroup (its sends and waits, bench parallel), or None."""
        return self.driver_worker.pp

    @property
    def kv_cache_config(self) -> KVCacheConfig:
        """The driver's pools: on the device, and in host memory (V0's swap pool,
        worker/swap_pool.py, or the CPU offloading tier, kv_offload/; 0 blocks without one)."""
        worker = self.driver_worker
        return KVCacheConfig(worker.model_runner.num_blocks, worker.num_cpu_blocks,
                             worker.model_runner.block_bytes)

    def initialize_cache(self, vllm_config: VllmConfig) -> None:
        """Set vllm_config on every worker's loaded weights: format, state, pool, compilation.
        The split is fixed at start (checked here, before any worker sees the config)."""
        runner = self.driver_worker.model_runner
        for kind, size in (("tensor", runner.tp_size), ("pipeline", runner.pp_size)):
            if getattr(vllm_config.parallel_config, f"{kind}_parallel_size") != size:
                raise ValueError(f"{kind}_parallel_size is fixed when the engine starts (here "
                                 f"{size}): start a new LLM for another size")
        self.collective_rpc("initialize_cache", vllm_config)
        self.collective_rpc("compile_or_warm_up_model")

    def execute_model(self, scheduler_output):
        return self.collective_rpc("execute_model", scheduler_output)

    def prompt_logits(self, token_ids: list[int], block_table: list[int]):
        return self.collective_rpc("prompt_logits", token_ids, block_table)

    def shutdown(self) -> None:
        """Stop the workers, if any ran elsewhere."""
