"""SyncMPClient: the front end's end of an EngineCore in its own process (vLLM twin: MPClient and
SyncMPClient in vllm/v1/engine/core_client.py).

    client = SyncMPClient(vllm_config)   # starts core_proc.py, waits for
                                                               # "ready" (weights load there)
    client.add_request(request)        -> "add" over the input socket, returns at once
    client.get_output()                <- the next EngineCoreOutputs the core sent
    client.call_utility("reconfigure", config)   InprocClient.reconfigure, run in the core

Same methods as InprocClient (engine/core_client.py), so LLMEngine does not care which it has.
One thread here reads the output socket as messages come: outputs go to a queue for
get_output, utility answers to the futures their callers wait on, and the stats snapshot
that comes with every batch (as V1's SchedulerStats do) is kept for stats(): no round trip,
safe to read from any thread, at most one message old. A "scheduled" snapshot runs the
schedule callbacks, on that thread.

Why a process: the front end's Python (HTTP, tokenizing, detokenizing, stop strings) and the
core's (scheduling, preparing the batch, sampling) then hold two GILs, not one, and can run on
two cores at once; a request's tokens cross a socket on the way. docs/benchmarks.md measures
what that buys or costs.

No orphans: close() (also on garbage collection and at exit) asks the core to stop, then
terminates and kills it if it does not, and waits for it; a core whose front end died leaves
by itself (core_proc.py). A core that dies is seen within POLL_MS: every waiter gets an
EngineDeadError that says its exit code, or its traceback if it could send one.

Left out, compared with vLLM: AsyncMPClient (asyncio sockets) and the engine-core monitor
thread (the output thread watches the process here). Several cores: dp_client.py.
"""

from __future__ import annotations

import itertools
import logging
import os
import pickle
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field

import zmq

from minivllm.config import VllmConfig
from minivllm.engine.core import EngineCoreInfo, EngineCoreRequest
from minivllm.engine.core_client import EngineCoreClient, EngineDeadError
from minivllm.engine.stats import EngineStats, StepRecord
from minivllm.outputs import EngineCoreOutputs
from minivllm.structured_output.transfer import GrammarsSent

READY_TIMEOUT_S = float(os.environ.get("MINIVLLM_ENGINE_READY_TIMEOUT_S", 600))  # vLLM's, renamed
UTILITY_TIMEOUT_S = 600.0     # a utility call waits for the step in progress, then is answered
POLL_MS = 100                 # how often the output thread looks at the process while idle


@dataclass(eq=False)
class CoreProcess:
    """What a SyncMPClient must release: the process, the sockets, their folder. Held by the
    client's finalizer and its output thread, not by the client, so that the client can be
    garbage collected (which stops the process)."""

    popen: subprocess.Popen
    ctx: zmq.Context
    input_socket: zmq.Socket                   # PUSH to the core; any thread, under send_lock
    output_socket: zmq.Socket                  # PULL from the core; the output thread's alone
    ipc_dir: str
    outputs: queue.Queue = field(default_factory=queue.Queue)   # EngineCoreOutputs | error
    futures: dict[int, Future] = field(default_factory=dict)    # utility calls in flight
    stats: EngineStats | None = None           # the core's last snapshot
    error: EngineDeadError | None = None       # set once the core is gone
    closed: threading.Event = field(default_factory=threading.Event)
    send_lock: threading.Lock = field(default_factory=threading.Lock)
    thread: threading.Thread | None = None     # the output thread, once started
    engine_index: int = 0                      # its replica, behind data parallelism

    def send(self, kind: str, payload) -> None:
        if self.error is not None:
            raise self.error
        with self.send_lock:
            self.input_socket.send(pickle.dumps((kind, payload), pickle.HIGHEST_PROTOCOL))

    def die(self, why: str) -> None:
        """The core is gone: every waiter (get_output, utility calls) hears why."""
        self.error = self.error or EngineDeadError(why)
        self.outputs.put(self.error)
        for future in list(self.futures.values()):
            future.set_exception(self.error)

    def close(self, timeout: float = 10.0) -> None:
        """Ask the core to stop; past `timeout`, kill it. It is waited for: no orphan, no
        zombie."""
        if self.closed.is_set():
            return
        self.closed.set()
        if self.popen.poll() is None:
            try:
                self.send("shutdown", None)
                self.popen.wait(timeout)
            except (EngineDeadError, zmq.ZMQError, subprocess.TimeoutExpired):
                self.popen.kill()
                self.popen.wait()
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join(1.0)                  # it leaves within POLL_MS of `closed`
        remote = isinstance(self.popen, RemoteProcess)   # its "shutdown" must get there
        self.ctx.destroy(linger=2000 if remote else 0)   # both sockets
        shutil.rmtree(self.ipc_dir, ignore_errors=True)
        self.die("the engine was shut down")


def _read_outputs(core: CoreProcess, client_ref: weakref.ref) -> None:
    """The output thread: every message from the core as it comes; a dead process is seen
    within POLL_MS. It holds the client weakly (to run its schedule callbacks)."""
    try:
        _read_messages(core, client_ref)
    except Exception as e:          # noqa: BLE001 -- a waiter must hear it, not hang
        if not core.closed.is_set():
            core.die(f"reading the engine core's messages failed: {e!r}")


def _read_messages(core: CoreProcess, client_ref: weakref.ref) -> None:
    while not core.closed.is_set():
        if not core.output_socket.poll(POLL_MS):
            if core.popen.poll() is not None:
                core.die(f"the engine core process died (exit code {core.popen.returncode})")
                return
            continue
        kind, payload = pickle.loads(core.output_socket.recv())
        if kind == "outputs":           # the stats first: whoever sees a request finish
            core.stats = payload.scheduler_stats          # also sees its blocks free
            payload.engine_index = core.engine_index
            core.outputs.put(payload)
        elif kind in ("stats", "scheduled"):
            core.stats = payload
            client = client_ref() if kind == "scheduled" else None
            for callback in client.schedule_callbacks if client is not None else ():
                callback()
            del client                  # a strong reference only while the callbacks run
        elif kind == "utility":
            call_id, ok, value = payload
            future = core.futures.pop(call_id, None)      # None: its caller gave up
            if future is not None and ok:
                future.set_result(value)
            elif future is not None:
                future.set_exception(value)
        elif kind == "failed":
            core.die(f"the engine core process failed:\n{payload}")
            return


class RemoteProcess:
    """A core on another host (a headless replica), as this host sees it: its pid there, from
    its hello. No heartbeat: one that dies is not seen until a reply is late."""

    returncode = None

    def __init__(self, pid: int):
        self.pid = pid

    def poll(self):
        return None

    def wait(self, timeout=None) -> int:
        return 0

    def kill(self) -> None:
        pass


def _wait_hello(output_socket: zmq.Socket, address: str, timeout: float) -> int:
    """A headless core's first message, with its pid there."""
    if not output_socket.poll(int(timeout * 1000)):
        raise TimeoutError(f"no headless engine core connected to {address} in {timeout:.0f} s: "
                           "start it there with `minivllm serve --headless "
                           "--data-parallel-address HOST --data-parallel-start-rank R`")
    kind, pid = pickle.loads(output_socket.recv())
    if kind != "hello":
        raise RuntimeError(f"expected a headless core's hello at {address}, got {kind!r}")
    return pid


class SyncMPClient(EngineCoreClient):
    def __init__(self, vllm_config: VllmConfig, ready_timeout: float = READY_TIMEOUT_S,
                 outputs: queue.Queue | None = None, env: dict[str, str] | None = None,
                 address: str | None = None, engine_index: int = 0):
        """Start the core's process and wait until it has built its EngineCore. It gets plain
        arguments (the config, which names the checkpoint), never a torch model. outputs:
        where its outputs go (data parallelism: one queue for every replica); env: more
        environment for its process (a replica's GPUs); address: HOST:PORT, where a headless
        core on another host connects instead (this side binds PORT and PORT + 1);
        engine_index: its replica's rank, which its outputs carry."""
        self.vllm_config = vllm_config
        self.schedule_callbacks: list[Callable[[], None]] = []
        self._call_ids = itertools.count()
        self.grammars_sent = GrammarsSent()
        ctx = zmq.Context()
        output_socket = ctx.socket(zmq.PULL)
        input_socket = ctx.socket(zmq.PUSH)
        input_socket.setsockopt(zmq.SNDHWM, 0)   # never block the front end
        if address is None:
            ipc_dir = tempfile.mkdtemp(prefix="minivllm-")  # mode 0700: this user's alone
            output_socket.bind(f"ipc://{ipc_dir}/output")
            input_socket.connect(f"ipc://{ipc_dir}/input")   # messages queue until it binds
            popen = subprocess.Popen(
                [sys.executable, "-m", "minivllm.engine.multiproc.core_proc", ipc_dir,
                 str(os.getpid())], env={**os.environ, **(env or {})})
        else:
            ipc_dir, (host, port) = "", address.rsplit(":", 1)
            output_socket.bind(f"tcp://{host}:{int(port) + 1}")
            input_socket.bind(f"tcp://{host}:{port}")
            popen = RemoteProcess(_wait_hello(output_socket, address, ready_timeout))
        self.process = CoreProcess(popen, ctx, input_socket, output_socket, ipc_dir,
                                   outputs if outputs is not None else queue.Queue(),
                                   engine_index=engine_index)
        self._finalizer = weakref.finalize(self, self.process.close)   # and at interpreter exit
        try:
            self.process.send("start", dict(
                vllm_config=vllm_config,
                log_level=logging.getLogger("minivllm").getEffectiveLevel()))
            self.info, self.process.stats = self._wait_ready(ready_timeout)
        except BaseException:
            self._finalizer()
            raise
        self.process.thread = threading.Thread(
            target=_read_outputs, args=(self.process, weakref.ref(self)),
            name="minivllm-core-output", daemon=True)
        self.process.thread.start()

    def _wait_ready(self, timeout: float) -> tuple[EngineCoreInfo, EngineStats]:
        """The startup handshake: "ready" with the core's EngineCoreInfo and first stats, or
        why they are not coming."""
        core = self.process
        deadline = time.monotonic() + timeout
        while not core.output_socket.poll(POLL_MS):
            if core.popen.poll() is not None:
                raise RuntimeError(f"the engine core process exited with code "
                                   f"{core.popen.returncode} while starting (its own output, "
                                   "above, says why)")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the engine core process was not ready after {timeout:.0f} "
                                   "s (loading the weights?); set "
                                   "MINIVLLM_ENGINE_READY_TIMEOUT_S to wait longer")
        kind, payload = pickle.loads(core.output_socket.recv())
        if kind != "ready":
            code = core.popen.wait(30)
            raise RuntimeError(f"the engine core process failed to start (exit code {code}); "
                               f"its traceback:\n{payload}")
        return payload

    @property
    def pid(self) -> int:
        """The core process's id."""
        return self.process.popen.pid

    # ---------------------------------------------------------------- requests in, outputs out
    def add_request(self, request: EngineCoreRequest) -> None:
        if request.grammar is not None:     # a CompiledGrammar does not pickle; its JSON does
            request = self.grammars_sent.prepare(request)
        self.process.send("add", request)

    def get_output(self, timeout: float = 1.0) -> EngineCoreOutputs:
        """The outputs of the core's next step; empty ones if none came within `timeout`
        seconds or wake() was called (a step may take longer: the caller asks again)."""
        try:
            item = self.process.outputs.get(timeout=timeout)
        except queue.Empty:
            item = None
        if isinstance(item, EngineDeadError):
            self.process.outputs.put(item)             # for the next caller too
            raise item
        return EngineCoreOutputs(timestamp=time.perf_counter()) if item is None else item

    def wake(self) -> None:
        """get_output returns now (AsyncLLMEngine: a request came in, add it at once)."""
        self.process.outputs.put(None)

    def abort_requests(self, request_ids, errors: dict[str, str] | None = None) -> list:
        """Aborted in the core before its next step; the front end has forgotten them
        already, so nothing comes back."""
        if self.process.error is None:
            self.process.send("abort", (list(request_ids), errors))
        return []

    def finish_stopped(self, request_ids: list[str]) -> None:
        self.process.send("finish", request_ids)

    def has_unfinished_requests(self) -> bool:
        """False: the front end's OutputProcessor is the record of what is in flight (the
        core's own is a message behind it)."""
        return False

    def shutdown(self) -> None:
        self._finalizer()

    # ---------------------------------------------------------------- utility calls
    def call_utility(self, method: str, *args, timeout: float = UTILITY_TIMEOUT_S):
        """InprocClient.<method>(*args), run in the core's process between two steps."""
        call_id = next(self._call_ids)
        future: Future = Future()
        self.process.futures[call_id] = future
        try:
            self.process.send("utility", (call_id, method, args))
            return future.result(timeout)
        finally:
            self.process.futures.pop(call_id, None)

    def stats(self, fresh: bool = False) -> EngineStats:
        """The snapshot the core sent last (with its last outputs, or as it went idle); with
        fresh=True, its answer now: a round trip, after every message sent before."""
        return self.call_utility("stats") if fresh else self.process.stats

    def reconfigure(self, vllm_config: VllmConfig) -> EngineCoreInfo:
        self.info = self.call_utility("reconfigure", vllm_config)
        self.vllm_config = vllm_config
        return self.info

    def add_lora(self, lora_request) -> None:
        self.call_utility("add_lora", lora_request)

    def list_loras(self) -> set[int]:
        return self.call_utility("list_loras")

    def reset_prefix_cache(self) -> bool:
        return self.call_utility("reset_prefix_cache")

    def prompt_logits(self, token_ids: list[int]):
        return self.call_utility("prompt_logits", list(token_ids))

    @contextmanager
    def trace(self):
        """The core's StepRecords of the steps run inside the block; they cross when the
        block ends (the list is filled then, not step by step)."""
        trace_id = self.call_utility("start_trace")
        steps: list[StepRecord] = []
        try:
            yield steps
        finally:
            if self.process.error is None:
                steps += self.call_utility("stop_trace", trace_id)

    def add_schedule_callback(self, callback: Callable[[], None]) -> None:
        """callback() runs on the output thread when the core says a step was scheduled."""
        self.schedule_callbacks.append(callback)

    def remove_schedule_callback(self, callback: Callable[[], None]) -> None:
        self.schedule_callbacks.remove(callback)
