"""Tensor parallelism: one model split across N processes, each holding 1/N of every layer.

Megatron-LM's split (Shoeybi et al. 2019), as vLLM and gpt-fast do it. In each decoder layer:

    q/k/v_proj, gate/up_proj   column-parallel: rank r keeps its slice of the output features
                               (its attention heads, its share of the MLP's intermediate units)
    o_proj, down_proj          row-parallel: rank r keeps the matching input features and
                               computes a partial sum; one all-reduce adds the N partials
    attention                  needs nothing from other ranks: a head only reads its own K/V

so a layer costs two all-reduces of (tokens, hidden). The embedding and lm_head are split over
the vocabulary: each rank embeds the token ids in its range (zeros elsewhere, then an
all-reduce), and computes the logits of its range (then an all-gather). Each rank's KV pool
holds only its KV heads; with fewer KV heads than ranks (GQA), a KV head is replicated on the
tp / kv_heads ranks whose query heads read it.

Processes: `LLM(tensor_parallel_size=N)` runs rank 0 in the caller's process
(TensorParallelRunner, with the scheduler, block manager and sampler) and spawns ranks 1..N-1
(torch.multiprocessing), each a plain ModelRunner over its shard. Every step rank 0 sends the
step's inputs (token ids, positions, slot mapping, block tables: a few KB) to each worker's
queue, then all ranks run the same forward pass and meet in its collectives (torch.distributed:
gloo on CPU, NCCL on GPUs). A worker that dies breaks the next collective (or is seen dead before
the step) and rank 0 raises; a worker that hangs makes the collective time out.

Left out, compared with vLLM: pipeline, data and expert parallelism; fused QKV / gate-up
weights; vocab padding to a multiple of 64; custom all-reduce kernels; a shared-memory input
broadcast (here a queue per worker); Ray; quantized, LoRA or compiled layers under tp > 1.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import queue
import time
import traceback
import weakref
from dataclasses import replace

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from minivllm.attention.layer import Attention

from minivllm.attention.metadata import AttentionMetadata
from minivllm.config import EngineConfig, ModelConfig
from minivllm.worker.model_runner import ModelRunner

COLLECTIVE_TIMEOUT = datetime.timedelta(seconds=60)   # a hung peer fails the step after this
START_TIMEOUT = 600.0      # seconds for workers to start and load their shard


class TensorParallelGroup:
    """This process's rank among the tp ranks, and the collectives the model needs.

    A process-group object of its own, not torch.distributed's default group (one per process,
    set by init_process_group): a process may hold several engines, as tests and lessons do."""

    def __init__(self, rank: int, size: int, store, backend: str):
        self.rank, self.size = rank, size
        self.device = "cuda" if backend == "nccl" else "cpu"   # where its tensors must live
        if backend == "nccl":
            self.pg = dist.ProcessGroupNCCL(store, rank, size)
        else:
            self.pg = dist.ProcessGroupGloo(store, rank, size, COLLECTIVE_TIMEOUT)
        self.num_all_reduce = self.num_all_gather = 0   # counted, for lesson 15

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum x over the ranks, in place: every rank ends with the same tensor."""
        self.num_all_reduce += 1
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


# ------------------------------------------------------------------ the split of one model
def check_tensor_parallel(config: ModelConfig, tp: int) -> None:
    """Refuse a tp size the model's shapes do not allow, naming the sizes that work."""
    nh, nkv, inter = config.num_attention_heads, config.num_key_value_heads, config.intermediate_size
    ok = lambda n: nh % n == 0 and (nkv % n == 0 or n % nkv == 0) and inter % n == 0  # noqa: E731
    if not ok(tp):
        raise ValueError(
            f"tensor_parallel_size={tp} does not split this model: it has {nh} attention heads, "
            f"{nkv} KV heads and {inter} MLP units, and each rank needs a whole share of the "
            f"heads (KV heads split or replicated) and of the units; sizes that work: "
            f"{[n for n in range(1, nh + 1) if ok(n)]}")


def kv_head_range(config: ModelConfig, rank: int, tp: int) -> range:
    """The KV heads rank `rank` holds: its share, or the one its query heads read (kv < tp)."""
    nkv = config.num_key_value_heads
    first = rank * nkv // tp
    return range(first, first + max(1, nkv // tp))


class ColumnParallelLinear(nn.Linear):
    """y[:, rows] = x @ W[rows].T: this rank's output features; no communication."""

    def __init__(self, full: nn.Linear, rows: slice):
        super().__init__(full.in_features, rows.stop - rows.start, bias=full.bias is not None)
        self.rows = rows

    def shard(self, tensor: torch.Tensor) -> torch.Tensor:   # called by load_weights
        return tensor[self.rows]


class RowParallelLinear(nn.Linear):
    """y = sum over ranks of x[:, cols] @ W[:, cols].T: a partial product, then an all-reduce.
    No bias: o_proj and down_proj have none in the Llama family (models/llama.py)."""

    def __init__(self, full: nn.Linear, cols: slice, group: TensorParallelGroup):
        super().__init__(cols.stop - cols.start, full.out_features, bias=False)
        self.cols, self.group = cols, group

    def shard(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor[:, self.cols]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.group.all_reduce(F.linear(x, self.weight))         # (T, out) on every rank


class VocabParallelEmbedding(nn.Module):
    """Rank r holds rows [r * per, (r + 1) * per) of the embedding table (per = vocab / tp,
    rounded up, the last shard zero-padded); a token outside that range embeds to zeros here,
    and the all-reduce brings in the one rank that has it."""

    def __init__(self, vocab_size: int, hidden: int, group: TensorParallelGroup):
        super().__init__()
        self.vocab_size, self.group = vocab_size, group
        self.per_rank = -(-vocab_size // group.size)
        self.start = group.rank * self.per_rank
        self.weight = nn.Parameter(torch.empty(self.per_rank, hidden))

    def shard(self, tensor: torch.Tensor) -> torch.Tensor:
        rows = tensor[self.start:self.start + self.per_rank]
        return torch.cat([rows, rows.new_zeros(self.per_rank - rows.shape[0], *rows.shape[1:])])

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        local = input_ids - self.start                                  # (T,)
        mine = (local >= 0) & (local < self.per_rank)
        x = F.embedding(local.clamp(0, self.per_rank - 1), self.weight) * mine[:, None]
        return self.group.all_reduce(x)                                 # (T, hidden)


class ParallelLMHead(VocabParallelEmbedding):
    """The same vocabulary split, used as a linear layer: each rank computes the logits of its
    range, and an all-gather puts the row back together on every rank."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.group.all_gather(F.linear(hidden, self.weight))  # (S, per_rank * tp)
        return logits[:, :self.vocab_size]


PARALLEL_LAYERS = (ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding)


def parallelize(model: nn.Module, config: ModelConfig, group: TensorParallelGroup) -> ModelConfig:
    """Swap model's layers (on the meta device, before any weight exists) for this rank's
    shards. Returns the config of this rank's attention: its query and KV head counts."""
    r, n, hd = group.rank, group.size, config.head_dim
    nh, inter = config.num_attention_heads // n, config.intermediate_size // n
    kv = kv_head_range(config, r, n)
    q_rows = slice(r * nh * hd, (r + 1) * nh * hd)                   # this rank's query heads
    kv_rows = slice(kv.start * hd, kv.stop * hd)                     # ... and the KV they read
    mlp_rows = slice(r * inter, (r + 1) * inter)
    for layer in model.model.layers:
        a, m = layer.self_attn, layer.mlp
        a.q_proj = ColumnParallelLinear(a.q_proj, q_rows)
        a.k_proj = ColumnParallelLinear(a.k_proj, kv_rows)
        a.v_proj = ColumnParallelLinear(a.v_proj, kv_rows)
        a.o_proj = RowParallelLinear(a.o_proj, q_rows, group)         # all-reduce 1 of 2
        a.nh, a.nkv = nh, len(kv)
        a.attn = Attention(nh, len(kv), hd)
        m.gate_proj = ColumnParallelLinear(m.gate_proj, mlp_rows)
        m.up_proj = ColumnParallelLinear(m.up_proj, mlp_rows)
        m.down_proj = RowParallelLinear(m.down_proj, mlp_rows, group)  # all-reduce 2 of 2
    model.model.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size, group)
    model.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, group)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    return replace(config, num_attention_heads=nh, num_key_value_heads=len(kv))


def weight_bytes(model: nn.Module) -> dict[str, int]:
    """Bytes of this rank's weights: all of them, and those of the split layers."""
    sizes = {id(p): (p.numel() * p.element_size(), isinstance(m, PARALLEL_LAYERS))  # tied: once
             for m in model.modules() for p in m.parameters(recurse=False)}
    return {"total": sum(b for b, _ in sizes.values()),
            "split": sum(b for b, split in sizes.values() if split)}


# ------------------------------------------------------------------ processes
def _step_message(input_ids, positions, md: AttentionMetadata, rows) -> dict:
    """One step's inputs as plain lists (a few KB): what rank 0 sends every worker."""
    return {"input_ids": input_ids.tolist(), "positions": positions.tolist(),
            "slot_mapping": md.slot_mapping.tolist(), "query_start_loc": md.query_start_loc.tolist(),
            "seq_lens": md.seq_lens.tolist(), "block_tables": md.block_tables.tolist(),
            "max_query_len": md.max_query_len, "max_seq_len": md.max_seq_len,
            "rows": None if rows is None else rows.tolist()}


def _execute_message(runner: ModelRunner, m: dict) -> None:
    t = lambda x: torch.tensor(x, dtype=torch.int64, device=runner.device)  # noqa: E731
    md = AttentionMetadata(t(m["slot_mapping"]), t(m["query_start_loc"]), t(m["seq_lens"]),
                           t(m["block_tables"]), m["max_query_len"], m["max_seq_len"],
                           decode_scratch=runner.decode_scratch)
    rows = None if m["rows"] is None else t(m["rows"])
    runner.forward(t(m["input_ids"]), t(m["positions"]), md, rows)


def _worker_main(rank, size, port, backend, model_config, engine_config, path, device_type,
                 dtype, num_threads, commands, results):
    """Rank 1..N-1: load this rank's shard, then run what rank 0 sends until told to stop."""
    try:
        parent = os.getppid()
        torch.set_num_threads(num_threads)
        device = torch.device(device_type, rank) if device_type == "cuda" else torch.device("cpu")
        if device.type == "cuda":
            torch.cuda.set_device(device)
        store = dist.TCPStore("127.0.0.1", port, size, False,
                              timeout=datetime.timedelta(seconds=START_TIMEOUT))
        results.put(("started", rank, None))
        group = TensorParallelGroup(rank, size, store, backend)
        with torch.inference_mode():
            runner = ModelRunner(model_config, engine_config, path, device, dtype, tp=group)
            results.put(("ready", rank, weight_bytes(runner.model)))
            while True:
                try:
                    method, args = commands.get(timeout=1.0)
                except queue.Empty:
                    if os.getppid() != parent:       # rank 0's process is gone: so are we
                        return
                    continue
                if method == "shutdown":
                    return
                if method == "forward":
                    _execute_message(runner, *args)
                elif method == "copy_blocks":        # caches named, not sent
                    pairs, src, dst = args
                    runner.copy_blocks(pairs, getattr(runner, src), getattr(runner, dst))
                else:
                    getattr(runner, method)(*args)
    except BaseException:                            # noqa: BLE001 (report, then die)
        results.put(("error", rank, traceback.format_exc()))
        raise


def _stop_workers(procs, commands) -> None:
    for q in commands:
        with contextlib.suppress(ValueError, OSError):     # a queue already closed
            q.put(("shutdown", ()))
    for p in procs:
        p.join(timeout=5)
        if p.is_alive():
            p.kill()


class TensorParallelRunner(ModelRunner):
    """Rank 0: a ModelRunner over shard 0 that starts ranks 1..N-1 and, before each thing it
    runs on its shard, sends the same thing to every worker."""

    def __init__(self, model_config: ModelConfig, engine_config: EngineConfig, path,
                 device: torch.device, dtype: torch.dtype, sampler=None):
        n = engine_config.tensor_parallel_size
        check_tensor_parallel(model_config, n)
        if device.type == "cuda" and torch.cuda.device_count() < n:
            raise ValueError(f"tensor_parallel_size={n} needs {n} GPUs; torch sees "
                             f"{torch.cuda.device_count()}")
        for name in ("quantization", "enable_lora", "compilation_config",     # not split here
                     "speculative_config", "kv_transfer_config"):
            if getattr(engine_config, name, None):
                raise ValueError(f"{name} with tensor_parallel_size > 1 is not supported by "
                                 f"minivllm; leave {name} unset with tp > 1")
        backend = "nccl" if device.type == "cuda" else "gloo"
        store = dist.TCPStore("127.0.0.1", 0, n, True, wait_for_workers=False,
                              timeout=datetime.timedelta(seconds=START_TIMEOUT))
        # Fork (instant) unless CUDA is in play or a worker gets several CPU threads (a forked
        # child of a process that ran OpenMP hangs in a parallel region); then spawn (slower).
        threads = max(1, torch.get_num_threads() // n)
        fork_ok = device.type == "cpu" and not torch.cuda.is_initialized() and threads == 1
        ctx = torch.multiprocessing.get_context("fork" if fork_ok else "spawn")
        self.results, self.commands, self.workers = ctx.Queue(), [], []
        self._listening, self.failure = False, None
        for rank in range(1, n):
            self.commands.append(ctx.Queue())
            self.workers.append(ctx.Process(
                target=_worker_main, name=f"minivllm-tp-rank{rank}", daemon=True,
                args=(rank, n, store.port, backend, model_config, engine_config, path,
                      device.type, dtype, threads, self.commands[-1], self.results)))
            self.workers[-1].start()
        self._finalizer = weakref.finalize(self, _stop_workers, self.workers, self.commands)
        try:
            self._wait_for("started")
            super().__init__(model_config, engine_config, path, device, dtype,
                             tp=TensorParallelGroup(0, n, store, backend), sampler=sampler)
            self.rank_weight_bytes = [weight_bytes(self.model)] + self._wait_for("ready")
        except RuntimeError as e:          # say which worker failed, and why, if one did
            self._explain(e, "tensor-parallel start failed")
        except BaseException:
            self.shutdown()
            raise
        self._listening = True

    def _wait_for(self, kind: str) -> list:
        got, deadline = {}, time.monotonic() + START_TIMEOUT
        while len(got) < len(self.workers):
            if time.monotonic() > deadline:
                raise RuntimeError(f"tensor-parallel workers not {kind} after "
                                   f"{START_TIMEOUT:.0f} s")
            try:
                what, rank, payload = self.results.get(timeout=0.5)
            except queue.Empty:
                self.check_workers()
                continue
            if what == "error":
                raise RuntimeError(f"tensor-parallel rank {rank} failed:\n{payload}")
            got[rank] = payload
        return [got[r] for r in sorted(got)]

    def check_workers(self) -> None:
        """Raise if a worker has died (once one has, the engine cannot go on)."""
        dead = [p for p in self.workers if not p.is_alive()]
        if self.failure is None and dead:
            reason = ""
            with contextlib.suppress(queue.Empty, OSError, ValueError):
                while True:
                    what, rank, payload = self.results.get_nowait()
                    reason += f"\nrank {rank}: {payload}" if what == "error" else ""
            self.failure = ("tensor-parallel worker(s) died: " + ", ".join(
                f"{p.name} (pid {p.pid}, exit code {p.exitcode})" for p in dead)
                + f"; start a new LLM{reason}")
        if self.failure is not None:
            raise RuntimeError(self.failure)

    def _send(self, method: str, *args) -> None:
        if self._listening or self.failure is not None:
            self.check_workers()                   # raises once a worker died or we shut down
            for q in self.commands:
                q.put((method, args))

    # The ModelRunner methods the engine calls, each sent to the workers first.
    def init_kv_cache(self, engine_config: EngineConfig) -> None:
        if engine_config.compilation_config:       # its graphs would break at every all-reduce
            raise ValueError("compilation_config with tensor_parallel_size > 1 is not "
                             "supported by minivllm; use compilation_config=0")
        if engine_config.tensor_parallel_size == self.tp_size:
            self._send("init_kv_cache", engine_config)
        super().init_kv_cache(engine_config)

    def copy_blocks(self, pairs, src_cache=None, dst_cache=None) -> None:
        if pairs:                                  # the caches by name: each rank has its own
            src, dst = ("cpu_kv_cache" if c is not None and c is self.cpu_kv_cache else "kv_cache"
                        for c in (src_cache, dst_cache))
            self._send("copy_blocks", pairs, src, dst)
        super().copy_blocks(pairs, src_cache, dst_cache)

    def forward(self, input_ids, positions, md, rows):
        self._send("forward", _step_message(input_ids, positions, md, rows))
        try:
            return super().forward(input_ids, positions, md, rows)
        except RuntimeError as e:          # a collective failed: a peer died or timed out
            self._explain(e, "tensor-parallel step failed")

    def _explain(self, e: RuntimeError, what: str):
        for p in self.workers:
            p.join(timeout=2)              # let a dying worker finish dying, to say which
        try:
            self.check_workers()
        finally:
            self.shutdown()
        raise RuntimeError(f"{what}: {e}") from e

    def shutdown(self) -> None:
        """Stop the workers (also done when the runner is garbage-collected, or at exit)."""
        self._listening = False
        self.failure = self.failure or "this tensor-parallel engine was shut down"
        self._finalizer()
