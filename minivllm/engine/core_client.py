"""How a front end talks to its EngineCore (vLLM twin: vllm/v1/engine/core_client.py).

    InprocClient    the core in the same process, called directly: get_output() is one
                    EngineCore.step(). LLM and LLMEngine use it by default, so a lesson can step
                    the core and look inside it (client.engine_core.scheduler, ...).
    SyncMPClient    the core in a process of its own (EngineCoreProc, engine/core_proc.py),
                    stepping in a busy loop whenever it has work; requests go in over one ZMQ
                    socket, EngineCoreOutputs come back over another. `minivllm serve` uses it.

Both have the same methods, and every message is plain data: EngineCoreRequest in,
EngineCoreOutputs out, request ids to abort or finish. What the front end asks of the core
besides (stats, reconfigure, LoRA adapters, prompt logits for scoring, traces) is a method of
InprocClient; SyncMPClient sends the method's name and arguments as a utility call (vLLM's
`call_utility`), which the core's process answers by calling that very InprocClient method.

Why a process: the front end's Python (HTTP, tokenizing, detokenizing, stop strings) and the
core's (scheduling, preparing the batch, sampling) then hold two GILs, not one, and run on two
cores at once; a request's tokens cross a socket twice. docs/benchmarks.md measures both sides.

The stats cross with the outputs, as V1's SchedulerStats do: the core sends a snapshot after
each step (with its outputs), after applying messages when it has nothing left to run, and
as each step is scheduled ("scheduled": the schedule callbacks run then, in this process, on
the thread that reads the socket). stats() is the last snapshot: no round trip, safe from any
thread, at most one message old.

Left out, compared with vLLM: AsyncMPClient (AsyncLLMEngine drives the sync client from its
engine thread), the data-parallel clients that balance several cores, msgpack (see
core_proc.py for why pickle), and zero-copy tensor frames.
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

from minivllm.config import EngineConfig
from minivllm.core.sequence import SequenceStatus
from minivllm.engine.core import EngineCore, EngineCoreRequest
from minivllm.engine.stats import EngineStats, StepRecord
from minivllm.outputs import EngineCoreOutput, EngineCoreOutputs

READY_TIMEOUT_S = float(os.environ.get("MINIVLLM_ENGINE_READY_TIMEOUT_S", 600))  # vLLM's, renamed
UTILITY_TIMEOUT_S = 600.0     # a utility call waits for the step in progress, then is answered
POLL_MS = 100                 # how often the output thread looks at the process while idle


class EngineDeadError(RuntimeError):
    """The engine has stopped (its core process died, or its loop did); nothing more is
    served (vLLM twin: vllm/v1/engine/exceptions.py)."""


@dataclass(slots=True)
class EngineCoreInfo:
    """What the front end knows of its core without reaching into it: the KV pool's size (to
    refuse a request that could never fit), the end-of-sequence tokens, and the repr's facts."""

    num_blocks: int
    block_size: int
    kv_layout: str
    attention_backend: str
    eos_token_ids: set[int] = field(default_factory=set)


class InprocClient:
    def __init__(self, engine_core: EngineCore):
        self.engine_core = engine_core
        self._traces: dict[int, tuple] = {}       # start_trace's id -> (context, its steps)
        self._trace_ids = itertools.count()

    # ---------------------------------------------------------------- requests in, outputs out
    def add_request(self, request: EngineCoreRequest) -> None:
        self.engine_core.add_request(request)

    def get_output(self) -> EngineCoreOutputs:
        return self.engine_core.step()

    def abort_requests(self, request_ids, errors: dict[str, str] | None = None
                       ) -> list[EngineCoreOutput]:
        return self.engine_core.abort_requests(request_ids, errors)

    def finish_stopped(self, samples: list[tuple[str, int]]) -> None:
        """These samples' text reached a stop string: they finish with finish_reason "stop"."""
        for request_id, index in samples:
            self.engine_core.finish_requests([request_id], SequenceStatus.FINISHED_STOPPED,
                                             index)

    def has_unfinished_requests(self) -> bool:
        return self.engine_core.has_unfinished_requests()

    def wake(self) -> None:
        """Nothing waits here: get_output is a step, run on the caller's thread."""

    def shutdown(self) -> None:
        """Nothing to stop: the core lives and goes with this process."""

    # ---------------------------------------------------------------- utility calls
    @property
    def config(self) -> EngineConfig:
        return self.engine_core.config

    @property
    def info(self) -> EngineCoreInfo:
        core = self.engine_core
        return EngineCoreInfo(core.block_manager.num_blocks, core.block_manager.block_size,
                              core.runner.kv_layout, core.runner.attention_backend,
                              set(core.eos_token_ids))

    def stats(self, fresh: bool = True) -> EngineStats:
        """The core's stats now (in its process: always fresh)."""
        return self.engine_core.stats()

    def reconfigure(self, config: EngineConfig) -> EngineCoreInfo:
        """A fresh KV pool, block manager and scheduler for `config` over the same weights; the
        old ones back if the new ones cannot be built."""
        core = self.engine_core
        old = core.config
        try:
            core.runner.init_kv_cache(config)
            core.init_state(config)
        except Exception:                # e.g. a draft model that cannot serve: as before
            core.runner.init_kv_cache(old)
            core.init_state(old)
            raise
        return self.info

    def add_lora(self, lora_request) -> None:
        """Load the adapter now (it fails alone, before its request is queued)."""
        manager = self.engine_core.runner.lora_manager
        if manager is None:
            raise ValueError(f"{lora_request} was given, but LoRA is off: start the engine "
                             "with enable_lora=True (and max_loras, max_lora_rank)")
        manager.add_lora(lora_request)

    def list_loras(self) -> set[int]:
        manager = self.engine_core.runner.lora_manager
        return set(manager.slots) if manager else set()

    def prompt_logits(self, token_ids: list[int]):
        return self.engine_core.prompt_logits(token_ids)

    def trace(self):
        """`with client.trace() as steps`: the core's StepRecords, appended as steps run."""
        return self.engine_core.trace()

    def start_trace(self) -> int:
        """trace() in two calls, for the other process: start, then stop_trace(id) -> steps."""
        context = self.engine_core.trace()
        trace_id = next(self._trace_ids)
        self._traces[trace_id] = (context, context.__enter__())
        return trace_id

    def stop_trace(self, trace_id: int) -> list[StepRecord]:
        context, steps = self._traces.pop(trace_id)
        context.__exit__(None, None, None)
        return steps

    def add_schedule_callback(self, callback: Callable[[], None]) -> None:
        self.engine_core.schedule_callbacks.append(callback)

    def remove_schedule_callback(self, callback: Callable[[], None]) -> None:
        self.engine_core.schedule_callbacks.remove(callback)


# The InprocClient methods a SyncMPClient may call in the core's process.
UTILITY_METHODS = frozenset({"stats", "reconfigure", "add_lora", "list_loras",
                             "prompt_logits", "start_trace", "stop_trace"})


@dataclass(eq=False)
class CoreProcess:
    """What a SyncMPClient must release: the process, the sockets, their folder. Held by the
    client's finalizer and its output thread, not by the client, so that the client can be
    garbage collected (which shuts the process down)."""

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

    def send(self, kind: str, payload) -> None:
        if self.error is not None:
            raise self.error
        with self.send_lock:
            self.input_socket.send(pickle.dumps((kind, payload), pickle.HIGHEST_PROTOCOL))

    def die(self, why: str) -> None:
        """The core is gone: every waiter (get_output, utility calls) hears why."""
        if self.error is None:
            self.error = EngineDeadError(why)
        self.outputs.put(self.error)
        for future in list(self.futures.values()):
            future.set_exception(self.error)
        self.futures.clear()

    def close(self, timeout: float = 10.0) -> None:
        """Ask the core to stop; past `timeout`, terminate it, then kill it. No orphan: the
        process is waited for (and the core also leaves by itself if this process dies)."""
        if self.closed.is_set():
            return
        self.closed.set()
        if self.popen.poll() is None:
            try:
                self.send("shutdown", None)
                self.popen.wait(timeout)
            except (EngineDeadError, zmq.ZMQError, subprocess.TimeoutExpired):
                self.popen.terminate()
                try:
                    self.popen.wait(timeout)
                except subprocess.TimeoutExpired:
                    self.popen.kill()
                    self.popen.wait()
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join(1.0)                  # it leaves within POLL_MS of `closed`
        self.ctx.destroy(linger=0)                 # both sockets
        shutil.rmtree(self.ipc_dir, ignore_errors=True)
        if self.error is None:
            self.die("the engine was shut down")


def _run_schedule_callbacks(client_ref: weakref.ref) -> None:
    client = client_ref()        # a strong reference only while the callbacks run
    for callback in client.schedule_callbacks if client is not None else ():
        callback()


def _read_outputs(core: CoreProcess, client_ref: weakref.ref) -> None:
    """The output thread: every message from the core, as it comes; a dead process is seen
    within POLL_MS. It holds the client weakly (it calls the schedule callbacks on it)."""
    try:
        while not core.closed.is_set():
            if not core.output_socket.poll(POLL_MS):
                if core.popen.poll() is not None:
                    core.die(f"the engine core process died (exit code {core.popen.returncode})")
                    return
                continue
            kind, payload = pickle.loads(core.output_socket.recv())
            if kind == "outputs":               # the stats first: whoever sees a request
                core.stats = payload.scheduler_stats    # finish sees its blocks free too
                core.outputs.put(payload)
            elif kind == "stats":
                core.stats = payload
            elif kind == "scheduled":
                core.stats = payload
                _run_schedule_callbacks(client_ref)
            elif kind == "utility":
                call_id, ok, value = payload
                future = core.futures.pop(call_id, None)   # None: its caller gave up
                if future is not None and ok:
                    future.set_result(value)
                elif future is not None:
                    future.set_exception(value)
            elif kind == "failed":
                core.die(f"the engine core process failed:\n{payload}")
                return
    except zmq.ZMQError:                         # closed under us: close() is running
        pass


class SyncMPClient:
    def __init__(self, model_path, config: EngineConfig, device, dtype,
                 ready_timeout: float = READY_TIMEOUT_S):
        """Start the core's process and wait until it has built its EngineCore (the weights
        load there). The process gets plain arguments only, never a torch model."""
        self.config = config
        self.schedule_callbacks: list[Callable[[], None]] = []
        self._call_ids = itertools.count()
        ipc_dir = tempfile.mkdtemp(prefix="minivllm-")      # mode 0700: this user's alone
        ctx = zmq.Context()
        output_socket = ctx.socket(zmq.PULL)
        output_socket.bind(f"ipc://{ipc_dir}/output")
        input_socket = ctx.socket(zmq.PUSH)      # connects: messages queue until the core binds
        input_socket.setsockopt(zmq.SNDHWM, 0)   # and never block the front end
        input_socket.connect(f"ipc://{ipc_dir}/input")
        proc = subprocess.Popen([sys.executable, "-m", "minivllm.engine.core_proc", ipc_dir,
                                 str(os.getpid())])
        self.process = CoreProcess(proc, ctx, input_socket, output_socket, ipc_dir)
        self._finalizer = weakref.finalize(self, self.process.close)   # and at interpreter exit
        try:
            self.process.send("start", dict(
                model_path=str(model_path), config=config, device=str(device), dtype=dtype,
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
        why it is not coming."""
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
            request = EngineCoreRequest(request.request_id, request.prompt_token_ids,
                                        request.sampling_params, request.lora_request,
                                        request.grammar.serialize_json(), request.arrival_time)
        self.process.send("add", request)

    def get_output(self, timeout: float = 1.0) -> EngineCoreOutputs:
        """The core's next step's outputs; empty ones if none came within `timeout` seconds or
        wake() was called (a step may take longer: the caller just asks again)."""
        try:
            item = self.process.outputs.get(timeout=timeout)
        except queue.Empty:
            item = None
        if isinstance(item, EngineDeadError):
            self.process.outputs.put(item)             # for the next caller too
            raise item
        return EngineCoreOutputs(timestamp=time.perf_counter()) if item is None else item

    def wake(self) -> None:
        """get_output returns now (AsyncLLMEngine: a request came in; add it at once)."""
        self.process.outputs.put(None)

    def abort_requests(self, request_ids, errors: dict[str, str] | None = None) -> list:
        """Aborted in the core before its next step; the front end has forgotten them already,
        so nothing comes back."""
        if self.process.error is None:
            self.process.send("abort", (list(request_ids), errors))
        return []

    def finish_stopped(self, samples: list[tuple[str, int]]) -> None:
        self.process.send("finish", samples)

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
        fresh=True, the core's answer now: a round trip, after every message sent before."""
        return self.call_utility("stats") if fresh else self.process.stats

    def reconfigure(self, config: EngineConfig) -> EngineCoreInfo:
        self.info = self.call_utility("reconfigure", config)
        self.config = config
        return self.info

    def add_lora(self, lora_request) -> None:
        self.call_utility("add_lora", lora_request)

    def list_loras(self) -> set[int]:
        return self.call_utility("list_loras")

    def prompt_logits(self, token_ids: list[int]):
        return self.call_utility("prompt_logits", list(token_ids))

    @contextmanager
    def trace(self):
        """The core's StepRecords of the steps run inside the block; they cross to this
        process when the block ends (the list is filled then, not step by step)."""
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
