"""The process groups and their collectives (vLLM twins: vllm/distributed/parallel_state.py
and vllm/distributed/communication_op.py).

Ranks are numbered as vLLM numbers them: with tp ranks a stage and pp stages, rank r is tensor
rank r % tp of pipeline stage r // tp. Each process holds

    TensorParallelGroup      the tp ranks of its stage: all_reduce after a row-parallel layer or
                             the vocab-parallel embedding, all_gather of the logits,
                             all_reduce_min to agree on the KV pool's size
    PipelineParallelGroup    every rank (the world), when pp > 1: a stage's hidden states sent
                             to the same tensor rank of the next stage, and all_reduce_min over
                             every stage's pool

over torch.distributed: gloo on CPU, NCCL on GPUs. Also here: which tp sizes a model's shapes
allow, and which KV heads a rank holds.

Left out, compared with vLLM: the data and expert groups, custom all-reduce kernels, the
shared-memory message queue, and the global `get_tp_group()` / `get_pp_group()` (the groups
are passed to whoever needs them).
"""

from __future__ import annotations

import datetime
import time

import torch
import torch.distributed as dist

from minivllm.config import HfConfig

COLLECTIVE_TIMEOUT = datetime.timedelta(seconds=60)   # a hung peer fails the step after this


class TensorParallelGroup:
    """This process's rank among its stage's tp ranks, and the collectives the model needs."""

    def __init__(self, rank: int, size: int, store, backend: str):
        self.rank = rank
        self.size = size
        self.device = "cuda" if backend == "nccl" else "cpu"   # where its tensors must live
        self.pg = process_group(store, rank, size, backend)
        self.num_all_reduce = 0     # counted, for lesson 15
        self.all_reduce_bytes = 0   # bytes of the tensors summed (each rank's own copy)
        self.num_all_gather = 0

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum x over the ranks, in place: every rank ends with the same tensor."""
        self.num_all_reduce += 1
        self.all_reduce_bytes += x.numel() * x.element_size()
        self.pg.allreduce([x]).wait()
        return x

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        """Concatenate every rank's x along the last dimension, in rank order."""
        self.num_all_gather += 1
        parts = [torch.empty_like(x) for _ in range(self.size)]
        self.pg.allgather([parts], [x.contiguous()]).wait()
        return torch.cat(parts, dim=-1)

    def all_reduce_min(self, n: int) -> int:
        return all_reduce_min(self.pg, n, self.device)


class PipelineParallelGroup:
    """This process's place in the pipeline: its stage, and point-to-point sends of the hidden
    states between a stage and the next (the same tensor rank in each)."""

    def __init__(self, rank: int, tp_size: int, pp_size: int, store, backend: str):
        self.rank = rank                    # in the world of tp x pp ranks
        self.tp_size = tp_size
        self.size = pp_size                 # stages
        self.stage = rank // tp_size        # vLLM: get_pp_group().rank_in_group
        self.is_first = self.stage == 0
        self.is_last = self.stage == pp_size - 1
        self.device = "cuda" if backend == "nccl" else "cpu"
        self.pg = process_group(store, rank, tp_size * pp_size, backend)
        self.num_sends = self.send_bytes = 0     # counted, for lesson 18 and bench parallel
        self.num_recvs = self.recv_bytes = 0     # (the driver, the last stage, only receives)
        self.recv_wait_seconds = 0.0             # idle: waiting for the previous stage

    def send(self, x: torch.Tensor) -> None:
        """To the same tensor rank of the next stage."""
        self.num_sends += 1
        self.send_bytes += x.numel() * x.element_size()
        self.pg.send([x.contiguous()], self.rank + self.tp_size, 0).wait()

    def recv(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """From the same tensor rank of the previous stage (the receiver knows the shape: every
        rank prepared the same step)."""
        x = torch.empty(shape, dtype=dtype, device=self.device)
        t0 = time.perf_counter()
        self.pg.recv([x], self.rank - self.tp_size, 0).wait()
        self.recv_wait_seconds += time.perf_counter() - t0
        self.num_recvs += 1
        self.recv_bytes += x.numel() * x.element_size()
        return x

    def all_reduce_min(self, n: int) -> int:
        return all_reduce_min(self.pg, n, self.device)


def process_group(store, rank: int, size: int, backend: str):
    """A process group of its own, not torch.distributed's default one (one per process, set by
    init_process_group): a process may hold several engines, as tests and lessons do."""
    if backend == "nccl":
        return dist.ProcessGroupNCCL(store, rank, size)
    return dist.ProcessGroupGloo(store, rank, size, COLLECTIVE_TIMEOUT)


def all_reduce_min(pg, n: int, device: str) -> int:
    opts = dist.AllreduceOptions()
    opts.reduceOp = dist.ReduceOp.MIN
    t = torch.tensor([n], device=device)
    pg.allreduce([t], opts).wait()
    return int(t.item())


def init_groups(rank: int, tp: int, pp: int, store, backend: str):
    """This rank's groups, (tensor, pipeline): a TensorParallelGroup over its stage's tp ranks
    (None when tp = 1) and the PipelineParallelGroup (None when pp = 1). Every rank makes
    them in the same order: each is a rendezvous on the store."""
    stage = rank // tp
    tp_group = (TensorParallelGroup(rank % tp, tp, dist.PrefixStore(f"tp{stage}/", store),
                                    backend) if tp > 1 else None)
    pp_group = (PipelineParallelGroup(rank, tp, pp, dist.PrefixStore("pp/", store), backend)
                if pp > 1 else None)
    return tp_group, pp_group


def check_tensor_parallel(config: HfConfig, tp: int) -> None:
    """Refuse a tp size the model's shapes do not allow, naming the sizes that work. (Which
    engine options combine with tp > 1 is VllmConfig's table; this needs the model.)"""
    nh = config.num_attention_heads
    nkv = config.num_key_value_heads
    inter = config.intermediate_size
    ok = lambda n: nh % n == 0 and (nkv % n == 0 or n % nkv == 0) and inter % n == 0  # noqa: E731
    if not ok(tp):
        raise ValueError(
            f"tensor_parallel_size={tp} does not split this model: it has {nh} attention heads, "
            f"{nkv} KV heads and {inter} MLP units, and each rank needs a whole share of the "
            f"heads (KV heads split or replicated) and of the units; sizes that work: "
            f"{[n for n in range(1, nh + 1) if ok(n)]}")


def kv_head_range(config: HfConfig, rank: int, tp: int) -> range:
    """The KV heads rank `rank` holds: its share, or the one its query heads read (kv < tp)."""
    nkv = config.num_key_value_heads
    first = rank * nkv // tp
    return range(first, first + max(1, nkv // tp))
