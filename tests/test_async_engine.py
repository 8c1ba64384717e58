"""AsyncLLMEngine: the step loop on its own thread, streams per request, aborts, errors, shutdown.

The loop's error paths run against a stand-in engine (a step() that raises on demand), so they
need no model; the rest runs the packaged model.
"""

import asyncio
import os
import threading
import time

import pytest
import torch

from conftest import reconfigured
from minivllm import SamplingParams
from minivllm.engine.async_llm_engine import AsyncLLMEngine, EngineDeadError
from minivllm.engine.llm_engine import EngineStats
from minivllm.outputs import CompletionOutput, RequestOutput
from minivllm.platforms import release_openmp_threads

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


@pytest.fixture(scope="module")
def engine(smol_llm):
    with reconfigured(smol_llm, max_model_len=256, max_num_seqs=8, num_kv_blocks=64) as llm:
        yield llm.engine


async def collect(aengine, rid, prompt, params=GREEDY):
    outs = [o async for o in aengine.generate(prompt, params, rid)]
    assert outs[-1].finished and not any(o.finished for o in outs[:-1])
    return outs[-1]


def test_concurrent_streams_match_alone_and_free_blocks(engine):
    aengine = AsyncLLMEngine(engine)
    prompts = ["The capital of France is", "1, 2, 3, 4,", "def add(a, b):", "Hello, my name"]

    async def main():
        alone = [await collect(aengine, f"a{i}", p) for i, p in enumerate(prompts)]
        together = await asyncio.gather(*(collect(aengine, f"t{i}", p)
                                          for i, p in enumerate(prompts)))
        return alone, together

    try:
        alone, together = asyncio.run(main())
        assert [o.outputs[0].token_ids for o in together] == [o.outputs[0].token_ids
                                                              for o in alone]
        assert all(len(o.outputs[0].token_ids) == 8 for o in together)
        assert aengine.stats().num_blocks_used == 0 and aengine.stats().num_running == 0
    finally:
        aengine.shutdown()


def test_cancel_mid_stream_aborts_and_frees_blocks(engine):
    aengine = AsyncLLMEngine(engine)
    long = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)

    async def main():
        gen = aengine.generate("Tell me a long story.", long, "cancel-me")
        first = await anext(gen)
        assert not first.finished
        busy = aengine.stats().num_blocks_used
        await gen.aclose()                        # what a disconnecting client does
        for _ in range(200):                      # freed before the next step: a few ms
            if aengine.stats().num_blocks_used == 0:
                break
            await asyncio.sleep(0.01)
        return busy

    try:
        busy = asyncio.run(main())
        assert busy > 0 and aengine.stats().num_blocks_used == 0
        assert aengine.stats().num_running == 0 and not engine.has_unfinished_requests()
    finally:
        aengine.shutdown()


def test_bad_request_raises_before_streaming_and_loop_goes_on(engine):
    aengine = AsyncLLMEngine(engine)

    async def main():
        with pytest.raises(ValueError, match="the prompt has 300 tokens, but max_model_len"):
            await anext(aengine.generate([1] * 300, GREEDY, "too-long"))
        return await collect(aengine, "fine", "Hello")

    try:
        assert len(asyncio.run(main()).outputs[0].token_ids) == 8
    finally:
        aengine.shutdown()


def test_shutdown_answers_requests_in_flight(engine):
    aengine = AsyncLLMEngine(engine)
    long = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)

    async def main():
        gen = aengine.generate("Count to a thousand:", long, "in-flight")
        await anext(gen)
        await asyncio.to_thread(aengine.shutdown)
        with pytest.raises(EngineDeadError, match="shutting down"):
            async for _ in gen:
                pass
        with pytest.raises(EngineDeadError, match="shut down"):
            await anext(aengine.generate("Hi", GREEDY, "after"))

    asyncio.run(asyncio.wait_for(main(), 60))
    assert not engine.has_unfinished_requests() and engine.stats().num_blocks_used == 0


class FailingEngine:
    """Stands in for LLMEngine: each request streams one token a step; step() raises when
    told to."""

    def __init__(self):
        self.requests, self.fail = {}, False

    def add_request(self, rid, prompt, params):
        self.requests[rid] = 0

    def abort_request(self, rid):
        self.requests.pop(rid, None)

    def has_unfinished_requests(self):
        return bool(self.requests)

    def step(self):
        if self.fail:
            raise RuntimeError("CUDA error: an illegal memory access")
        for rid in self.requests:
            self.requests[rid] += 1
        return [RequestOutput(rid, None, [1], [CompletionOutput(0, "x" * n, [0] * n, None, None)],
                              False) for rid, n in self.requests.items()]

    def stats(self):
        return EngineStats(len(self.requests), 0, 0, 0, 1, 0, 0, 0)


def _threads_become(count: int, timeout: float = 5.0) -> int:
    """The process's threads (/proc/self/task: OpenMP's workers too), once they number `count`
    or the timeout has passed (a released worker leaves a moment after it is told)."""
    deadline = time.monotonic() + timeout
    while (now := len(os.listdir("/proc/self/task"))) != count and time.monotonic() < deadline:
        time.sleep(0.01)
    return now


def test_only_the_thread_that_steps_keeps_openmp_threads(engine):
    """Built on this thread, stepped on the engine thread: the building thread's OpenMP team
    goes when AsyncLLMEngine starts, and the engine thread's when it waits for work (two
    teams on as many cores slept and woke ~1,000 times a step: platforms.py)."""
    if engine.device.type != "cpu" or torch.get_num_threads() < 2:
        pytest.skip("OpenMP teams are a multi-threaded CPU's")
    workers = torch.get_num_threads() - 1
    warm = AsyncLLMEngine(engine)                # threads some library makes on first use
    asyncio.run(collect(warm, "omp-warm", "Hello"))   # (2 here, that outlive the engine
    warm.shutdown()                              # thread) are made before the counting
    torch.rand(1 << 22).exp_()                   # parallel: this thread's team is alive
    with_team = len(os.listdir("/proc/self/task"))
    if not release_openmp_threads():
        pytest.skip("no GNU OpenMP runtime in this torch (LLVM's and Intel's are left alone)")
    assert _threads_become(with_team - workers) == with_team - workers
    torch.rand(1 << 22).exp_()                   # it comes back when this thread computes
    assert _threads_become(with_team) == with_team
    aengine = AsyncLLMEngine(engine)             # + the engine thread, - this thread's team
    try:
        assert _threads_become(with_team - workers + 1) == with_team - workers + 1
        asyncio.run(collect(aengine, "omp", "The capital of France is"))
        assert _threads_become(with_team - workers + 1) == with_team - workers + 1   # idle
    finally:
        aengine.shutdown()


def test_engine_error_reaches_every_waiter_never_a_hang():
    fake = FailingEngine()
    aengine = AsyncLLMEngine(fake)

    async def main():
        gens = [aengine.generate("p", GREEDY, f"r{i}") for i in range(3)]
        for g in gens:
            await anext(g)
        fake.fail = True
        for g in gens:
            with pytest.raises(EngineDeadError, match="illegal memory access"):
                async for _ in g:
                    pass
        with pytest.raises(EngineDeadError):
            await anext(aengine.generate("p", GREEDY, "later"))

    asyncio.run(asyncio.wait_for(main(), 10))
    assert aengine.errored and not aengine.is_running


class HeldEngine(FailingEngine):
    """step() holds until released, so the engine thread is busy while the test acts."""

    def __init__(self):
        super().__init__()
        self.stepping = threading.Event()
        self.release = threading.Event()

    def step(self):
        self.stepping.set()
        self.release.wait(10)
        return super().step()


def test_an_add_cancelled_while_queued_is_skipped_and_the_loop_goes_on():
    """A client that leaves while its request waits in the command queue (the server's
    disconnect watch cancels the add) must not stop the loop: the engine thread skips it. It
    used to call set_result on the cancelled future, and the loop died (InvalidStateError,
    seen once in the hostile-client test)."""
    fake = HeldEngine()
    aengine = AsyncLLMEngine(fake)

    async def main():
        await aengine.add_request("busy", "p", GREEDY)     # taken; the next step holds
        await asyncio.to_thread(fake.stepping.wait, 10)
        gone = asyncio.create_task(aengine.add_request("gone", "p", GREEDY))
        await asyncio.sleep(0.05)                          # queued behind the held step
        gone.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gone
        await asyncio.sleep(0.05)                          # the cancel reaches the future
        fake.release.set()
        after = aengine.generate("p", GREEDY, "after")
        assert not (await anext(after)).finished
        assert "gone" not in fake.requests

    try:
        asyncio.run(asyncio.wait_for(main(), 20))
        assert aengine.is_running and not aengine.errored
    finally:
        fake.release.set()
        aengine.shutdown()
