"""The engine's public surface that lessons, benchmarks and tests stand on: the per-step
record (SchedulerOutput, StepRecord), reconfigure over loaded weights, request-level fault
isolation, and the shared workloads with their driver."""

import pytest

from minivllm import SamplingParams
from minivllm.config.scheduler import V0_SCHEDULER
from minivllm.engine.core import EngineCoreRequest
from minivllm.engine.output_processor import OutputProcessor
from minivllm.engine.parallel_sampling import ParentRequest
from minivllm.outputs import EngineCoreOutput, EngineCoreOutputs
from minivllm.engine.detokenizer import IncrementalDetokenizer
from minivllm.benchmarks.workloads import multi_turn_requests
from minivllm.workloads import (Request, conversation_requests, lognormal_requests,
                                mixed_requests, poisson_arrivals, serve, shared_prefix_requests,
                                tool_catalog_prompt)

GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


def pool_is_full(engine):
    bm = engine.block_manager
    return bm.num_free_blocks == bm.num_blocks and not any(bm.ref_counts)


def test_step_records_say_what_each_step_did(smol):
    """A 40-token prompt under a 16-token budget: three prefill chunks (16, 16, 8) that are
    marked as prefill, then decodes; a second request joins mid-way and shares steps."""
    llm = smol(max_model_len=256, max_num_batched_tokens=16)
    ids = llm.tokenizer.encode("word " * 40)[:40]
    run = serve(llm, [Request(ids, GREEDY), Request(ids[:5], GREEDY, arrival_step=2)])
    first = [s for step in run.steps for s in step.scheduled if s.request_id == "req-0"]
    assert [(s.num_tokens, s.is_prefill) for s in first[:4]] == [(16, True), (16, True),
                                                                (8, True), (1, False)]
    assert len(first) == 3 + 5                     # 3 chunks, then 5 more decodes (6 tokens)
    step2 = run.steps[2]
    assert {s.request_id for s in step2.scheduled} == {"req-0", "req-1"}
    assert step2.num_prefill_tokens == 8 + 5 and step2.num_decode_tokens == 0
    assert run.steps[3].num_decode_tokens == 2 and run.steps[3].num_prefill_tokens == 0
    assert max(run.finish_step) == len(run.steps)
    # Steps counted from 1 (docs/glossary.md): req-0's first token came with its last chunk
    # (step 3), req-1 arrived after 2 steps and was prefilled whole in step 3.
    assert run.arrival_step == [0, 2] and run.ttft_steps == [3, 1]
    assert run.token_steps == [[3, 4, 5, 6, 7, 8]] * 2 and run.finish_step == [8, 8]
    assert [s.step for s in run.steps] == list(range(len(run.steps)))
    assert run.steps[-1].finished and run.steps[-1].stats.num_running == 0
    assert llm.engine.last_scheduler_output.num_batched_tokens == run.steps[-1].num_batched_tokens
    assert pool_is_full(llm.engine)


def test_latency_counts_from_when_a_request_arrived(smol):
    """An idle engine skips to the next arrival, so a request's TTFT in steps counts from the
    step it arrived at (`arrival_step`), not from the step number it asked for; in seconds,
    from when it was due, which is never after the engine took it."""
    llm = smol(max_model_len=256)
    ids = llm.tokenizer.encode("Name a colour:")
    short = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    run = serve(llm, [Request(ids, short), Request(ids, short, arrival_step=20),
                      Request(ids, short, arrival_time=0.05)])
    assert run.arrival_step[1] < 20 and run.ttft_steps[1] == 1
    assert all(t >= o.metrics.ttft > 0 for t, o in zip(run.ttfts, run.outputs))
    assert [len(t) for t in run.token_steps] == [2, 2, 2]


def test_parallel_sampling_fans_out_into_n_requests_gathered_into_one_output(smol):
    """vLLM V1: n=3 becomes three requests of one sample (child i seeded seed + i), prefilled
    side by side with no fork and no copy-on-write, and gathered back into one RequestOutput."""
    llm = smol(max_model_len=256)
    ids = llm.tokenizer.encode("Name a colour:")
    params = SamplingParams(n=3, temperature=0.9, max_tokens=4, seed=3, ignore_eos=True)
    run = serve(llm, [Request(ids, params)])
    assert [(s.request_id, s.is_prefill) for s in run.steps[0].scheduled] == [
        ("0_req-0", True), ("1_req-0", True), ("2_req-0", True)]
    assert sum(s.num_blocks_copied for s in run.steps) == 0
    out = run.outputs[0]
    assert out.request_id == "req-0" and out.finished and out.prompt_token_ids == ids
    assert [c.index for c in out.outputs] == [0, 1, 2]
    assert all(len(c.token_ids) == 4 and c.finish_reason == "length" for c in out.outputs)
    for i, c in enumerate(out.outputs):             # each child is an ordinary request
        alone = SamplingParams(temperature=0.9, max_tokens=4, seed=3 + i, ignore_eos=True)
        assert llm.generate([ids], alone, use_tqdm=False)[0].outputs[0].token_ids == c.token_ids
    assert pool_is_full(llm.engine) and not llm.engine.requests


def test_v0_fork_in_the_core_draws_what_the_fan_out_draws(smol):
    """vLLM V0's parallel sampling, in the core of a V0 scheduler for a caller who adds an
    EngineCoreRequest with n > 1 itself: the prompt is prefilled once by sample 0 ("0_v0"),
    then samples 1 and 2 ("1_v0", "2_v0") fork onto its blocks and recompute only the prompt's
    last token, their logits row (copy-on-write on the partly filled block). Same tokens."""
    llm = smol(max_model_len=256, scheduler_cls=V0_SCHEDULER)
    ids = llm.tokenizer.encode("Name a colour:")
    params = SamplingParams(n=3, temperature=0.9, max_tokens=4, seed=3, ignore_eos=True)
    fanned_out = [c.token_ids for c in llm.generate([ids], params, use_tqdm=False)[0].outputs]
    core = llm.engine.engine_core
    core.add_request(EngineCoreRequest("v0", ids, params))
    tokens = {}
    with llm.engine.trace() as steps:
        while core.has_unfinished_requests():
            for out in core.get_output().outputs:
                tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
    assert [(s.request_id, s.num_tokens) for s in steps[0].scheduled] == [("0_v0", len(ids))]
    assert [(s.request_id, s.num_tokens, s.num_computed_tokens)
            for s in steps[1].scheduled] == [("0_v0", 1, len(ids)), ("1_v0", 1, len(ids) - 1),
                                             ("2_v0", 1, len(ids) - 1)]
    assert sum(s.num_blocks_copied for s in steps) >= 2
    assert [tokens[f"{i}_v0"] for i in range(3)] == fanned_out
    assert pool_is_full(llm.engine)


def test_a_stop_string_ends_one_child_and_an_abort_ends_them_all(smol):
    llm = smol(max_model_len=256)
    engine = llm.engine
    ids = llm.tokenizer.encode("Write a list of fruits:")
    params = SamplingParams(n=3, temperature=1.0, max_tokens=12, seed=5, ignore_eos=True)
    plain = llm.generate([ids], params, use_tqdm=False)[0].outputs
    word = next(w for w in sorted(set(plain[1].text.split()))     # in sample 1's text alone
                if w not in plain[0].text and w not in plain[2].text)
    stopped = llm.generate([ids], SamplingParams(n=3, temperature=1.0, max_tokens=12, seed=5,
                                                 ignore_eos=True, stop=[word]),
                           use_tqdm=False)[0].outputs
    assert stopped[1].finish_reason == "stop" and word not in stopped[1].text
    assert stopped[1].text == plain[1].text[:len(stopped[1].text)]
    assert [(c.token_ids, c.finish_reason) for c in (stopped[0], stopped[2])] == [
        (c.token_ids, "length") for c in (plain[0], plain[2])]
    engine.add_request("parent", ids, params)
    assert sorted(engine.requests) == ["0_parent", "1_parent", "2_parent"]
    with pytest.raises(ValueError, match="'1_parent' is already in use"):
        engine.add_request("1_parent", ids)
    engine.step()
    engine.abort_request("parent")
    assert not engine.requests and not engine.has_unfinished_requests()
    assert pool_is_full(engine)


def test_the_output_processor_gathers_children_and_one_childs_fault_fails_them_all(smol_llm):
    """The front end alone, on plain EngineCoreOutputs: children "0_p" and "1_p" are samples 0
    and 1 of "p"; when the core fails one child, the parent finishes with the error and every
    child is to be aborted in the core (the other is still running there)."""
    op = OutputProcessor(smol_llm.tokenizer)
    params = SamplingParams(n=2, temperature=1.0, seed=1)
    op.add_request("p", None, [1, 2], params, 0.0, ParentRequest("p", params))
    first = op.process_outputs(EngineCoreOutputs([EngineCoreOutput("1_p", [6], None),
                                                  EngineCoreOutput("0_p", [5], None)]))
    [out] = first.request_outputs
    assert out.request_id == "p" and not out.finished and not first.to_abort
    assert [(c.index, c.token_ids) for c in out.outputs] == [(0, [5]), (1, [6])]
    failed = op.process_outputs(EngineCoreOutputs([EngineCoreOutput(
        "1_p", [], None, "abort", error="sampling failed")]))
    [out] = failed.request_outputs
    assert out.finished and out.error == "sampling failed"
    assert [c.finish_reason for c in out.outputs] == ["abort", "abort"]
    assert failed.to_abort == {"0_p": "sampling failed", "1_p": "sampling failed"}
    assert not op.has_unfinished_requests() and not op.child_requests
    assert op.abort_requests(["unknown"]) == ["unknown"]     # not here: the core's to find


def test_reconfigure_keeps_weights_and_checks_like_a_fresh_engine(smol):
    llm = smol(max_model_len=256)
    engine = llm.engine
    weights = engine.runner.model.lm_head.weight
    ref = llm.generate(["The capital of France is"], GREEDY, use_tqdm=False)
    llm.reconfigure(block_size=8, num_kv_blocks=40, enable_prefix_caching=False)
    assert engine.runner.model.lm_head.weight is weights          # nothing reloaded
    assert engine.block_manager.num_blocks == 40 and engine.block_manager.block_size == 8
    assert engine.block_manager.prefix_cache is None
    assert llm.generate(["The capital of France is"], GREEDY,
                        use_tqdm=False)[0].outputs[0].token_ids == ref[0].outputs[0].token_ids
    with pytest.raises(ValueError, match="max_num_seqs must be a positive integer, got 0"):
        llm.reconfigure(max_num_seqs=0)
    with pytest.raises(ValueError, match="exceeds the model's max_position_embeddings"):
        llm.reconfigure(max_model_len=10**6)
    with pytest.raises(TypeError, match=r"unknown engine setting\(s\) \['dtype'\]"):
        llm.reconfigure(dtype="bfloat16")
    assert engine.block_manager.num_blocks == 40                  # a refusal changes nothing
    engine.add_request("busy", "Hello", GREEDY)
    with pytest.raises(RuntimeError, match=r"1 request\(s\) in flight \(busy\)"):
        llm.reconfigure(max_num_seqs=2)
    engine.abort_request("busy")
    llm.reconfigure(kv_layout="contiguous", num_kv_blocks=None, kv_cache_memory=4 * 256 * 46080)
    assert "kv=contiguous 4x256" in repr(engine)


def test_one_failing_request_does_not_take_the_others_down(smol, monkeypatch):
    """Fault injection: detokenizing request 'bad' raises. That request finishes with
    finish_reason 'abort' and the error in its output; its blocks are freed; the other
    request's tokens are exactly what it gets alone."""
    llm = smol(max_model_len=256)
    engine = llm.engine
    alone = llm.generate(["Tell me about the sea."], GREEDY, use_tqdm=False)[0]
    real_update = IncrementalDetokenizer.update
    poisoned = engine.tokenizer.encode("Poisoned prompt here")

    def update(self, token_ids, final=False):
        if token_ids[:len(poisoned)] == poisoned and len(token_ids) > len(poisoned) + 2:
            raise RuntimeError("boom")
        return real_update(self, token_ids, final)
    monkeypatch.setattr(IncrementalDetokenizer, "update", update)
    engine.add_request("bad", poisoned, GREEDY)
    engine.add_request("good", "Tell me about the sea.", GREEDY)
    outs = {}
    with engine.trace() as steps:
        while engine.has_unfinished_requests():
            for out in engine.step():                 # never raises
                outs[out.request_id] = out
    assert outs["bad"].finished and outs["bad"].outputs[0].finish_reason == "abort"
    assert "boom" in outs["bad"].error
    assert any("bad" in s.errors for s in steps)
    assert outs["good"].error is None
    assert outs["good"].outputs[0].token_ids == alone.outputs[0].token_ids
    assert pool_is_full(engine)


@pytest.mark.parametrize("bad, message", [
    (dict(logprobs=21), r"logprobs.*21"),     # SamplingParams itself refuses it (max 20)
    (dict(stop_token_ids=[10**7]), "stop_token_ids: 10000000 is outside the vocabulary"),
])
def test_requests_the_model_cannot_serve_are_refused_at_admission(smol_llm, bad, message):
    with pytest.raises(ValueError, match=message):
        smol_llm.engine.add_request("x", "hi", SamplingParams(**bad))
    assert not smol_llm.engine.has_unfinished_requests()


def test_workloads_are_seeded_and_shaped(smol_llm):
    tok = smol_llm.tokenizer
    a = lognormal_requests(tok, 12, prompt=(3.8, 0.7, 8, 400), output=(3.9, 0.6, 4, 160))
    b = lognormal_requests(tok, 12, prompt=(3.8, 0.7, 8, 400), output=(3.9, 0.6, 4, 160))
    assert [(r.prompt, r.params.max_tokens) for r in a] == [(r.prompt, r.params.max_tokens)
                                                            for r in b]
    assert all(8 <= len(r.prompt) <= 400 and 4 <= r.params.max_tokens <= 160 for r in a)
    assert len({tuple(r.prompt) for r in a}) == 12                 # no two prompts alike
    shared = shared_prefix_requests(tok, 4, prefix_tokens=64)
    assert all(r.prompt[:64] == shared[0].prompt[:64] for r in shared)
    assert [r.arrival_step for r in shared] == [0, 1, 1, 1]
    times = [r.arrival_time for r in poisson_arrivals(lognormal_requests(tok, 50), rate=10.0)]
    assert times == sorted(times) and 2.0 < times[-1] < 10.0       # ~49 gaps of 0.1 s
    steps = [r.arrival_step for r in poisson_arrivals(lognormal_requests(tok, 50), rate=0.5,
                                                      unit="steps")]
    assert steps[0] == 0 and steps == sorted(steps) and 50 < steps[-1] < 200   # ~49 gaps of 2
    with pytest.raises(ValueError, match="unit must be 'seconds' or 'steps'"):
        poisson_arrivals(shared, rate=1.0, unit="tokens")
    # The capstone's mix: half behind one system prompt, the rest copy, JSON and documents.
    mix = mixed_requests(tok, 16, seed=3, system_tokens=128, long_prompt=(256, 320))
    assert [r.prompt for r in mix] == [r.prompt for r in mixed_requests(
        tok, 16, seed=3, system_tokens=128, long_prompt=(256, 320))]
    system = [r for r in mix if r.prompt[:128] == tool_catalog_prompt(tok, "InventoryBot", 128)]
    json = [r for r in mix if r.params.guided_decoding is not None]
    docs = [r for r in mix if 256 <= len(r.prompt) < 320]
    assert len(system) == 8 and len(json) in (2, 3) and len(docs) in (2, 3)
    assert all(r.params.ignore_eos for r in mix if r not in json)
    assert [r.prompt for r in mix] != [r.prompt for r in mixed_requests(tok, 16, seed=4)]


def test_conversation_turns_extend_the_history_and_hit_the_cache(smol):
    llm = smol(max_model_len=1024)
    turns = conversation_requests(llm.tokenizer, 3, prefix_tokens=64, max_tokens=5)
    run = serve(llm, turns)
    for prev, out in zip(run.outputs, run.outputs[1:]):
        history = prev.prompt_token_ids + prev.outputs[0].token_ids
        assert out.prompt_token_ids[:len(history)] == history
    # Turns 2 and 3 find their history's full blocks in the cache.
    assert run.steps[-1].stats.prefix_cache_hit_tokens >= 2 * (64 // 16) * 16
    assert pool_is_full(llm.engine)


def test_a_chats_next_turn_comes_after_the_users_think_time(smol):
    """multi_turn_requests(think_time=...): each later turn joins that many seconds after the
    answer it follows finished (serve waits with the engine idle), never before."""
    llm = smol(max_model_len=1024)
    turns = multi_turn_requests(llm.tokenizer, 2, 2, system_tokens=48, max_tokens=2,
                                think_time=0.3)
    run = serve(llm, turns)
    for i, r in enumerate(turns):
        if r.follows is not None:
            finished = run.outputs[r.follows].metrics.finished_time
            assert run.arrival_time[i] >= finished + 0.3 - 1e-3, (i, run.arrival_time[i])
            assert run.outputs[i].metrics.first_token_time > run.arrival_time[i]


def test_nothing_outside_the_engine_assigns_to_its_attributes():
    """Lessons and tests drive the engine through its public API (ARCHITECTURE.md): no
    assignment to an attribute of an engine, scheduler, config, block manager, model runner or
    sampler (patching `schedule`, changing max_num_seqs on a live engine) anywhere."""
    import re
    from pathlib import Path
    repo = Path(__file__).resolve().parents[1]
    assignment = re.compile(r"\b(engine|scheduler|config|block_manager|runner|sampler)"
                            r"(\.\w+)+\s*(=(?!=)|\+=|-=)")
    found = [f"{path.relative_to(repo)}:{i}: {line.strip()}"
             for folder in ("lessons", "tests")
             for path in sorted((repo / folder).rglob("*.py"))
             for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if assignment.search(line)]
    assert not found, "\n".join(found)
