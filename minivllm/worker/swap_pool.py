"""V0's swap pool: the worker's side of swap preemption (vLLM V0 twin: vllm/worker/
cache_engine.py, CacheEngine's cpu_cache, swap_out and swap_in).

V0's scheduler (core/v0/scheduler.py) preempts a request by swapping: it picks host blocks in
its cpu_block_manager and sends the pairs in the SchedulerOutput (`blocks_to_swap_out`:
(device block, host block); `blocks_to_swap_in`: (host block, device block)). This pool holds
those host blocks, the device pool's layout in host memory (pinned on CUDA, so the copies can
overlap), and the Worker copies the step's pairs before the runner runs it: out first, since
the device blocks swapped out may be handed to another request this very step.

V1 has no swap: the KV offloading tier takes its place. Only V0's scheduler asks for one, so
V1's runner has no host pool and no swap path; the Worker makes this pool when
preemption_mode is "swap". It is counted with V0's package (scripts/line_budget.py).
"""

from __future__ import annotations

import torch

from minivllm.worker.model_runner import ModelRunner, allocate_kv_cache


class SwapPool:
    def __init__(self, runner: ModelRunner, swap_space: int):
        """swap_space: bytes of host memory; the pool holds as many of the runner's blocks."""
        self.num_blocks = swap_space // runner.block_bytes
        self.kv_cache = allocate_kv_cache(runner.kv_config, self.num_blocks, runner.block_size,
                                          runner.dtype, torch.device("cpu"),
                                          runner.kv_cache_dtype)
        if runner.device.type == "cuda":
            self.kv_cache = self.kv_cache.pin_memory()

    @torch.inference_mode()
    def swap(self, blocks_to_swap_out, blocks_to_swap_in, device_cache: torch.Tensor) -> None:
        """This step's swaps, in every layer: out to the host, then in to the device."""
        copy_blocks(blocks_to_swap_out, device_cache, self.kv_cache)
        copy_blocks(blocks_to_swap_in, self.kv_cache, device_cache)


def copy_blocks(pairs: list[tuple[int, int]], src: torch.Tensor, dst: torch.Tensor) -> None:
    """dst's block b becomes a copy of src's block a, for each (a, b), in every layer."""
    if pairs:
        src_blocks, dst_blocks = map(list, zip(*pairs))
        dst[:, :, dst_blocks] = src[:, :, src_blocks].to(dst.device)
