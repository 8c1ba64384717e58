"""The CPU tier as a KV connector: its scheduler side and its worker side (vLLM twin:
vllm/distributed/kv_transfer/kv_connector/v1/offloading_connector.py, OffloadingConnector,
and vllm/v1/kv_offload/worker/cpu_gpu.py).

    scheduler side (the core)                     worker side (each Worker, every rank)
    update_state_after_alloc(request):            start_load_kv: loads, host -> GPU blocks,
      past its GPU prefix hits, the tier's hits     before the forward
      become loads into its new blocks, counted   wait_for_save: stores, GPU -> host blocks,
      as computed                                   after the forward
    build_connector_meta(scheduler_output):
      the full blocks this step computes become
      stores (the tier evicts its least recently
      used to make room)

Order makes it safe without waiting: loads run before the forward that reads them, stores
after the forward that wrote them, and a host block a store reuses was read by this step's
loads, if any, before. The last token of a prompt is always computed (its logits are needed),
so a request loads at most its blocks before the one holding that token.

Left out, compared with vLLM: asynchronous transfers on a copy stream with the request held in
WAITING_FOR_REMOTE_KVS until they land (here a load is a plain copy before the step's forward:
the batch waits for it), the LMCache backend, and stores of blocks whose request is done
(vLLM's request_finished may delay freeing until a store lands; here every store is decided in
the step that computes the block).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from minivllm.core.block_manager import BlockManager
from minivllm.core.request import Request
from minivllm.kv_offload.manager import CPUOffloadingManager


@dataclass(slots=True)
class OffloadingConnectorMetadata:
    """One step's transfers, block ids only."""

    loads: list[tuple[int, int]] = field(default_factory=list)    # (host block, GPU block)
    stores: list[tuple[int, int]] = field(default_factory=list)   # (GPU block, host block)


class OffloadingConnectorScheduler:
    def __init__(self, kv_cache_config, block_manager: BlockManager):
        """kv_cache_config: the executor's pools (core/kv_cache.py); the tier is its host pool."""
        self.manager = CPUOffloadingManager(kv_cache_config.num_cpu_blocks)
        self.block_manager = block_manager
        self.block_bytes = kv_cache_config.block_bytes
        self.loads: list[tuple[int, int]] = []    # decided at admission, sent with the step
        self.num_queried_tokens = self.num_hit_tokens = 0   # prompt tokens past the GPU's hits

    def _key(self, request: Request, i: int) -> tuple:
        """What a hash stands for: the parent's hash, the block's tokens, the adapter."""
        bs = self.block_manager.block_size
        parent = self.block_manager.block_hash(request, i - 1) if i else None
        return parent, tuple(request.token_ids[i * bs:(i + 1) * bs]), request.extra_keys

    def update_state_after_alloc(self, request: Request) -> None:
        """The request just got its blocks, its GPU prefix hits counted as computed: the
        tier's hits after those are loaded into its next blocks and count as computed too."""
        bm = self.block_manager
        first = request.num_computed_tokens // bm.block_size
        blocks = range(first, (len(request) - 1) // bm.block_size)
        hits = self.manager.lookup((bm.block_hash(request, i), self._key(request, i))
                                   for i in blocks)        # hashed only up to the first miss
        self.loads += zip(hits, request.block_table[first:first + len(hits)])
        request.num_computed_tokens += len(hits) * bm.block_size
        self.num_queried_tokens += len(blocks) * bm.block_size
        self.num_hit_tokens += len(hits) * bm.block_size

    def build_connector_meta(self, scheduler_output, requests: dict
                             ) -> OffloadingConnectorMetadata | None:
        """The step's loads, and a store for every block that this step's tokens fill (drafts
        aside: they may be rejected) and the tier does not hold."""
        bs = self.block_manager.block_size
        stores = []
        for s in scheduler_output.scheduled:
            request = requests[s.request_id]
            num_full = (s.num_computed_tokens + s.num_tokens - s.num_draft_tokens) // bs
            for i in range(s.num_computed_tokens // bs, num_full):
                block_hash = self.block_manager.block_hash(request, i)
                host_block = self.manager.store(block_hash, self._key(request, i))
                if host_block is not None:
                    stores.append((request.block_table[i], host_block))
        if not (self.loads or stores):
            return None
        meta = OffloadingConnectorMetadata(self.loads, stores)
        self.loads = []
        return meta

    def stats(self) -> dict[str, int]:
        """The tier's counters since the start, as EngineStats fields (vLLM's names: the
        external prefix cache's queries and hits in tokens, kv_offload's bytes each way; the
        bytes are one device's: each copies its own share of a block over its own link)."""
        m = self.manager
        return dict(external_prefix_cache_queried_tokens=self.num_queried_tokens,
                    external_prefix_cache_hit_tokens=self.num_hit_tokens,
                    kv_offload_num_blocks_used=m.num_used_blocks,
                    kv_offload_num_blocks_total=m.num_blocks,
                    kv_offload_stored_blocks=m.num_stored_blocks,
                    kv_offload_loaded_blocks=m.num_loaded_blocks,
                    kv_offload_store_bytes=m.num_stored_blocks * self.block_bytes,
                    kv_offload_load_bytes=m.num_loaded_blocks * self.block_bytes)

    def reset(self) -> None:
        self.manager.reset()


class OffloadingConnectorWorker:
    """The host pool (the GPU pool's layout, pinned on CUDA) and the step's copies."""

    def __init__(self, runner, num_blocks: int, copy_blocks):
        """num_blocks: what kv_offloading_size holds (Worker.num_host_blocks). copy_blocks:
        the Worker's (worker/model_runner.py), every layer at once; this package imports
        nothing of worker/, which imports it."""
        self.kv_cache = runner.allocate_host_kv_cache(num_blocks)
        self.num_blocks = num_blocks
        self.copy = copy_blocks

    def start_load_kv(self, meta: OffloadingConnectorMetadata, kv_cache, sampler) -> None:
        """Before the forward: the tier's blocks into the GPU blocks just allocated."""
        self.copy(meta.loads, self.kv_cache, kv_cache)

    def wait_for_save(self, meta: OffloadingConnectorMetadata, kv_cache, sampler,
                      output) -> None:
        """After the forward: the blocks it filled, into the tier."""
        self.copy(meta.stores, kv_cache, self.kv_cache)
