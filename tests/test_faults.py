"""One bad request never takes the engine down (issue 13, part 0), through the public API only.

Random requests, valid and not, with aborts at random steps, thrown at one engine with a tiny KV
pool: add_request refuses the bad ones with TypeError/ValueError, step() never raises, every
valid greedy request finishes with the tokens it gets alone, and no KV block is left in use.
"""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import reconfigured
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
