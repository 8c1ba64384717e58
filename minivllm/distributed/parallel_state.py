"""The tensor-parallel process group and its collectives (vLLM twins:
vllm/distributed/parallel_state.py and vllm/distributed/communication_op.py).

One TensorParallelGroup per process: its rank, the group's size, and the three collectives the
split model needs (all_reduce after a row-parallel layer or the vocab-parallel embedding,
all_gather of the logits, all_reduce_min to agree on the KV pool's size). Over
torch.distributed: gloo on CPU, NCCL on GPUs. Also here: which tp sizes a model's shapes allow,
and which KV heads a rank holds.

Left out, compared with vLLM: the world / pipeline / data / expert groups (one tp group is the
only kind here), custom all-reduce kernels, the shared-memory message queue, and the global
`get_tp_group()` (the group is passed to whoever needs it).
"""

from __future__ import annotations

import datetime

import torch
import torch.distributed as dist

from minivllm.config import HfConfig

COLLECTIVE_TIMEOUT = datetime.timedelta(seconds=60)   # a hung peer fails the step after this


class TensorParallelGroup:
    """This process's rank among the tp ranks, and the collectives the model needs.

    A process-group object of its own, not torch.distributed's default group (one per process,
    set by init_process_group): a process may hold several engines, as tests and lessons do."""

    def __init__(self, rank: int, size: int, store, backend: str):
        self.rank = rank
        self.size = size
        self.device = "cuda" if backend == "nccl" else "cpu"   # where its tensors must live
        if backend == "nccl":
            self.pg = dist.ProcessGroupNCCL(store, rank, size)
        else:
            self.pg = dist.ProcessGroupGloo(store, rank, size, COLLECTIVE_TIMEOUT)
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
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp.MIN
        t = torch.tensor([n], device=self.device)
        self.pg.allreduce([t], opts).wait()
        return int(t.item())


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
