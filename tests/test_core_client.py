"""The EngineCore in its own process (SyncMPClient and EngineCoreProc, issue 38): the same
tokens as in process, stop strings, aborts, utility calls and guided decoding across the
boundary, a dead core as an error (never a hang), and no process left behind.

One core process on the packaged SmolLM2 serves the module; the tests that kill or fail a core
start their own on a tiny random checkpoint (a few seconds: the weights are small).
"""

import asyncio
import gc
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import PROMPTS, nested_schema, wait_idle
from minivllm import LLM, SamplingParams
from minivllm.engine.async_llm_engine import AsyncLLMEngine
from minivllm.engine.core import EngineCoreRequest
from minivllm.engine.core_client import EngineDeadError
from minivllm.engine.llm_engine import LLMEngine, multiprocessing_enabled
from minivllm.sampling_params import GuidedDecodingParams
from minivllm.structured_output.transfer import KEEP_SENT, GrammarLoader, GrammarsSent

SETTINGS = {"max_model_len": 256, "max_num_seqs": 16}
GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


@pytest.fixture(scope="module")
def mp(smol_path):
    llm = LLM(str(smol_path), multiprocess_mode=True, **SETTINGS)
    yield llm
    llm.engine.shutdown()


@pytest.fixture
def inproc(smol):
    return smol(**SETTINGS)


def token_ids(outs):
    return [[c.token_ids for c in o.outputs] for o in outs]


def alive(pid: int) -> bool:
    """Running (a zombie, exited but not waited for, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def children() -> set[int]:
    """This process's live child processes."""
    found = set()
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        found |= {int(p) for p in (task / "children").read_text().split()}
    return {p for p in found if alive(p)}


def until(condition, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)
    return condition()


def test_greedy_and_seeded_samples_equal_in_process(inproc, mp):
    seeded = SamplingParams(n=3, temperature=0.8, seed=7, max_tokens=8)
    for prompts, params in ((PROMPTS, GREEDY), (PROMPTS[:3], seeded)):
        assert token_ids(mp.generate(prompts, params, use_tqdm=False)) == \
            token_ids(inproc.generate(prompts, params, use_tqdm=False))
    s = mp.engine.stats()                  # came back with the last outputs: all blocks free
    assert s.num_running == s.num_waiting == s.num_blocks_used == 0
    assert s.prefix_cache_queried_tokens > 0


def test_stop_strings_and_aborts_cross_the_boundary(inproc, mp):
    stop = SamplingParams(temperature=0.8, max_tokens=16, stop=["e"], n=2, seed=1)
    want = inproc.generate(PROMPTS[:4], stop, use_tqdm=False)
    got = mp.generate(PROMPTS[:4], stop, use_tqdm=False)
    assert [[(c.text, c.token_ids, c.finish_reason) for c in o.outputs] for o in got] == \
        [[(c.text, c.token_ids, c.finish_reason) for c in o.outputs] for o in want]
    assert any(c.finish_reason == "stop" and c.text for o in got for c in o.outputs)
    engine = mp.engine
    engine.add_request("long", "Tell me a long story.", SamplingParams(max_tokens=200,
                                                                      ignore_eos=True))
    while not any(o.outputs[0].token_ids for o in engine.step()):
        pass
    assert until(lambda: engine.stats().num_blocks_used > 0)
    engine.abort_request("long")
    assert not engine.has_unfinished_requests()
    assert until(lambda: engine.stats().num_running == engine.stats().num_blocks_used == 0)


def test_utility_calls(inproc, mp):
    engine = mp.engine
    ids = mp.tokenizer.encode(PROMPTS[0])
    torch.testing.assert_close(engine.prompt_logits(ids), inproc.engine.prompt_logits(ids))
    assert engine.list_loras() == set()
    with engine.trace() as steps:
        mp.generate(PROMPTS[:2], GREEDY, use_tqdm=False)
    assert len(steps) >= GREEDY.max_tokens and steps[0].scheduled[0].is_prefill
    # The core steps as requests come: the second may join a step after the first.
    assert len({s.request_id for step in steps for s in step.scheduled}) == 2
    mp.reconfigure(max_num_seqs=4, num_kv_blocks=8)
    try:
        assert engine.vllm_config.scheduler_config.max_num_seqs == 4
        assert engine.stats().num_blocks_total == 8
        with pytest.raises(ValueError, match="pool has only 8 blocks"):
            engine.add_request("big", ids, SamplingParams(max_tokens=2000, ignore_eos=True))
        with pytest.raises(AttributeError, match="not one of the engine core's utility"):
            engine.engine_core.call_utility("engine_core")
    finally:
        mp.reconfigure(**SETTINGS, num_kv_blocks=None)
    for name in ("scheduler", "runner", "block_manager", "requests", "core"):
        with pytest.raises(AttributeError, match="its own process"):
            getattr(engine, name)
    assert f"core in process {engine.engine_core.pid}" in repr(engine)


def test_guided_decoding_grammar_crosses_as_json(inproc, mp):
    params = [SamplingParams(temperature=0, max_tokens=12, guided_decoding=g) for g in (
        GuidedDecodingParams(choice=["Paris", "London", "Rome"]),
        GuidedDecodingParams(regex=r"[0-9]{3}-[a-z]{2}"))]
    want = [o.outputs[0].text for o in inproc.generate(PROMPTS[:2], params, use_tqdm=False)]
    assert [o.outputs[0].text for o in mp.generate(PROMPTS[:2], params, use_tqdm=False)] == want
    assert want[0] in ("Paris", "London", "Rome")
    compiled = mp.engine.structured_output.compile(params[0].guided_decoding)
    with pytest.raises(TypeError):        # why the client sends its JSON instead
        pickle.dumps(compiled)
    samples = SamplingParams(n=3, seed=7, max_tokens=12, guided_decoding=GuidedDecodingParams(
        choice=["Paris", "London", "Rome", "Berlin"]))     # 3 children, one grammar
    want = [c.text for c in inproc.generate(PROMPTS[:1], samples, use_tqdm=False)[0].outputs]
    assert [c.text for c in mp.generate(PROMPTS[:1], samples,
                                        use_tqdm=False)[0].outputs] == want


def test_a_grammar_crosses_once_for_all_its_samples(inproc, mp):
    """The n children of a guided request carry one grammar: its JSON (23 MB for a 4,000-way
    choice, ~0.5 s to load) crosses to the core once, then its digest; sender and core keep
    the same KEEP_SENT most recent, so an evicted one is sent whole again."""
    front, core = mp.engine.structured_output, GrammarLoader(inproc.engine.structured_output)
    sent = GrammarsSent()

    def crossing(guided):            # a guided request as the process client sends it
        request = EngineCoreRequest("r", [1, 2], SamplingParams(guided_decoding=guided),
                                    grammar=front.compile(guided, serialized=True))
        return pickle.loads(pickle.dumps(sent.prepare(request))).grammar
    deep = nested_schema(300)        # pickle recursed past Python's limit on this schema
    first, again = crossing(GuidedDecodingParams(json=deep)), crossing(
        GuidedDecodingParams(json=deep))
    assert first.json and again.json is None and again.digest == first.digest
    assert core.receive(first) is core.receive(again)
    for i in range(KEEP_SENT):
        core.receive(crossing(GuidedDecodingParams(regex=f"x{i}")))
    assert first.digest not in core.received
    assert crossing(GuidedDecodingParams(json=deep)).json == first.json


def test_async_engine_over_the_process_client(inproc, mp):
    prompts = PROMPTS[:4]
    want = [o.outputs[0].text for o in inproc.generate(prompts, GREEDY, use_tqdm=False)]
    aengine = AsyncLLMEngine(mp.engine)
    scheduled = []

    def spy():                        # on the thread that reads the core's messages
        scheduled.append(mp.engine.stats().num_running)
    mp.engine.add_schedule_callback(spy)

    async def one(i):
        outs = [o async for o in aengine.generate(prompts[i], GREEDY, f"a{i}")]
        return outs[-1].outputs[0].text

    async def main():
        texts = await asyncio.gather(*(one(i) for i in range(len(prompts))))
        stream = aengine.generate("Tell me a long story.", GREEDY, "leaves")
        await anext(stream)
        await stream.aclose()                        # the client went away: aborted
        return texts
    try:
        assert asyncio.run(asyncio.wait_for(main(), 60)) == want
        s = wait_idle(aengine, timeout=10)
        assert s.num_running == s.num_waiting == s.num_blocks_used == 0
        assert scheduled and max(scheduled) >= 2     # the gauges saw batches in flight
    finally:
        mp.engine.remove_schedule_callback(spy)
        aengine.shutdown()


def test_a_core_that_dies_mid_run_is_an_error_and_leaves_no_process(tiny_checkpoint):
    path, _ = tiny_checkpoint("llama")
    before = children()
    engine = LLMEngine(str(path), multiprocess_mode=True, max_model_len=128)
    pid = engine.engine_core.pid
    assert children() - before == {pid}
    engine.add_request("r", [5, 6, 7], SamplingParams(max_tokens=100, ignore_eos=True))
    engine.step()
    os.kill(pid, signal.SIGKILL)
    t0 = time.monotonic()
    with pytest.raises(EngineDeadError, match="exit code -9"):
        while time.monotonic() - t0 < 10:
            engine.step()
    with pytest.raises(EngineDeadError):
        engine.add_request("s", [5, 6], SamplingParams(max_tokens=2))
    engine.shutdown()
    assert children() == before
    engine = LLMEngine(str(path), multiprocess_mode=True, max_model_len=128)  # and by GC
    pid = engine.engine_core.pid
    del engine
    gc.collect()
    assert not alive(pid) and children() == before


def test_a_core_that_fails_to_start_says_why(tiny_checkpoint, tmp_path):
    path, _ = tiny_checkpoint("llama")
    for f in path.iterdir():                   # everything but the weights
        if f.suffix != ".safetensors":
            shutil.copy(f, tmp_path / f.name)
    before = children()
    with pytest.raises(RuntimeError, match=r"(?s)exit code 1.*FileNotFoundError: no "
                                           r"\*\.safetensors files"):
        LLMEngine(str(tmp_path), multiprocess_mode=True)
    assert children() == before


@pytest.mark.parametrize("end", ["exit", "kill"])
def test_the_core_leaves_with_its_front_end(tiny_checkpoint, end):
    """A front end that exits without shutdown() stops its core at exit; one that is killed
    leaves it to notice (within its idle poll, a second)."""
    path, _ = tiny_checkpoint("llama")
    script = ("import os, sys; from minivllm import LLMEngine; "
              f"e = LLMEngine({str(path)!r}, multiprocess_mode=True, max_model_len=64); "
              "print(e.engine_core.pid, flush=True); "
              + ("os.kill(os.getpid(), 9)" if end == "kill" else "sys.exit(3)"))
    front = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                           timeout=120)
    assert front.returncode == (-9 if end == "kill" else 3), front.stderr
    core = int(front.stdout.split()[0])
    assert until(lambda: not alive(core), timeout=0.1 if end == "exit" else 10), \
        "the core outlived its front end"


def test_in_process_is_the_default(monkeypatch):
    monkeypatch.delenv("MINIVLLM_ENABLE_MULTIPROCESSING", raising=False)
    assert not multiprocessing_enabled()
    monkeypatch.setenv("MINIVLLM_ENABLE_MULTIPROCESSING", "1")
    assert multiprocessing_enabled()


def test_async_scheduling_in_the_core_process(inproc, mp):
    """The core in its own process schedules ahead too (issue 65): the same tokens as the
    synchronous in-process engine."""
    want = [o.outputs[0].token_ids for o in inproc.generate(PROMPTS[:3], GREEDY,
                                                              use_tqdm=False)]
    mp.reconfigure(**SETTINGS, async_scheduling=True)
    try:
        got = [o.outputs[0].token_ids for o in mp.generate(PROMPTS[:3], GREEDY, use_tqdm=False)]
    finally:
        mp.reconfigure(**SETTINGS, async_scheduling=False)
    assert got == want
