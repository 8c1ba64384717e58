"""Worker: one device's share of the engine, as the executor drives it (vLLM twin:
vllm/v1/worker/gpu_worker.py).

    load_model()                 build the ModelRunner: the model, its weights (this rank's
                                 shard under tensor parallelism)
    determine_num_blocks()       how many KV blocks this device holds (the rules below); the
                                 executor gives every rank the smallest count
    initialize_cache(vc, n)      the weights' format, the configuration's state, a pool of n
                                 blocks, and speculative decoding's drafter
    compile_or_warm_up_model()   torch.compile, CUDA graphs over that pool
    execute_model(so)            one step (ModelRunner.execute_model), and with a
                                 kv_transfer_config the KV connector's worker side around it:
                                 received K/V into the pool before the forward, a prompt's
                                 K/V sent after (minivllm/distributed/kv_transfer/)
    add_lora(r), list_loras()    the engine core's LoRA calls (one worker: LoRA runs unsplit)

The pool's size, first rule that applies: num_kv_blocks blocks; kv_cache_memory bytes; on
CUDA, what profiling one full step leaves within gpu_memory_utilization; on a CPU, 1 GiB.

Left out, compared with vLLM: device and distributed initialisation (the executor makes the
process group), sleep mode, and profiling with a dummy batch of every sampler option.
"""

from __future__ import annotations

import logging

import torch

from minivllm.config import VllmConfig
from minivllm.core.scheduler_output import SchedulerOutput
from minivllm.outputs import ModelRunnerOutput
from minivllm.spec_decode.decoder import make_drafter
from minivllm.worker.model_runner import ModelRunner, allocate_kv_cache, copy_blocks

logger = logging.getLogger("minivllm")

DEFAULT_CPU_KV_CACHE_MEMORY = 1 << 30     # bytes, when nothing else sizes the pool


class Worker:
    def __init__(self, vllm_config: VllmConfig, device: torch.device | None = None, tp=None,
                 sampler=None, pp=None):
        """device: this rank's (None: the model config's)."""
        self.vllm_config = vllm_config
        self.device = device if device is not None else vllm_config.model_config.device
        self.tp = tp                         # this rank's TensorParallelGroup, or None
        self.pp = pp                         # ... and its PipelineParallelGroup, or None
        self.sampler = sampler
        self.model_runner: ModelRunner | None = None
        self.kv_connector = None             # the KV connector's worker side, if any
        self.swap_pool = None                # V0's swap preemption's host pool, if any

    def load_model(self) -> None:
        self.model_runner = ModelRunner(self.vllm_config, self.device, tp=self.tp,
                                        sampler=self.sampler, pp=self.pp)

    def initialize_cache(self, vllm_config: VllmConfig, num_blocks: int | None = None) -> int:
        """Set vllm_config on the loaded weights and give the runner its pool: num_blocks
        blocks, or as many as determine_num_blocks finds. Returns the blocks allocated."""
        runner = self.model_runner
        self.vllm_config = vllm_config
        runner.set_weight_format(vllm_config.model_config)
        runner.configure(vllm_config)
        if num_blocks is None:
            num_blocks = self.determine_num_blocks()
        runner.initialize_kv_cache(num_blocks)
        self.swap_pool = None
        if vllm_config.scheduler_config.preemption_mode == "swap":     # V0's (core/v0/)
            from minivllm.worker.swap_pool import SwapPool
            self.swap_pool = SwapPool(runner, self.num_host_blocks(
                vllm_config.cache_config.swap_space))
        if vllm_config.kv_transfer_config is not None and self.kv_connector is None:
            from minivllm.distributed.kv_transfer.kv_connector import KVConnectorWorker
            self.kv_connector = KVConnectorWorker(vllm_config, runner)
        elif vllm_config.kv_transfer_config is None:     # the CPU tier, or no connector
            self.kv_connector = None
            if vllm_config.cache_config.kv_offloading_size is not None:
                from minivllm.kv_offload.connector import OffloadingConnectorWorker
                self.kv_connector = OffloadingConnectorWorker(runner, self.num_host_blocks(
                    vllm_config.cache_config.kv_offloading_size), copy_blocks)
        # Speculative decoding's drafter, on the rank that samples (a draft model runs in a
        # Worker of its own: the class is passed, spec_decode/ imports nothing of worker/).
        runner.drafter = make_drafter(vllm_config, runner, Worker) if runner.is_driver else None
        return num_blocks

    def num_host_blocks(self, gib: float) -> int:
        """How many of the runner's blocks `gib` GiB of host memory hold; split across
        processes, the smallest count of any rank (the scheduler names the same blocks on
        all of them)."""
        num_blocks = int(gib * 2**30) // self.model_runner.block_bytes
        group = self.pp or self.tp
        return group.all_reduce_min(num_blocks) if group is not None else num_blocks

    @property
    def num_cpu_blocks(self) -> int:
        """Blocks of this worker's pool in host memory: V0's swap pool, or the CPU tier's."""
        return getattr(self.swap_pool or self.kv_connector, "num_blocks", 0)

    def determine_num_blocks(self) -> int:
        """How many blocks this device's pool holds (the rules in the module docstring);
        split across processes, the smallest count of any rank (a pipeline stage holds its
        layers only: more blocks in the same bytes)."""
        cache_config = self.vllm_config.cache_config
        runner = self.model_runner
        if cache_config.num_kv_blocks is not None:
            num_blocks = cache_config.num_kv_blocks
        else:
            if cache_config.kv_cache_memory is not None:
                budget = cache_config.kv_cache_memory
            elif self.device.type == "cuda":
                budget = self._profile_kv_budget()
            else:
                budget = DEFAULT_CPU_KV_CACHE_MEMORY
            num_blocks = budget // runner.block_bytes
            if num_blocks < 1:
                raise ValueError(f"the KV budget ({budget / 2**20:.1f} MiB) holds no block of "
                                 f"{runner.block_bytes / 2**20:.2f} MiB; raise kv_cache_memory "
                                 "or lower max_model_len / block_size")
        group = self.pp or self.tp           # the world, or the one stage's ranks
        return group.all_reduce_min(num_blocks) if group is not None else num_blocks

    @torch.inference_mode()
    def _profile_kv_budget(self) -> int:
        """CUDA: what is left for KV after weights and the peak activations of the largest
        step (a prefill of max_num_batched_tokens), within gpu_memory_utilization."""
        scheduler_config = self.vllm_config.scheduler_config
        runner = self.model_runner
        n = min(scheduler_config.max_num_batched_tokens, scheduler_config.max_model_len)
        scratch = allocate_kv_cache(runner.kv_config, -(-n // runner.block_size),
                                    runner.block_size, runner.dtype, self.device,
                                    runner.kv_cache_dtype)
        runner.bind_kv_cache(scratch)
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        before = torch.cuda.memory_allocated(self.device)
        runner.prompt_logits([0] * n, list(range(scratch.shape[2])))
        torch.cuda.synchronize(self.device)
        activations = torch.cuda.max_memory_allocated(self.device) - before
        del scratch
        torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info(self.device)
        used_by_others = total - free
        utilization = self.vllm_config.cache_config.gpu_memory_utilization
        budget = int(total * utilization - used_by_others - activations)
        logger.info("profiled a %d-token step: %.0f MiB of activations; %.0f MiB left for KV",
                    n, activations / 2**20, budget / 2**20)
        return budget

    def compile_or_warm_up_model(self) -> None:
        self.model_runner.compile_or_warm_up_model()

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        runner = self.model_runner
        so = scheduler_output
        if self.swap_pool is not None:       # V0's swaps, before the blocks are reused
            self.swap_pool.swap(so.blocks_to_swap_out, so.blocks_to_swap_in, runner.kv_cache)
        kv_meta = so.kv_connector_metadata
        if kv_meta is not None:              # vLLM: the runner's KVConnectorModelRunnerMixin
            self.kv_connector.start_load_kv(kv_meta, runner.kv_cache, runner.sampler)
        output = runner.execute_model(scheduler_output)
        if kv_meta is not None:
            self.kv_connector.wait_for_save(kv_meta, runner.kv_cache, runner.sampler, output)
        return output

    def add_lora(self, lora_request) -> None:
        manager = self.model_runner.lora_manager
        if manager is None:
            raise ValueError(f"{lora_request} was given, but LoRA is off: start the engine "
                             "with enable_lora=True (and max_loras, max_lora_rank)")
        manager.add_lora(lora_request)

    def list_loras(self) -> set[int]:
        manager = self.model_runner.lora_manager
        return set(manager.slots) if manager else set()

    def prompt_logits(self, token_ids: list[int], block_table: list[int]) -> torch.Tensor:
        return self.model_runner.prompt_logits(token_ids, block_table)
