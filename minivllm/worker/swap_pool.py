"""V0's swap pool: the worker's side of swap preemption (vLLM V0 twin: vllm/worker/
cache_engine.py, CacheEngine's cpu_cache, swap_out and swap_in).

V0's scheduler (core/v0/scheduler.py) preempts a request by swapping: it picks host blocks in
its cpu_block_manager and sends the pairs in the SchedulerOutput (`blocks_to_swap_out`:
(device block, host block); `blocks_to_swap_in`: (host block, device block)). This pool holds
those host blocks, the device pool's layout in host memory (pinned on CUDA), and the Worker
copies the step's pairs before the runner runs it: out first, since the device blocks swapped
out may be handed to another request this very step.

V1 has no swap: its successor is the CPU offloading tier (minivllm/kv_offload/), where a
preempted request's blocks already are. Only V0's scheduler asks for this pool (the Worker
makes it when preemption_mode is "swap"), so V1's runner has no swap path. It is counted with
V0's package (scripts/line_budget.py).
"""

from __future__ import annotations

import torch

from minivllm.worker.model_runner import ModelRunner, copy_blocks


class SwapPool:
    def __init__(self, runner: ModelRunner, num_blocks: int):
        """num_blocks: what swap_space holds (Worker.num_host_blocks)."""
        self.kv_cache = runner.allocate_host_kv_cache(num_blocks)
        self.num_blocks = num_blocks

    @torch.inference_mode()
    def swap(self, blocks_to_swap_out, blocks_to_swap_in, device_cache: torch.Tensor) -> None:
        """This step's swaps, in every layer: out to the host, then in to the device."""
        copy_blocks(blocks_to_swap_out, device_cache, self.kv_cache)
        copy_blocks(blocks_to_swap_in, self.kv_cache, device_cache)
