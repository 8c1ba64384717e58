"""EngineCoreProc: the EngineCore in a process of its own, stepping in a busy loop (vLLM twin:
EngineCoreProc and run_engine_core in vllm/v1/engine/core.py).

    python -m minivllm.engine.multiproc.core_proc IPC_DIR PARENT_PID    (SyncMPClient starts it)
    python -m minivllm.engine.multiproc.core_proc tcp://HOST:PORT PARENT_PID    (a replica on
        another host than its front end: `minivllm serve --headless` starts it; it connects)

    1. sockets   a PULL bound at IPC_DIR/input (the front end's messages), a PUSH connected to
                 IPC_DIR/output (this core's); ipc:// files in a 0700 folder: this user's alone
    2. start     the first message holds plain arguments (the VllmConfig, which names the
                 checkpoint): EngineCore.from_model loads the weights here, and no tensor
                 crosses. "ready" answers with EngineCoreInfo and the first stats, or "failed"
                 with the traceback (and the process exits 1)
    3. loop      apply every message waiting; if there is work, step and send the step's
                 EngineCoreOutputs; if not, wait for a message, a second at a time, checking in
                 between that the front end still lives (if it died, this process leaves too)

Messages, both ways, are pickled (kind, payload) tuples:

    in    start, add (EngineCoreRequest), abort (ids, errors), finish ((id, sample) pairs),
          utility (call id, InprocClient method, args), shutdown
    out   ready, failed (traceback), outputs (EngineCoreOutputs and the stats after the step),
          scheduled (the stats once a step is scheduled), stats (after messages, when idle),
          utility (call id, ok, the result or the exception)

Why pickle and not msgpack (vLLM's msgspec): the messages are minivllm's own dataclasses
(EngineCoreRequest with its SamplingParams and LoRARequest, EngineCoreOutputs, EngineStats,
StepRecords, a tensor of prompt logits), and pickle carries every one as it is, with no schema
beside it; msgspec would need each to be a msgspec.Struct, and hooks for the rest. A step's
outputs for 64 sequences pickle and unpickle in ~0.1 ms, next to a step of tens of ms. Pickle
runs code as it loads, so it is for a peer one trusts: these sockets are this user's.

A guided request's grammar crosses as xgrammar's JSON (a CompiledGrammar does not pickle), so
the front end compiles it (off its loop, in a process bounded in time and memory) and the core
only loads it: once per grammar, not once per sample, and on a thread of its own while the
loop steps the other requests (minivllm/structured_output/transfer.py).

Ctrl-C is the front end's to handle: this process ignores SIGINT, and stops when told to.

Left out, compared with vLLM: the input and output threads that (de)serialize while the step
runs, data-parallel waves, and the handshake with cores on other hosts.
"""

from __future__ import annotations

import itertools
import logging
import os
import pickle
import signal
import subprocess
import sys
import time
import traceback
from concurrent.futures import Future

import zmq

from minivllm.engine.core import EngineCore, EngineCoreRequest
from minivllm.engine.core_client import InprocClient
from minivllm.engine.stats import StepRecord
from minivllm.outputs import EngineCoreOutput, EngineCoreOutputs
from minivllm.structured_output.transfer import GrammarLoader

logger = logging.getLogger("minivllm")

# What the front end may call here (SyncMPClient.call_utility): InprocClient's methods, and
# EngineCoreProc's own for a trace (`with core.trace()` cannot span two processes).
UTILITY_METHODS = frozenset({"stats", "reconfigure", "add_lora", "list_loras",
                             "reset_prefix_cache", "prompt_logits", "start_trace",
                             "stop_trace"})

IDLE_POLL_MS = 1000          # with no work, how often the loop checks that the front end lives
START_TIMEOUT_MS = 60_000    # the front end sends "start" as it launches this process


class EngineCoreProc:
    def __init__(self, client: InprocClient, input_socket: zmq.Socket,
                 output_socket: zmq.Socket, parent_pid: int):
        self.client = client                 # the core's methods, as the front end names them
        self.core = client.engine_core
        self.input_socket = input_socket
        self.output_socket = output_socket
        self.parent_pid = parent_pid
        self.changed = False                 # messages applied since the last step
        self.core.schedule_callbacks.append(self._scheduled)
        self.traces: dict[int, tuple] = {}   # start_trace's id -> (context, its steps)
        self.loader = GrammarLoader(self.core.structured_output)
        self.trace_ids = itertools.count()

    def send(self, kind: str, payload) -> None:
        self.output_socket.send(pickle.dumps((kind, payload), pickle.HIGHEST_PROTOCOL))

    def _scheduled(self) -> None:
        """A step is scheduled: the front end's gauges show its batch while it runs."""
        self.send("scheduled", self.core.stats())

    # --8<-- [start:busy_loop]
    def run_busy_loop(self) -> None:
        """Messages in, a step while there is work, its outputs out; until told to stop or
        the front end is gone."""
        while self._process_input_queue():
            if self.core.has_unfinished_requests():
                outputs = self.client.get_output()              # one EngineCore.step
                outputs.scheduler_stats = self.core.stats()     # its blocks, after the step
                self.send("outputs", outputs)
            elif self.changed:                 # e.g. an abort: the front end sees the blocks
                self.send("stats", self.core.stats())           # free without a step
    # --8<-- [end:busy_loop]

    def _process_input_queue(self) -> bool:
        """Apply every message waiting; with no work, wait for one first. False: stop."""
        self.changed = False
        while (not self.core.has_unfinished_requests() and not self.loader.waiting
               and not self.input_socket.poll(IDLE_POLL_MS)):
            if os.getppid() != self.parent_pid:
                return False                   # the front end died without a word
        if self.loader.waiting and not self.core.has_unfinished_requests():
            self.input_socket.poll(10)         # only a grammar loading: look again soon
        while self.input_socket.poll(0):
            kind, payload = pickle.loads(self.input_socket.recv())
            if kind == "shutdown":
                return False
            self._handle(kind, payload)
            self.changed = True
        for request, loaded in self.loader.ready():    # guided requests, their grammar loaded
            self._add_request(request, loaded)
            self.changed = True
        return os.getppid() == self.parent_pid

    def _handle(self, kind: str, payload) -> None:
        if kind == "add" and payload.grammar is not None:
            self.loader.add(payload)           # it waits while its grammar loads, off this loop
        elif kind == "add":
            self._add_request(payload)
        elif kind == "abort":
            self.loader.abort(payload[0])
            self.client.abort_requests(*payload)
        elif kind == "finish":
            self.client.finish_stopped(payload)
        elif kind == "utility":
            self._call_utility(*payload)
        else:
            raise ValueError(f"unknown message {kind!r} from the front end")

    def _add_request(self, request: EngineCoreRequest, loaded: Future | None = None) -> None:
        """Add it; the front end checked it already, but if it fails here, it fails alone.
        `loaded`: its grammar's load (GrammarLoader), done."""
        try:
            if loaded is not None:
                request.grammar = loaded.result()
            self.client.add_request(request)
        except Exception as e:                           # noqa: BLE001 -- this request's
            logger.exception("the engine core could not add request %s", request.request_id)
            failed = EngineCoreOutput(request.request_id, 0, [], None, "abort",
                                      error=f"the engine core could not add it: {e!r}")
            self.send("outputs", EngineCoreOutputs([failed], time.perf_counter(),
                                                   self.core.stats()))

    def _call_utility(self, call_id: int, method: str, args: tuple) -> None:
        """InprocClient.<method>(*args); its result, or its exception, goes back."""
        try:
            if method not in UTILITY_METHODS:
                raise AttributeError(f"{method!r} is not one of the engine core's utility "
                                     f"methods {sorted(UTILITY_METHODS)}")
            owner = self if hasattr(EngineCoreProc, method) else self.client
            answer = (call_id, True, getattr(owner, method)(*args))
        except Exception as e:                           # noqa: BLE001 -- the caller's to see
            answer = (call_id, False, e)
        self.send("stats", self.core.stats())     # first: the answer's reader sees them (a
        try:                                      # reconfigure's new pool, say)
            self.send("utility", answer)
        except Exception as e:                           # noqa: BLE001 -- it did not pickle
            self.send("utility", (call_id, False, RuntimeError(f"{method}: {e!r}")))


    def start_trace(self) -> int:
        """The core's trace() in two calls: start, then stop_trace(id) -> its StepRecords."""
        context = self.core.trace()
        trace_id = next(self.trace_ids)
        self.traces[trace_id] = (context, context.__enter__())
        return trace_id

    def stop_trace(self, trace_id: int) -> list[StepRecord]:
        context, steps = self.traces.pop(trace_id)
        context.__exit__(None, None, None)
        return steps


def build_core(vllm_config, log_level: int) -> EngineCore:
    """The EngineCore LLMEngine would build in process, from plain arguments."""
    from pathlib import Path

    from minivllm.models.loader import load_tokenizer
    logging.basicConfig(level=log_level, format="%(levelname)s %(name)s (core): %(message)s")
    return EngineCore.from_model(vllm_config,
                                 load_tokenizer(Path(vllm_config.model_config.model)))


def main(where: str, parent_pid: int) -> int:
    """where: the front end's folder of ipc sockets (it started this process), or
    tcp://HOST:PORT, a front end on another host (a headless replica): connect to PORT (its
    messages) and PORT + 1 (ours), say hello, and wait for "start" as long as it takes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)    # the front end stops this process
    ctx = zmq.Context()
    input_socket = ctx.socket(zmq.PULL)
    output_socket = ctx.socket(zmq.PUSH)
    output_socket.setsockopt(zmq.SNDHWM, 0)      # never block a step on a slow reader
    remote = where.startswith("tcp://")
    if remote:
        host, port = where.removeprefix("tcp://").rsplit(":", 1)
        input_socket.connect(f"tcp://{host}:{port}")
        output_socket.connect(f"tcp://{host}:{int(port) + 1}")
        output_socket.send(pickle.dumps(("hello", os.getpid())))
    else:
        input_socket.bind(f"ipc://{where}/input")
        output_socket.connect(f"ipc://{where}/output")
    started = False
    try:
        while remote and not input_socket.poll(IDLE_POLL_MS):
            if os.getppid() != parent_pid:
                return 1                         # the headless launcher is gone
        if not input_socket.poll(START_TIMEOUT_MS):
            raise TimeoutError(f"no start message from the front end in {START_TIMEOUT_MS} ms")
        kind, args = pickle.loads(input_socket.recv())
        if kind != "start":
            raise ValueError(f"the front end's first message is {kind!r}, not 'start'")
        client = InprocClient(build_core(**args))
        proc = EngineCoreProc(client, input_socket, output_socket, parent_pid)
        proc.send("ready", (client.info, client.stats()))
        started = True
        proc.run_busy_loop()
        client.shutdown()                  # the executor's other ranks, if any, stop too
        return 0
    except Exception:                                    # noqa: BLE001 -- reported, then exit
        if started:
            logger.exception("the engine core failed")
        output_socket.send(pickle.dumps(("failed", traceback.format_exc())))
        return 1
    finally:
        ctx.destroy(linger=5000)        # a last message has 5 s to reach a live front end


def run_headless(address: str, rpc_port: int, start_rank: int, size_local: int) -> int:
    """`minivllm serve --headless`: replicas start_rank .. start_rank + size_local - 1 of a
    front end on another host, each an engine core process that connects to it
    (address:rpc_port + 2 x rank); until they stop, or Ctrl-C stops them."""
    procs = [subprocess.Popen([sys.executable, "-m", "minivllm.engine.multiproc.core_proc",
                               f"tcp://{address}:{rpc_port + 2 * rank}", str(os.getpid())])
             for rank in range(start_rank, start_rank + size_local)]
    print(f"minivllm: headless replicas {start_rank}..{start_rank + size_local - 1} for the "
          f"front end at {address}:{rpc_port}", flush=True)
    try:
        return max(p.wait() for p in procs)
    except KeyboardInterrupt:
        for p in procs:
            p.terminate()
        return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2])))
