"""The tensor-parallel executor: the worker processes, and rank 0's side of them (vLLM twin:
vllm/v1/executor/multiproc_executor.py).

`LLM(tensor_parallel_size=N)` runs rank 0 in the caller's process: a plain ModelRunner over
shard 0, with the scheduler, block manager and sampler beside it as with one process. The
MultiprocExecutor spawns ranks 1..N-1 (torch.multiprocessing), each a plain ModelRunner over
its shard, and hands rank 0's runner itself as `executor`. The seam is one call: before each
thing rank 0's runner runs on every rank (`forward`, `init_kv_cache`, `copy_blocks`), it asks
the executor to `broadcast` it, and the executor sends the same call to every worker's queue
(the step's token ids, positions, slot mapping and block tables: a few KB). Then all ranks run
it and meet in its collectives (parallel_state.py). A worker that dies breaks the next
collective (or is seen dead before the step) and rank 0 raises, saying which; a worker that
hangs makes the collective time out.

vLLM's executor sends the scheduler's output to every worker, and every worker (rank 0's too)
runs the whole step behind an RPC; here rank 0 keeps the step (sampling needs only its logits)
and sends the forward pass's inputs, so the engine and the runner stay as with one process.

Left out, compared with vLLM: pipeline, data and expert parallelism; a shared-memory input
broadcast (here a queue per worker); Ray; the worker's own scheduler-output handling.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import queue
import threading
import time
import traceback
import weakref

import torch
import torch.distributed as dist

from minivllm.attention.metadata import AttentionMetadata
from minivllm.config import EngineConfig, ModelConfig
from minivllm.distributed.layers import weight_bytes
from minivllm.distributed.parallel_state import TensorParallelGroup, check_tensor_parallel
from minivllm.worker.model_runner import ModelRunner

START_TIMEOUT = 600.0      # seconds for workers to start and load their shard


def _step_message(input_ids, positions, md: AttentionMetadata, rows) -> dict:
    """One forward pass's inputs as plain lists (a few KB): what rank 0 sends every worker."""
    return {"input_ids": input_ids.tolist(), "positions": positions.tolist(),
            "slot_mapping": md.slot_mapping.tolist(),
            "query_start_loc": md.query_start_loc.tolist(),
            "seq_lens": md.seq_lens.tolist(), "block_tables": md.block_tables.tolist(),
            "max_query_len": md.max_query_len, "max_seq_len": md.max_seq_len,
            "rows": None if rows is None else rows.tolist()}


def _forward_message(runner: ModelRunner, m: dict) -> None:
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
                    _forward_message(runner, *args)
                else:                                # init_kv_cache, copy_blocks
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


class MultiprocExecutor:
    """Ranks 1..N-1 in processes of their own, and what rank 0 sends them."""

    def __init__(self, model_config: ModelConfig, engine_config: EngineConfig, path,
                 device: torch.device, dtype: torch.dtype):
        n = engine_config.tensor_parallel_size
        check_tensor_parallel(model_config, n)
        if device.type == "cuda" and torch.cuda.device_count() < n:
            raise ValueError(f"tensor_parallel_size={n} needs {n} GPUs; torch sees "
                             f"{torch.cuda.device_count()}")
        self.backend = "nccl" if device.type == "cuda" else "gloo"
        self.store = dist.TCPStore("127.0.0.1", 0, n, True, wait_for_workers=False,
                                   timeout=datetime.timedelta(seconds=START_TIMEOUT))
        # Fork (instant) unless CUDA is in play, a worker gets several CPU threads (a forked
        # child of a process that ran OpenMP hangs in a parallel region), or this process runs
        # other threads (tqdm's monitor, Inductor's compile pool, a server's): a lock one of
        # them held at the fork stays held in the child forever. Then spawn (slower).
        threads = max(1, torch.get_num_threads() // n)
        fork_ok = (device.type == "cpu" and not torch.cuda.is_initialized() and threads == 1
                   and threading.active_count() == 1)
        ctx = torch.multiprocessing.get_context("fork" if fork_ok else "spawn")
        self.results = ctx.Queue()
        self.commands = []
        self.workers = []
        self.failure = None            # why the workers are gone, once they are
        self._listening = False        # the workers run their own first init_kv_cache
        self.rank_weight_bytes: list[dict[str, int]] = []    # each rank's, for lesson 15
        for rank in range(1, n):
            self.commands.append(ctx.Queue())
            self.workers.append(ctx.Process(
                target=_worker_main, name=f"minivllm-tp-rank{rank}", daemon=True,
                args=(rank, n, self.store.port, self.backend, model_config, engine_config, path,
                      device.type, dtype, threads, self.commands[-1], self.results)))
            self.workers[-1].start()
        # The runner holds the executor, not the reverse: dropping the engine stops the workers.
        self._finalizer = weakref.finalize(self, _stop_workers, self.workers, self.commands)

    @classmethod
    def make_runner(cls, model_config: ModelConfig, engine_config: EngineConfig, path,
                    device: torch.device, dtype: torch.dtype, sampler=None) -> ModelRunner:
        """Start ranks 1..N-1, then build rank 0's ModelRunner over shard 0 with this executor
        as its broadcast: the one object the engine talks to, as with one process."""
        executor = cls(model_config, engine_config, path, device, dtype)
        try:
            executor._wait_for("started")
            group = TensorParallelGroup(0, len(executor.workers) + 1, executor.store,
                                        executor.backend)
            runner = ModelRunner(model_config, engine_config, path, device, dtype, tp=group,
                                 executor=executor, sampler=sampler)
            executor.rank_weight_bytes = [weight_bytes(runner.model)] + executor._wait_for("ready")
        except RuntimeError as e:          # say which worker failed, and why, if one did
            executor._explain(e, "tensor-parallel start failed")
        except BaseException:
            executor.shutdown()
            raise
        executor._listening = True
        return runner

    def _wait_for(self, kind: str) -> list:
        got = {}
        deadline = time.monotonic() + START_TIMEOUT
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

    @contextlib.contextmanager
    def broadcast(self, method: str, *args):
        """Rank 0's runner is about to run `method` (forward, init_kv_cache or copy_blocks):
        send it to ranks 1..N-1 first, so that every rank runs it and meets in its collectives.
        If a collective fails inside (a peer died or timed out), say which worker, and stop."""
        if self._listening or self.failure is not None:
            self.check_workers()                   # raises once a worker died or we shut down
            message = (_step_message(*args),) if method == "forward" else args
            for q in self.commands:
                q.put((method, message))
        try:
            yield
        except RuntimeError as e:
            if not self._listening:                # starting (make_runner explains) or stopped
                raise
            self._explain(e, f"tensor-parallel {'step' if method == 'forward' else method} failed")

    def _explain(self, e: RuntimeError, what: str):
        for p in self.workers:
            p.join(timeout=2)              # let a dying worker finish dying, to say which
        try:
            self.check_workers()
        finally:
            self.shutdown()
        raise RuntimeError(f"{what}: {e}") from e

    def shutdown(self) -> None:
        """Stop the workers (also done when the executor is garbage-collected, or at exit)."""
        self._listening = False
        self.failure = self.failure or "this tensor-parallel engine was shut down"
        self._finalizer()
