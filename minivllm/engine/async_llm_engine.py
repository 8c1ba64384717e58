"""AsyncLLMEngine: the engine's step loop on its own thread, requests from asyncio coroutines
(vLLM twin: vllm/v1/engine/async_llm.py, AsyncLLM, with its engine core in another process).

    client -> HTTP handler (coroutine) -> command queue -> engine thread: step(), step(), ...
           <- async stream per request <- loop.call_soon_threadsafe(queue.put_nowait, output)

Why not run `step()` inside the event loop: one step is a forward pass, tens to hundreds of
milliseconds on a CPU. While it runs, the event loop can do nothing: no new connection is
accepted, no token already computed is sent, no disconnect is noticed. Lesson 06 measures it.

Why a thread, and then a process: torch releases the GIL inside its kernels (matmuls,
attention), which is where a step spends its time, so the event loop keeps running beside the
engine on the same cores. The Python parts of a step (scheduling, preparing the batch,
sampling) still hold the GIL, and so do HTTP, tokenizing and detokenizing. With an LLMEngine in
multiprocess mode (what `minivllm serve` builds), the thread here only feeds the front end and
the EngineCore steps in its own process (engine/multiproc/), with a GIL of its own, at the
price of IPC: pickled requests and outputs over a socket. docs/benchmarks.md measures both.

Everything that touches the LLMEngine happens on the engine thread (it is not thread-safe):
coroutines send commands (add, abort, stop) through a thread-safe queue that the loop drains
between steps, so an abort frees the request's KV blocks before the next step runs. What can
take long before a request is added stays off that thread: a guided-decoding grammar is
compiled in a child process, bounded in CPU time and memory, that a worker thread waits on
while the request waits ("grammar pending", counted as waiting), so one huge constraint
neither freezes every other stream nor grows the server (minivllm/structured_output/).

What it leaves out, compared with vLLM: asyncio sockets to the core (AsyncMPClient; the thread
here drives the sync client), output batching across requests, priorities, and a watchdog. An exception from step() kills the engine (every waiting
request gets it as an error; `errored` turns true and /health says so): after one, the engine's
state is not trusted. Faults of one request are isolated inside step(), in engine/llm_engine.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
from collections.abc import AsyncIterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace

from minivllm.engine.core_client import EngineDeadError
from minivllm.engine.llm_engine import EngineStats, LLMEngine
from minivllm.outputs import RequestOutput
from minivllm.platforms import release_openmp_threads
from minivllm.sampling_params import SamplingParams

logger = logging.getLogger("minivllm")


__all__ = ["AsyncLLMEngine", "EngineDeadError"]


class _Stream(asyncio.Queue):
    """One request's outputs, as the event loop sees them: RequestOutputs, then an error or the
    finished output."""

    def __init__(self):
        super().__init__()
        self.loop = asyncio.get_running_loop()

    def put_threadsafe(self, item: RequestOutput | BaseException) -> None:
        """Called from the engine thread."""
        with contextlib.suppress(RuntimeError):   # the event loop is closed: nobody listens
            self.loop.call_soon_threadsafe(self.put_nowait, item)


def _detach(out: RequestOutput) -> RequestOutput:
    """A copy that the engine thread will not change later (logprobs lists grow in place)."""
    return replace(out, outputs=[replace(c, logprobs=None if c.logprobs is None
                                         else list(c.logprobs)) for c in out.outputs])


class AsyncLLMEngine:
    def __init__(self, engine: LLMEngine):
        self.engine = engine
        self._commands: queue.Queue[tuple] = queue.Queue()
        self._streams: dict[str, _Stream] = {}     # owned by the engine thread
        self._stats = engine.stats()               # the last snapshot, taken between steps
        self._error: BaseException | None = None
        self._lock = threading.Lock()              # guards _error against adds in flight
        self._compiler = ThreadPoolExecutor(1, thread_name_prefix="minivllm-grammar")
        self.num_grammars_pending = 0              # requests waiting for their grammar
        # The core in its own process: its stats() are the snapshot it sent last, safe to read
        # from any thread, and step() waits for it (wake() ends the wait when a command comes).
        self._live_stats = getattr(engine, "multiprocess_mode", False)
        self._wake = getattr(engine, "wake", lambda: None)
        if hasattr(engine, "add_schedule_callback"):   # running/KV gauges as a step starts too
            engine.add_schedule_callback(self._snapshot)
        # The model runs on the engine thread from here: the building thread's OpenMP team goes.
        release_openmp_threads()
        self._thread = threading.Thread(target=self._run, name="minivllm-engine", daemon=True)
        self._thread.start()

    # ---------------------------------------------------------------- the coroutine side
    @property
    def tokenizer(self):
        return self.engine.tokenizer

    @property
    def errored(self) -> bool:
        return self._error is not None

    @property
    def is_running(self) -> bool:
        return self._thread.is_alive() and self._error is None

    def stats(self) -> EngineStats:
        """The engine's stats as its last step was scheduled or ended, whichever came later
        (read without stopping the loop); requests whose grammar compiles count as waiting."""
        s = self.engine.stats() if self._live_stats else self._stats
        return replace(s, num_waiting=s.num_waiting + self.num_grammars_pending)

    def replica_stats(self) -> list[EngineStats]:
        """Data parallelism: each replica's last snapshot (read without stopping the loop);
        one engine: [stats()]."""
        client = self.engine.engine_core
        return client.replica_stats() if hasattr(client, "replica_stats") else [self.stats()]

    def _snapshot(self) -> None:
        self._stats = self.engine.stats()

    async def add_request(self, request_id: str, prompt: str | list[int],
                          params: SamplingParams) -> AsyncIterator[RequestOutput]:
        """Add a request; return its stream of RequestOutputs (cumulative; the last one has
        finished=True). A bad request raises here (TypeError/ValueError from
        LLMEngine.add_request), once the engine thread has taken it: within one step."""
        grammar = None
        if (isinstance(params, SamplingParams) and params.guided_decoding is not None
                and hasattr(self.engine, "structured_output")):   # not a disaggregated pair
            grammar = await self._compile(params)      # ValueError if it does not compile
        stream = _Stream()
        added: Future = Future()
        with self._lock:          # the loop cannot stop between this check and the put
            if self._error is not None:
                raise EngineDeadError(f"the engine loop has stopped: {self._error}")
            self._commands.put(("add", request_id, prompt, params, stream, added, grammar))
        self._wake()
        try:
            await asyncio.wrap_future(added)
        except asyncio.CancelledError:
            self.abort(request_id)                # it may have been added meanwhile
            raise
        return self._outputs(request_id, stream)

    async def _compile(self, params: SamplingParams):
        """The request's grammar, compiled in a child process bounded in CPU time and memory
        (the manager's compile_limits; minivllm/structured_output/sandbox.py), waited for on
        the worker thread ("grammar pending"); for a core in another process it stays
        xgrammar's JSON. A client that leaves meanwhile cancels the wait; the compile runs to
        its end or its limit, and its grammar stays in the cache."""
        manager = self.engine.structured_output
        self.num_grammars_pending += 1
        try:
            return await asyncio.wrap_future(self._compiler.submit(
                manager.compile, params.guided_decoding, manager.compile_limits,
                self._live_stats))
        finally:
            self.num_grammars_pending -= 1

    async def _outputs(self, request_id: str, stream: _Stream) -> AsyncIterator[RequestOutput]:
        """Closing or cancelling this iterator before the end aborts the request."""
        finished = False
        try:
            while not finished:
                item = await stream.get()
                while not stream.empty() and not isinstance(item, BaseException):
                    item = stream.get_nowait()         # outputs are cumulative: keep the newest
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                finished = item.finished
                yield item
        finally:
            if not finished:                      # cancelled, or the client went away
                self.abort(request_id)

    async def generate(self, prompt: str | list[int], params: SamplingParams,
                       request_id: str) -> AsyncIterator[RequestOutput]:
        """add_request and its stream in one: `async for out in aengine.generate(...)`."""
        outputs = await self.add_request(request_id, prompt, params)
        try:
            async for out in outputs:
                yield out
        finally:
            await outputs.aclose()

    def abort(self, request_id: str) -> None:
        """Abort a request: its blocks are freed before the engine's next step. Thread-safe."""
        self._commands.put(("abort", request_id))
        self._wake()

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop the loop after the step in progress. Every request still in flight gets an
        EngineDeadError (and is aborted, so its blocks are freed)."""
        if self._thread.is_alive():
            self._commands.put(("stop",))
            self._wake()
            self._thread.join(timeout)
        self._compiler.shutdown(wait=False, cancel_futures=True)
        if hasattr(self.engine, "remove_schedule_callback"):   # the engine may serve on
            self.engine.remove_schedule_callback(self._snapshot)

    # ---------------------------------------------------------------- the engine thread
    def _run(self) -> None:
        try:
            # Wait for a command only when there is nothing to step; otherwise just drain.
            while self._drain(block=not self.engine.has_unfinished_requests()):
                outputs = self.engine.step() if self.engine.has_unfinished_requests() else []
                # The snapshot (also after aborts, with no step to run) before the outputs:
                # whoever sees its request finish also sees its blocks free.
                self._stats = self.engine.stats()
                for out in outputs:
                    if out.request_id in self._streams:
                        self._streams[out.request_id].put_threadsafe(_detach(out))
                        if out.finished:
                            del self._streams[out.request_id]
        except BaseException as e:   # noqa: BLE001 -- whatever it was, every waiter must hear it
            logger.exception("the engine loop died")
            self._close(e, EngineDeadError(f"the engine loop died: {e!r}"))
        finally:
            self._stats = self.engine.stats()

    def _drain(self, block: bool) -> bool:
        """Apply queued commands; False means stop. Blocks for the first one if `block`, its
        OpenMP team handed back first (whoever computes while it waits gets the cores)."""
        if block:
            release_openmp_threads()
        while block or not self._commands.empty():    # the engine thread is the only reader
            cmd = self._commands.get()
            block = False
            if cmd[0] == "add":
                _, rid, prompt, params, stream, added, grammar = cmd
                # A client that left while this waited in the queue cancelled `added`: skip
                # it. Once running, `added` cannot be cancelled, so set_result below is safe.
                if not added.set_running_or_notify_cancel():
                    continue
                try:
                    if grammar is None:
                        self.engine.add_request(rid, prompt, params)
                    else:
                        self.engine.add_request(rid, prompt, params, grammar=grammar)
                except BaseException as e:   # noqa: BLE001 -- the request's error, not ours
                    added.set_exception(e)
                    continue
                self._streams[rid] = stream
                added.set_result(None)
            elif cmd[0] == "abort":
                if self._streams.pop(cmd[1], None) is not None:
                    self.engine.abort_request(cmd[1])
            elif cmd[0] == "stop":
                self._close(EngineDeadError("the engine was shut down"),
                            EngineDeadError("the server is shutting down; request cancelled"))
                if self._live_stats:    # the aborts crossed to the core's process: applied?
                    with contextlib.suppress(EngineDeadError):
                        self.engine.stats(fresh=True)
                return False
        return True

    def _close(self, cause: BaseException, error: Exception) -> None:
        """Stop for good: refuse new requests, abort every request in flight and hand each
        waiter `error`."""
        with self._lock:
            self._error = self._error or cause
        for rid, stream in list(self._streams.items()):
            try:
                self.engine.abort_request(rid)    # frees its blocks (if the engine still can)
            except Exception:                     # noqa: BLE001 -- the waiter hears it anyway
                logger.exception("abort of %s failed", rid)
            stream.put_threadsafe(error)
        self._streams.clear()
        while not self._commands.empty():         # adds queued before the lock was taken
            cmd = self._commands.get_nowait()
            if cmd[0] == "add":
                cmd[5].set_exception(error)
