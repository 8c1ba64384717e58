"""EngineCore and the borders around it (issue 38): the front end gets plain EngineCoreOutputs,
the runner gets plain SchedulerOutput messages, and neither reads a core object.

The runner check is real, not structural alone: an EngineCore over the session model's own
executor, behind a wrapper that empties the core's view of the step (its ScheduledRequest
records and the ids beside them) before the workers see it, must give the tokens LLM.generate
gives.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

from conftest import PROMPTS, reconfigured
from minivllm import SamplingParams
from minivllm.config.scheduler import V0_SCHEDULER
from minivllm.engine.core import EngineCore, EngineCoreRequest
from minivllm.outputs import EngineCoreOutputs

REPO = Path(__file__).resolve().parents[1]
CORE_VIEW = {"scheduled": [], "preempted": [], "swapped_out": [], "swapped_in": []}


class MessagesOnly:
    """An executor that hands the real one the step's messages alone: the core's view of the
    step (its records and the ids beside them) is emptied first."""

    def __init__(self, executor):
        self.executor = executor
        self.kv_cache_config = executor.kv_cache_config
        self.num_new_reqs = 0

    def execute_model(self, scheduler_output):
        self.num_new_reqs += len(scheduler_output.scheduled_new_reqs)
        return self.executor.execute_model(dataclasses.replace(scheduler_output, **CORE_VIEW))


def _run_core(core: EngineCore, requests: list[EngineCoreRequest]) -> dict:
    """Every request through the core alone; request id -> its tokens."""
    for request in requests:
        core.add_request(request)
    tokens: dict[str, list[int]] = {}
    for _ in range(500):
        outs: EngineCoreOutputs = core.step()
        for out in outs.outputs:
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
        if not core.has_unfinished_requests():
            core.step()                          # the runner forgets the last to finish
            return tokens
    raise AssertionError("the core did not finish in 500 steps")


def test_the_runner_computes_from_the_messages_alone(smol_llm):
    """Greedy and seeded n=2 requests, under a pool small enough to preempt (a preempted
    sample comes back to the runner whole, as new): the same tokens as LLM.generate. The core
    here forks the n=2 requests (V0's scheduler) where LLM.generate fans them out (V1): the
    same tokens too, under the same request ids ("i_id"), though the two schedule (and
    preempt) differently."""
    greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    seeded = SamplingParams(n=2, temperature=0.8, seed=3, max_tokens=12, ignore_eos=True)
    params = [greedy] * 6 + [seeded] * 2
    with reconfigured(smol_llm, num_kv_blocks=12, max_num_seqs=8) as llm:
        outs = llm.generate(PROMPTS, params, use_tqdm=False)
        want = {f"{c.index}_core-{i}" if sp.n > 1 else f"core-{i}": c.token_ids
                for i, (o, sp) in enumerate(zip(outs, params)) for c in o.outputs}
        preemptions = llm.engine.stats().num_preemptions
        engine = llm.engine
        wrapped = MessagesOnly(engine.model_executor)
        v0 = dataclasses.replace(engine.vllm_config, scheduler_config=dataclasses.replace(
            engine.vllm_config.scheduler_config, scheduler_cls=V0_SCHEDULER))
        core = EngineCore(v0, wrapped, engine.eos_token_ids)
        got = _run_core(core, [EngineCoreRequest(f"core-{i}", llm.tokenizer.encode(p), sp)
                               for i, (p, sp) in enumerate(zip(PROMPTS, params))])
    assert got == want
    assert preemptions > 0 and core.stats().num_preemptions > 0
    assert wrapped.num_new_reqs > len(PROMPTS) + 2       # forks and readmissions came whole
    assert not engine.runner.requests                      # every sample's state is gone


def test_the_runner_module_reads_no_core_object():
    """worker/model_runner.py imports nothing from core/ but the message types, and never
    names the core's view of a step or a core Request's."""
    tree = ast.parse((REPO / "minivllm/worker/model_runner.py").read_text(encoding="utf-8"))
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert {m for m in imported if m and m.startswith("minivllm.core")} == {
        "minivllm.core.scheduler_output", "minivllm.core.kv_cache"}
    names = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    assert not names & set(CORE_VIEW)


def test_a_stop_string_finishes_the_sample_in_the_core(smol_llm):
    """The front end finds the stop string and finishes the sample in the core: its text is
    cut there, its blocks come back at once, and the core's record of that step lists it as
    finished."""
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    plain = smol_llm.generate(PROMPTS[:1], params, use_tqdm=False)[0].outputs[0]
    stop = " " + plain.text.split(" ")[4]                  # a word well inside the text
    params = SamplingParams(temperature=0, max_tokens=40, stop=[stop], ignore_eos=True)
    with smol_llm.engine.trace() as steps:
        out = smol_llm.generate(PROMPTS[:1], params, use_tqdm=False)[0]
    assert out.outputs[0].finish_reason == "stop"
    assert out.outputs[0].text == plain.text[:plain.text.index(stop)]
    assert len(out.outputs[0].token_ids) < 40
    assert steps[-1].finished == [out.request_id]
    assert steps[-1].stats.num_running == 0 and steps[-1].stats.num_blocks_used == 0
    assert not smol_llm.engine.requests
    smol_llm.engine.core.step()                 # the next step tells the runner (and forgets)
    assert not smol_llm.engine.runner.requests
