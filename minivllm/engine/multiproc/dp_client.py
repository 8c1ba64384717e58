"""DPLBClient: data parallelism, several engine cores behind one front end (vLLM twin:
DPLBAsyncMPClient in vllm/v1/engine/core_client.py).

    client = DPLBClient(vllm_config)     # data_parallel_size cores, each a SyncMPClient's
                                         # process: a whole replica with its own KV pool
    client.add_request(request)          -> the replica with the lowest score, now
    client.get_output()                  <- the next outputs any replica sent

Each replica is the engine `vllm_config` describes (tp x pp ranks of its own), started in
parallel: data_parallel_size_local of them here, the rest headless on other hosts (`minivllm
serve --headless`), each connecting to data_parallel_address at its own pair of ports. The
front end (LLMEngine) sees one client with InprocClient's methods: a request goes to one
replica and stays there, so its aborts and stop strings reach that replica; utility calls go
to every replica (reconfigure, adapters) or to the first (prompt logits); stats are
summed.

Which replica: minivllm/routing.py's Router, as data_parallel_balance says: vLLM V1's rule
before 0.33 ("score"), the lowest `4 x waiting + running` from each replica's last stats
snapshot (it comes with every step's outputs) plus the requests sent to it since whose first
output has not come back (counted as waiting: the snapshot does not know them yet);
"round_robin", the baseline it is measured against; or "prefix", the cached blocks each
replica's KV events reported against that load (`client.balance` may change between
requests: bench parallel, lesson 18).

Left out, compared with vLLM: the coordinator process that publishes the replicas' queue
lengths and runs the DP "waves" (MoE models keep idle replicas stepping in lockstep; dense
ones need not), a heartbeat for replicas on other hosts, and the asyncio client.
"""

from __future__ import annotations

import queue
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import fields

import torch

from minivllm.config import VllmConfig
from minivllm.engine.core import EngineCoreRequest
from minivllm.engine.core_client import EngineCoreClient, EngineDeadError
from minivllm.engine.multiproc.client import READY_TIMEOUT_S, SyncMPClient
from minivllm.engine.stats import EngineStats
from minivllm.outputs import EngineCoreOutputs
from minivllm.routing import Router, load_score


def sum_stats(snapshots: list[EngineStats]) -> EngineStats:
    """The replicas' snapshots added up, field by field."""
    total = {}
    for f in fields(EngineStats):
        values = [getattr(s, f.name) for s in snapshots]
        if isinstance(values[0], tuple):         # per-position counts, position by position
            width = max(map(len, values))
            total[f.name] = tuple(sum(v[i] for v in values if i < len(v)) for i in range(width))
        else:
            total[f.name] = sum(values)
    return EngineStats(**total)


class DPLBClient(EngineCoreClient):
    def __init__(self, vllm_config: VllmConfig, ready_timeout: float = READY_TIMEOUT_S):
        parallel = vllm_config.parallel_config
        n, world = parallel.data_parallel_size, parallel.world_size
        self.vllm_config = vllm_config
        self.router = Router(n, vllm_config)      # first: a bad balance fails before starting
        self.outputs: queue.Queue = queue.Queue()        # every replica's, as they come
        cuda = vllm_config.model_config.device.type == "cuda"

        local = parallel.data_parallel_size_local
        local = n if local is None else local

        def start(rank: int) -> SyncMPClient:
            if rank >= local:             # a headless core on another host connects to us
                port = parallel.data_parallel_rpc_port + 2 * rank
                return SyncMPClient(vllm_config, ready_timeout, outputs=self.outputs,
                                    address=f"{parallel.data_parallel_address}:{port}",
                                    engine_index=rank)
            # Its own GPUs; on a CPU, its share of the cores (n replicas at the default thread
            # count each would oversubscribe them n times over).
            env = ({"CUDA_VISIBLE_DEVICES": ",".join(
                str(d) for d in range(rank * world, (rank + 1) * world))} if cuda
                else {"OMP_NUM_THREADS": str(max(1, torch.get_num_threads() // local))})
            return SyncMPClient(vllm_config, ready_timeout, outputs=self.outputs, env=env,
                                engine_index=rank)

        with ThreadPoolExecutor(n) as pool:                # the replicas load at once
            futures = [pool.submit(start, rank) for rank in range(n)]
        errors = [f.exception() for f in futures if f.exception() is not None]
        self.replicas = [f.result() for f in futures if f.exception() is None]
        if errors:
            self.shutdown()
            raise errors[0]
        self.info = self.replicas[0].info
        self.owner: dict[str, int] = {}                   # request id -> its replica
        self.unseen: list[set[str]] = [set() for _ in range(n)]   # sent, no output back yet
        self.num_added = [0] * n                           # requests each replica was given

    @property
    def pid(self) -> int:
        return self.replicas[0].pid

    @property
    def pids(self) -> list[int]:
        return [r.pid for r in self.replicas]

    # ---------------------------------------------------------------- requests in, outputs out
    def score(self, rank: int) -> int:
        return load_score(self.replicas[rank].process.stats, len(self.unseen[rank]))

    def add_request(self, request: EngineCoreRequest) -> None:
        rank = self.router.choose(request.request_id, request.prompt_token_ids,
                                  [self.score(r) for r in range(len(self.replicas))],
                                  request.lora_request)
        self.owner[request.request_id] = rank
        self.unseen[rank].add(request.request_id)
        self.num_added[rank] += 1
        self.replicas[rank].add_request(request)

    def get_output(self, timeout: float = 1.0) -> EngineCoreOutputs:
        """The next outputs any replica sent (empty ones after `timeout`, or after wake())."""
        try:
            item = self.outputs.get(timeout=timeout)
        except queue.Empty:
            item = None
        if isinstance(item, EngineDeadError):
            self.outputs.put(item)
            raise item
        if item is None:
            return EngineCoreOutputs(timestamp=time.perf_counter())
        self.router.apply(item.engine_index, item.kv_events)
        for output in item.outputs:
            rank = self.owner.get(output.request_id)
            if rank is not None:
                self.unseen[rank].discard(output.request_id)
                if output.finish_reason is not None:
                    del self.owner[output.request_id]
        return item

    def wake(self) -> None:
        self.outputs.put(None)

    def _by_replica(self, request_ids) -> dict[int, list[str]]:
        groups: dict[int, list[str]] = {}
        for request_id in request_ids:
            rank = self.owner.pop(request_id, None)
            if rank is not None:
                self.unseen[rank].discard(request_id)
                groups.setdefault(rank, []).append(request_id)
        return groups

    def abort_requests(self, request_ids, errors: dict[str, str] | None = None) -> list:
        for rank, ids in self._by_replica(request_ids).items():
            self.replicas[rank].abort_requests(ids, {i: errors[i] for i in ids
                                                     if errors and i in errors})
        return []

    def finish_stopped(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            rank = self.owner.get(request_id)
            if rank is not None:
                self.replicas[rank].finish_stopped([request_id])

    def has_unfinished_requests(self) -> bool:
        return False                         # the front end's OutputProcessor keeps the record

    def shutdown(self) -> None:
        for replica in self.replicas:
            replica.shutdown()

    # ---------------------------------------------------------------- utility calls
    def stats(self, fresh: bool = False) -> EngineStats:
        return sum_stats([r.stats(fresh) for r in self.replicas])

    @property
    def balance(self) -> str:
        """Where the next request goes: "score" (V1's), "round_robin" or "prefix"."""
        return self.router.balance

    @balance.setter
    def balance(self, balance: str) -> None:
        self.router.balance = balance

    def replica_stats(self, fresh: bool = False) -> list[EngineStats]:
        """Each replica's snapshot, in replica order (for /metrics and lesson 18)."""
        return [r.stats(fresh) for r in self.replicas]

    def reconfigure(self, vllm_config: VllmConfig):
        infos = [r.reconfigure(vllm_config) for r in self.replicas]
        self.vllm_config, self.info = vllm_config, infos[0]
        self.router.configure(vllm_config)       # its balance too, whatever was set since
        return self.info

    def add_lora(self, lora_request) -> None:
        for replica in self.replicas:
            replica.add_lora(lora_request)

    def list_loras(self) -> set[int]:
        return self.replicas[0].list_loras()

    def reset_prefix_cache(self) -> bool:
        reset = [r.reset_prefix_cache() for r in self.replicas]     # every one, not lazily
        for rank, done in enumerate(reset):
            if done:
                self.router.indexes[rank].hashes.clear()
        return all(reset)

    def prompt_logits(self, token_ids: list[int]):
        return self.replicas[0].prompt_logits(token_ids)

    @contextmanager
    def trace(self):
        """Every replica's StepRecords of the steps inside the block, in the order they began
        (perf_counter is one clock for every process of this machine)."""
        steps: list = []
        with ExitStack() as stack:
            each = [stack.enter_context(r.trace()) for r in self.replicas]
            yield steps
        steps += sorted((s for replica in each for s in replica), key=lambda s: s.start_time)

    def add_schedule_callback(self, callback) -> None:
        for replica in self.replicas:
            replica.add_schedule_callback(callback)

    def remove_schedule_callback(self, callback) -> None:
        for replica in self.replicas:
            replica.remove_schedule_callback(callback)
