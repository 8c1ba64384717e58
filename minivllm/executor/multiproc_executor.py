"""MultiprocExecutor: tensor and pipeline parallelism, a Worker per rank (vLLM twin:
vllm/v1/executor/multiproc_executor.py).

`LLM(tensor_parallel_size=tp, pipeline_parallel_size=pp)` gets this executor, with tp x pp
ranks numbered as vLLM does (parallel_state.py). One of them, the driver, runs in the engine
core's process: vLLM's output rank, tensor rank 0 of the last stage (rank 0 when pp = 1), the
one that samples. It spawns the others (torch.multiprocessing), each a Worker over its shard of
its stage's weights. Every rank runs the same code on the same messages: `collective_rpc(method,
*args)` puts the call on every worker's queue (a step's SchedulerOutput is a few KB of ints:
token ids, block tables, counts), then runs it on the driver, and the ranks meet in the
forward's collectives and the stages' sends. The scheduler lives in the core only; every rank
keeps its own state of each sample from the messages. A worker that dies breaks the next
collective (or is seen dead before the step) and the driver raises, saying which; a worker
that hangs makes the collective time out.

Pipelined steps: `execute_model(so, non_block=True)` puts the step on the workers' queues and
returns at once, so the first stage starts on it while the driver, the last stage, is still
finishing an earlier step; the step's output comes from `.result()`, which runs the driver's
part. The core keeps up to `max_concurrent_batches` (pp) such steps in flight.

Several hosts (nnodes > 1): every rank meets at master_addr:master_port; this host (node 0)
runs the last n / nnodes ranks, the driver's among them, and node k runs its block of ranks
under `minivllm serve --headless --nnodes N --node-rank k` (run_node), whose launcher takes
the driver's commands over ZMQ (RemoteNode here: a queue with a socket behind it) and hands
them to its own workers' queues; the hidden states and collectives go over gloo (NCCL), on
the interface GLOO_SOCKET_IFNAME names.

Left out, compared with vLLM: the driver in a process of its own too (vLLM's output rank is a
worker process like the others; here it shares the core's process, which saves a copy of the
step's output), data and expert parallelism, and the shared-memory message queue (here a
multiprocessing queue per worker).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import pickle
import queue
import threading
import time
import traceback
import weakref

import torch
import torch.distributed as dist
import zmq

from minivllm.config import VllmConfig
from minivllm.distributed.layers import weight_bytes
from minivllm.distributed.parallel_state import check_tensor_parallel, init_groups
from minivllm.distributed.pipeline import check_pipeline_parallel
from minivllm.executor.abstract import Executor
from minivllm.worker.worker import Worker

START_TIMEOUT = 600.0      # seconds for workers to start and load their shard


def _worker_main(rank, local_rank, tp, pp, host, port, backend, vllm_config, num_threads,
                 commands, results):
    """A rank but the driver: load this rank's shard, then run what the driver sends until told
    to stop. local_rank: its GPU on its host."""
    try:
        parent = os.getppid()
        torch.set_num_threads(num_threads)
        device_type = vllm_config.model_config.device.type
        device = (torch.device(device_type, local_rank) if device_type == "cuda"
                  else torch.device("cpu"))
        if device.type == "cuda":
            torch.cuda.set_device(device)
        store = dist.TCPStore(host, port, tp * pp, False,
                              timeout=datetime.timedelta(seconds=START_TIMEOUT))
        results.put(("started", rank, None))
        tp_group, pp_group = init_groups(rank, tp, pp, store, backend)
        with torch.inference_mode():
            worker = Worker(vllm_config, device=device, tp=tp_group, pp=pp_group)
            worker.load_model()
            results.put(("ready", rank, weight_bytes(worker.model_runner.model)))
            while True:
                try:
                    method, args = commands.get(timeout=1.0)
                except queue.Empty:
                    if os.getppid() != parent:       # the driver's process is gone: so are we
                        return
                    continue
                if method == "shutdown":
                    return
                getattr(worker, method)(*args)
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
    for q in commands:
        if isinstance(q, RemoteNode):
            q.close()


class RemoteNode:
    """Node k's ranks as the driver sees them: a command queue over ZMQ to the launcher there
    (`minivllm serve --headless --nnodes N --node-rank k`, run_node below), which hands every
    command to its workers and sends their reports back into the executor's results queue."""

    def __init__(self, host: str, port: int, k: int, start: dict, results):
        self.ctx = zmq.Context()
        self.commands = self.ctx.socket(zmq.PUSH)
        self.commands.setsockopt(zmq.SNDHWM, 0)
        self.commands.bind(f"tcp://{host}:{port + 2 * k - 1}")
        self.reports = self.ctx.socket(zmq.PULL)
        self.reports.bind(f"tcp://{host}:{port + 2 * k}")
        self.closed = threading.Event()
        if not self.reports.poll(int(START_TIMEOUT * 1000)):     # its hello
            self.close()
            raise RuntimeError(f"node {k} did not connect to {host}:{port + 2 * k} in "
                               f"{START_TIMEOUT:.0f} s: start it with `minivllm serve "
                               f"--headless --nnodes N --node-rank {k} --master-addr {host}`")
        self.reports.recv()
        self.put(("start", start))
        self.thread = threading.Thread(target=self._forward, args=(results,), daemon=True,
                                       name=f"minivllm-node{k}-reports")
        self.thread.start()

    def put(self, item) -> None:
        self.commands.send(pickle.dumps(item, pickle.HIGHEST_PROTOCOL))

    def _forward(self, results) -> None:
        while not self.closed.is_set():
            if self.reports.poll(500):
                results.put(pickle.loads(self.reports.recv()))

    def close(self) -> None:
        self.closed.set()
        if getattr(self, "thread", None) is not None:
            self.thread.join(1.0)                # it leaves within one poll
        self.ctx.destroy(linger=2000)            # the shutdown must get there


def run_node(master_addr: str, master_port: int, node_rank: int) -> int:
    """`minivllm serve --headless --nnodes N --node-rank k`: node k's ranks of a replica whose
    engine runs on node 0. Connect, take the configuration, start a worker per rank, then hand
    on commands and reports until the workers stop."""
    ctx = zmq.Context()
    commands = ctx.socket(zmq.PULL)
    commands.connect(f"tcp://{master_addr}:{master_port + 2 * node_rank - 1}")
    reports = ctx.socket(zmq.PUSH)
    reports.setsockopt(zmq.SNDHWM, 0)
    reports.connect(f"tcp://{master_addr}:{master_port + 2 * node_rank}")
    reports.send(pickle.dumps(("hello", node_rank, None)))
    print(f"minivllm: node {node_rank} waiting for node 0 at {master_addr}", flush=True)
    _, start = pickle.loads(commands.recv())
    mp = torch.multiprocessing.get_context("spawn")
    results, queues, procs = mp.Queue(), [], []
    threads = max(1, torch.get_num_threads() // len(start["ranks"]))
    for rank in start["ranks"]:
        queues.append(mp.Queue())
        procs.append(mp.Process(target=_worker_main, name=f"minivllm-rank{rank}", args=(
            rank, rank % len(start["ranks"]), start["tp"], start["pp"], start["host"],
            start["port"], start["backend"], start["vllm_config"], threads, queues[-1],
            results)))
        procs[-1].start()

    def hand_on_commands():
        while any(p.is_alive() for p in procs):
            if commands.poll(500):
                item = pickle.loads(commands.recv())
                for q in queues:
                    q.put(item)
    handing_on = threading.Thread(target=hand_on_commands, daemon=True)
    handing_on.start()
    while any(p.is_alive() for p in procs):
        with contextlib.suppress(queue.Empty):
            reports.send(pickle.dumps(results.get(timeout=0.5)))
    handing_on.join(1.0)                          # it leaves within one poll
    ctx.destroy(linger=2000)
    return max(p.exitcode or 0 for p in procs)


class PendingStep:
    """A step the workers have started; result() finishes it on the driver, once."""

    def __init__(self, finish):
        self._finish = finish

    def result(self):
        return self._finish()


class MultiprocExecutor(Executor):
    """Every rank but the driver in a process of its own; the driver's Worker here."""

    def __init__(self, vllm_config: VllmConfig, sampler=None):
        parallel = vllm_config.parallel_config
        tp, pp, n = (parallel.tensor_parallel_size, parallel.pipeline_parallel_size,
                     parallel.world_size)
        self.driver_rank = n - tp                # vLLM's output rank
        self.max_concurrent_batches = pp         # steps in flight: one per stage
        device = vllm_config.model_config.device
        check_tensor_parallel(vllm_config.model_config.hf_config, tp)
        check_pipeline_parallel(vllm_config.model_config.hf_config, pp)
        per_node = n // parallel.nnodes
        if device.type == "cuda" and torch.cuda.device_count() < per_node:
            raise ValueError(f"tensor_parallel_size x pipeline_parallel_size = {n} over "
                             f"{parallel.nnodes} node(s) needs {per_node} GPUs here; torch "
                             f"sees {torch.cuda.device_count()}")
        self.backend = "nccl" if device.type == "cuda" else "gloo"
        # Several hosts: this one (node 0) runs the last n / nnodes ranks, the driver's among
        # them; node k the k-th block from the start. All meet at master_addr:master_port.
        nnodes = parallel.nnodes
        host, port = ((parallel.master_addr, parallel.master_port) if nnodes > 1
                      else ("127.0.0.1", 0))
        self.store = dist.TCPStore(host, port, n, True, wait_for_workers=False,
                                   timeout=datetime.timedelta(seconds=START_TIMEOUT))
        self.num_workers = n - 1
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
        self.rank_weight_bytes: list[dict[str, int]] = []    # each rank's, for lesson 15
        for rank in range(n - per_node, n):
            if rank == self.driver_rank:
                continue
            self.commands.append(ctx.Queue())
            self.workers.append(ctx.Process(
                target=_worker_main, name=f"minivllm-rank{rank}", daemon=True,
                args=(rank, rank % per_node, tp, pp, host, self.store.port, self.backend,
                      vllm_config, threads, self.commands[-1], self.results)))
            self.workers[-1].start()
        # Dropping the executor (with its engine) stops the workers.
        self._finalizer = weakref.finalize(self, _stop_workers, self.workers, self.commands)
        try:
            start = dict(tp=tp, pp=pp, host=host, port=self.store.port, backend=self.backend,
                         vllm_config=vllm_config)
            for k in range(1, nnodes):           # each waits for its node to connect
                ranks = list(range((k - 1) * per_node, k * per_node))
                self.commands.append(RemoteNode(host, port, k, dict(start, ranks=ranks),
                                                self.results))
            self._wait_for("started")
            tp_group, pp_group = init_groups(self.driver_rank, tp, pp, self.store, self.backend)
            self.driver_worker = Worker(
                vllm_config, tp=tp_group, sampler=sampler, pp=pp_group,
                device=(torch.device("cuda", self.driver_rank % per_node)
                        if device.type == "cuda" else None))
            self.driver_worker.load_model()
            self.rank_weight_bytes = self._wait_for("ready")
            self.rank_weight_bytes.insert(self.driver_rank,
                                          weight_bytes(self.driver_worker.model_runner.model))
            self.initialize_cache(vllm_config)
        except RuntimeError as e:          # say which worker failed, and why, if one did
            self._explain(e, "parallel start failed")
        except BaseException:
            self.shutdown()
            raise

    def _wait_for(self, kind: str) -> list:
        got = {}
        deadline = time.monotonic() + START_TIMEOUT
        while len(got) < self.num_workers:
            if time.monotonic() > deadline:
                raise RuntimeError(f"parallel workers not {kind} after "
                                   f"{START_TIMEOUT:.0f} s")
            try:
                what, rank, payload = self.results.get(timeout=0.5)
            except queue.Empty:
                self.check_workers()
                continue
            if what == "error":
                raise RuntimeError(f"parallel rank {rank} failed:\n{payload}")
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
            self.failure = ("parallel worker(s) died: " + ", ".join(
                f"{p.name} (pid {p.pid}, exit code {p.exitcode})" for p in dead)
                + f"; start a new LLM{reason}")
        if self.failure is not None:
            raise RuntimeError(self.failure)

    def collective_rpc(self, method: str, *args):
        """Worker.method(*args) on every rank: put on the workers' queues (a step's
        SchedulerOutput as its messages alone), then run on the driver; its result. If a
        collective fails inside (a peer died or timed out), say which worker, and stop."""
        self._send(method, args)
        return self._on_driver(method, args)

    def execute_model(self, scheduler_output, non_block: bool = False):
        """One step; non_block: the workers start it now, and the returned PendingStep's
        result() runs the driver's part (pipeline parallelism's steps in flight)."""
        if not non_block:
            return self.collective_rpc("execute_model", scheduler_output)
        self._send("execute_model", (scheduler_output,))
        return PendingStep(lambda: self._on_driver("execute_model", (scheduler_output,)))

    def _send(self, method: str, args: tuple) -> None:
        self.check_workers()                   # raises once a worker died or we shut down
        sent = (args[0].for_workers(),) if method == "execute_model" else args
        for q in self.commands:
            q.put((method, sent))

    def _on_driver(self, method: str, args: tuple):
        try:
            return getattr(self.driver_worker, method)(*args)
        except RuntimeError as e:
            what = "step" if method == "execute_model" else method
            self._explain(e, f"parallel {what} failed")

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
        self.failure = self.failure or "this parallel engine was shut down"
        self._finalizer()
