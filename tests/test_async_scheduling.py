"""Async scheduling (core/async_scheduler.py, issue 65): step N + 1 is scheduled while step N
runs, a decoding request's unseen token a placeholder the worker fills from its own sample.
First the scheduler alone (two schedules before an update, the placeholder's message, a stop
while its next step is in flight), then SmolLM2: the same tokens as synchronous scheduling,
greedy and seeded, with stop strings, logprobs, penalties, n > 1, a guided request,
preemption and an abort, and every block back at the end; then what it is refused with."""

from __future__ import annotations

import pytest

from minivllm import SamplingParams
from minivllm.sampling_params import GuidedDecodingParams
from minivllm.core.async_scheduler import AsyncScheduler
from minivllm.outputs import ModelRunnerOutput

from conftest import engine_config
from test_scheduler import add_request, make_scheduler


def sampled(request_id: str, token_id: int) -> ModelRunnerOutput:
    return ModelRunnerOutput(sampled={request_id: [(token_id, None)]})


def test_a_decode_is_scheduled_before_its_token_is_back():
    s = make_scheduler(async_scheduling=True)
    assert isinstance(s, AsyncScheduler)
    a = add_request(s, "a", 6, max_tokens=3)
    first = s.schedule()                         # the prompt: 6 tokens, then a sample
    assert (a.num_computed_tokens, a.num_output_placeholders) == (6, 1)
    second = s.schedule()                        # its next token, not back yet: a placeholder
    (record,) = second.scheduled
    assert (record.num_tokens, record.num_computed_tokens, record.samples,
            record.is_prefill) == (1, 6, True, False)
    cached = second.scheduled_cached_reqs
    assert cached.req_ids == ["a"] and cached.new_token_ids == [[]]   # the worker holds it
    assert (a.num_computed_tokens, a.num_output_placeholders) == (7, 2)
    assert s.update_from_output(first, sampled("a", 70))[0].new_token_ids == [70]
    assert (len(a), a.num_output_placeholders) == (7, 1)
    third = s.schedule()                         # token 70 is known now, 80 is not
    assert third.scheduled[0].num_computed_tokens == 7
    assert third.scheduled_cached_reqs.new_token_ids == [[]]
    s.update_from_output(second, sampled("a", 80))
    outputs = s.update_from_output(third, sampled("a", 90))
    assert a.output_token_ids == [70, 80, 90] and outputs[0].finish_reason == "length"
    assert s.block_manager.num_free_blocks == 16 and not s.in_flight


def test_a_stop_drops_the_step_already_scheduled_after_it():
    s = make_scheduler(async_scheduling=True)
    a = add_request(s, "a", 5, max_tokens=1)
    b = add_request(s, "b", 5, max_tokens=3)
    first, second = s.schedule(), s.schedule()   # both decode in the second, a past its end
    assert [r.request_id for r in second.scheduled] == ["a", "b"]
    out = ModelRunnerOutput(sampled={"a": [(1, None)], "b": [(2, None)]})
    assert [o.finish_reason for o in s.update_from_output(first, out)] == ["length", None]
    assert "a" not in s.requests and s.finished_req_ids == {"a"}
    outputs = s.update_from_output(second, ModelRunnerOutput(
        sampled={"a": [(3, None)], "b": [(4, None)]}))     # a's token is dropped
    assert [o.request_id for o in outputs] == ["b"] and a.output_token_ids == [1]
    assert b.output_token_ids == [2, 4] and b.num_output_placeholders == 0


PROMPTS = ["The capital of France is", "Write a haiku about the sea.",
           "List three colors:", "def fibonacci(n):", "Once upon a time"]
PARAMS = [SamplingParams(temperature=0, max_tokens=24),
          SamplingParams(temperature=0.8, seed=3, max_tokens=20, logprobs=2),
          SamplingParams(temperature=0, max_tokens=30, stop=["\n"]),
          SamplingParams(temperature=1.0, seed=11, max_tokens=16, presence_penalty=0.5, n=2),
          SamplingParams(temperature=0, max_tokens=12, guided_decoding=GuidedDecodingParams(
              choice=["a dragon", "a princess", "the sea"]))]


def run(llm, prompts=PROMPTS, params=PARAMS):
    with llm.engine.trace() as steps:
        outputs = llm.generate(prompts, params, use_tqdm=False)
    answers = [[(c.token_ids, c.text, c.finish_reason,
                 c.logprobs and [sorted(d) for d in c.logprobs]) for c in o.outputs]
               for o in outputs]
    return answers, steps


def computed(steps) -> int:
    return sum(r.num_tokens for step in steps for r in step.scheduled)


def test_the_same_tokens_as_synchronous_scheduling(smol, smol_llm):
    smol()
    want, sync_steps = run(smol_llm)
    smol(async_scheduling=True)
    got, async_steps = run(smol_llm)
    assert got == want
    # A sequence's last step is followed by one already scheduled for it: computed, dropped.
    assert 0 < computed(async_steps) - computed(sync_steps) <= len(PROMPTS) + 1
    assert smol_llm.engine.stats().num_blocks_used == 0


def test_preemption_and_an_abort_under_async_scheduling(smol, smol_llm):
    """A pool too small for every sequence at once: requests are preempted (never one with
    a batch in flight) and come back with the same tokens; one aborted while its steps are
    in flight leaves the others as they were; every block comes back."""
    prompts = [f"Story {i}: the old lighthouse keeper" for i in range(6)]
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    answers = {}
    for async_scheduling in (False, True):
        smol(async_scheduling=async_scheduling, num_kv_blocks=14, block_size=8)
        engine = smol_llm.engine
        for i, prompt in enumerate(prompts):
            engine.add_request(f"r{i}", prompt, params)
        outputs = {}
        for n in range(400):
            if n == 12:
                engine.abort_request("r2")
            for out in engine.step():
                outputs[out.request_id] = out
            if not engine.has_unfinished_requests():
                break
        stats = engine.stats()
        assert stats.num_preemptions > 0 and stats.num_blocks_used == 0
        assert len(outputs["r2"].outputs[0].token_ids) < 40        # it stopped when aborted
        answers[async_scheduling] = {r: o.outputs[0].token_ids for r, o in outputs.items()
                                     if r != "r2"}
        assert all(len(t) == 40 for t in answers[async_scheduling].values())
    assert answers[True] == answers[False]


@pytest.mark.parametrize("other, message", [
    ({"speculative_config": {"method": "ngram", "num_speculative_tokens": 2}}, "drafts"),
    ({"kv_offloading_size": 0.01}, "hash of tokens"),
    ({"preemption_mode": "swap"}, "V1's"),
])
def test_what_async_scheduling_is_refused_with(other, message):
    with pytest.raises(ValueError, match=message):
        engine_config(async_scheduling=True, **other)
