"""One bad request never takes the engine down (issue 13, part 0), through the public API only.

Random requests, valid and not, with aborts at random steps, thrown at one engine with a tiny KV
pool: add_request refuses the bad ones with TypeError/ValueError, step() never raises, every
valid greedy request finishes with the tokens it gets alone, and no KV block is left in use.
"""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import reconfigured, rss_mb
from minivllm import SamplingParams

VOCAB = 49152     # SmolLM2


@pytest.fixture(scope="module")
def engine(smol_llm):
    # 12 blocks of 8 tokens: a few requests fill it, so preemption and admission waits happen.
    # The session's engine, reconfigured (no second weight load), and put back afterwards.
    with reconfigured(smol_llm, max_model_len=96, num_kv_blocks=12, block_size=8,
                      max_num_seqs=4, max_num_batched_tokens=64) as llm:
        yield llm.engine


def maybe_bad(good, bad):
    """Mostly good values, sometimes out of range or of the wrong type."""
    return st.one_of(good, good, good, bad)


params = st.fixed_dictionaries({
    "temperature": maybe_bad(st.just(0.0), st.sampled_from([-1.0, float("nan"), "0", True])),
    "max_tokens": maybe_bad(st.integers(1, 12), st.sampled_from([0, -5, True, 2.5, 10**6])),
    "logprobs": maybe_bad(st.sampled_from([None, 0, 3]), st.sampled_from([-1, 21, 10**6])),
    "stop_token_ids": maybe_bad(st.lists(st.integers(0, VOCAB - 1), max_size=2),
                                st.just([VOCAB + 7])),
    "top_k": maybe_bad(st.just(-1), st.sampled_from([-2, 10**9])),
})
prompts = st.one_of(
    st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=30),
    st.lists(st.integers(-2, VOCAB + 5), min_size=0, max_size=30),     # may leave the vocab
    st.sampled_from(["The capital of France is", "1, 2, 3,", ""]),
)
requests = st.lists(st.tuples(prompts, params, st.integers(0, 30) | st.none()),  # abort step
                    min_size=1, max_size=6)


def run(engine, reqs: dict) -> tuple[dict, dict]:
    """Serve reqs {rid: (prompt, SamplingParams, abort_at)}; return the accepted ones
    {rid: abort_at} and the finished ones {rid: RequestOutput}."""
    valid, done = {}, {}
    for rid, (prompt, sp, abort_at) in reqs.items():
        try:
            engine.add_request(rid, prompt, sp)
            valid[rid] = abort_at
        except (TypeError, ValueError):
            pass
    step = 0
    while engine.has_unfinished_requests():
        for out in engine.step():           # must never raise
            if out.finished:
                done[out.request_id] = out
        for rid, abort_at in valid.items():
            if abort_at == step and rid not in done:
                engine.abort_request(rid)
        step += 1
        assert step < 2000, "the engine stopped making progress"
    return valid, done


@settings(max_examples=10, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(requests)
def test_random_requests_never_poison_the_engine(engine, reqs):
    built = {}
    for i, (prompt, kwargs, abort_at) in enumerate(reqs):
        try:
            sp = SamplingParams(**kwargs)
        except (TypeError, ValueError):
            continue                        # refused at construction: nothing reached the engine
        built[f"r{i}"] = (prompt, sp, abort_at)
    valid, done = run(engine, built)
    assert engine.stats().num_blocks_used == 0, engine.stats()      # no block leaked
    assert {r for r, at in valid.items() if at is None} <= set(done)   # none left hanging
    for rid, out in done.items():
        if out.outputs[0].finish_reason == "abort" or built[rid][2] is not None:
            continue                        # aborted by us, or isolated after a fault
        prompt, sp, _ = built[rid]
        alone = run(engine, {"alone": (prompt, sp, None)})[1]["alone"]
        assert out.outputs[0].token_ids == alone.outputs[0].token_ids, rid
    # And the engine still serves a plain request afterwards.
    _, ok = run(engine, {"after": ("Hello", SamplingParams(temperature=0, max_tokens=3),
                                   None)})
    assert len(ok["after"].outputs[0].token_ids) == 3


# ---------------------------------------------------------------- sampled requests (issue 30)
CHOICES = ["yes", "no", "maybe"]
sampled = st.fixed_dictionaries({
    "temperature": st.sampled_from([0.7, 1.0, 1e-300, 5e-324, 0.0]),
    "top_p": st.sampled_from([1.0, 0.9, 1e-300]),
    "top_k": st.sampled_from([-1, 1, 5, VOCAB, VOCAB + 1, 2**63]),
    "n": st.sampled_from([1, 1, 2, 3]),
    "seed": st.integers(0, 3),
    "max_tokens": st.integers(1, 6),
    "stop": st.sampled_from([[], [","], [" the", "."]]),
    "presence_penalty": st.sampled_from([0.0, 0.5]),
    "repetition_penalty": st.sampled_from([1.0, 1.3]),
    "min_tokens": st.sampled_from([0, 1]),
    "guided_decoding": st.sampled_from([None, None, {"choice": CHOICES},
                                        {"regex": "[0-9]{1,3}"}]),
})
sampled_prompts = st.sampled_from(["The capital of France is", "1, 2, 3,", "Once upon a time",
                                   "bad \ud800 surrogate", [5, 17, 99, 4]])


@settings(max_examples=4, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(sampled_prompts, sampled), min_size=2, max_size=3))
def test_sampled_requests_are_valid_and_reproducible(engine, reqs):
    """n > 1, seeds, stop strings, penalties, guided decoding, tiny temperature and top_p,
    top_k past the vocabulary, prompts the tokenizer cannot encode: the bad ones are refused
    at add_request with a ValueError, the rest finish with valid tokens; a seeded request
    gives in company what it gives alone, and a temperature or top_p too small to sample
    from gives the greedy tokens."""
    built = {}
    for i, (prompt, kwargs) in enumerate(reqs):
        try:
            built[f"s{i}"] = (prompt, SamplingParams(**kwargs), None)
        except (TypeError, ValueError):
            assert kwargs["n"] > 1 and kwargs["temperature"] < 1e-5   # greedy with n > 1
    valid, done = run(engine, built)
    refused = set(built) - set(valid)
    for rid in refused:
        prompt, sp, _ = built[rid]
        assert sp.top_k > VOCAB or "\ud800" in prompt, (prompt, sp)
    assert set(done) == set(valid)
    assert engine.stats().num_blocks_used == 0
    for rid, out in done.items():
        prompt, sp, _ = built[rid]
        assert len(out.outputs) == sp.n
        for c in out.outputs:
            assert c.finish_reason in ("length", "stop"), c
            assert 1 <= len(c.token_ids) <= sp.max_tokens and all(
                0 <= t < VOCAB for t in c.token_ids), c
            g = sp.guided_decoding
            if g is not None and g.choice and c.finish_reason == "stop":
                assert c.text in CHOICES, c.text
            if g is not None and g.regex:
                assert c.text.isdigit() and len(c.text) <= 3, c.text
        alone = run(engine, {"alone": (prompt, sp, None)})[1]["alone"]
        assert [c.token_ids for c in out.outputs] == [c.token_ids for c in alone.outputs], rid
        if sp.temperature == 0 or sp.top_p < 1e-30:     # tiny values: the greedy tokens
            greedy = SamplingParams(**{**{k: getattr(sp, k) for k in (
                "max_tokens", "stop", "presence_penalty", "repetition_penalty", "min_tokens",
                "guided_decoding")}, "temperature": 0.0})
            ref = run(engine, {"greedy": (prompt, greedy, None)})[1]["greedy"]
            assert out.outputs[0].token_ids == ref.outputs[0].token_ids, rid


def test_many_samples_are_refused_before_their_children_exist(engine):
    """n is checked against max_num_seqs before the fan-out builds a child id per sample: a
    request with n = 10**9 once grew the server to 19 GB and the OOM killer took it (20
    million here: 1.4 GB before the fix, nothing after)."""
    before = rss_mb()
    with pytest.raises(ValueError, match="max_num_seqs"):
        engine.add_request("many", [1, 2, 3], SamplingParams(n=20_000_000, max_tokens=1))
    assert not engine.has_unfinished_requests()
    assert rss_mb() - before < 100, f"RSS grew {rss_mb() - before:.0f} MB"
