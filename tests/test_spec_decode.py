"""Speculative decoding (minivllm/spec_decode/decoder.py): exact, leak-free, counted, refused when
misconfigured.

Exactness is tested twice: greedy output must be token-for-token the output without
speculation (on the packaged model, and on a tiny random one under chunked prefill,
preemption and prefix caching), and the sampling rule must reproduce the target distribution
(a chi-square test on synthetic distributions, where the rule's output can be counted)."""

import json

import numpy as np
import pytest
import torch

from minivllm import LLM, SamplingParams
from minivllm.core.block_manager import cdiv
from minivllm.spec_decode.draft_model import first_layers_checkpoint
from minivllm.sample.rejection_sampler import greedy_accept, rejection_sample
from minivllm.spec_decode.ngram_proposer import NgramProposer
from minivllm.workloads import Request, serve

from conftest import engine_config


def ngram(k: int, **kw) -> dict:
    return {"method": "ngram", "num_speculative_tokens": k, **kw}


def draft(path, k: int) -> dict:
    return {"model": str(path), "num_speculative_tokens": k}


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)


def tokens(outputs) -> list[list[int]]:
    return [c.token_ids for o in outputs for c in o.outputs]


def pool_is_full(engine) -> bool:
    bm = engine.block_manager
    return bm.num_free_blocks == bm.num_blocks and not any(bm.ref_counts)


COPY_TEXT = ("The quick brown fox jumps over the lazy dog. Serving a language model is mostly "
             "a memory problem: each request keeps the keys and values of its context.")


def copy_prompt(text: str = COPY_TEXT) -> str:
    """A request whose answer repeats its prompt: where prompt lookup finds every draft."""
    return (f"<|im_start|>user\nRepeat this text exactly:\n{text}<|im_end|>\n"
            "<|im_start|>assistant\n")


# ------------------------------------------------------------------ the proposer


def test_ngram_proposer_finds_the_longest_suffix_earliest():
    p = NgramProposer(prompt_lookup_min=1, prompt_lookup_max=3)
    #         0  1  2  3  4  5  6  7  8  9
    seq = [5, 6, 7, 8, 9, 1, 6, 7, 8]
    assert p.propose(seq, 2) == [9, 1]            # "6 7 8" seen at 1..3, followed by 9 1
    assert p.propose(seq, 5) == [9, 1, 6, 7, 8]   # as far as the sequence goes
    assert p.propose([1, 2, 3, 4], 3) == []       # "4" never occurred before
    assert p.propose([3, 1, 3, 2, 3], 1) == [1]   # "3": earliest occurrence wins
    assert NgramProposer(2, 3).propose([3, 1, 3, 2, 3], 1) == []   # 1-grams not allowed
    assert p.propose([7], 3) == []


# ------------------------------------------------------------------ the acceptance rule


def test_greedy_accept_is_the_longest_matching_prefix():
    logits = torch.full((3, 10), -1.0)
    logits[0, 4] = logits[1, 2] = logits[2, 7] = 1.0          # target argmax: 4 2 7
    assert greedy_accept(logits, [4, 2, 7]) == (3, None)
    assert greedy_accept(logits, [4, 5, 7]) == (1, 2)
    assert greedy_accept(logits, [0, 2, 7]) == (0, 4)


CHI2_CRITICAL_DF5 = 20.515      # P(chi-square with 5 degrees of freedom > 20.515) = 0.001


def chi_square(counts: np.ndarray, probs: np.ndarray) -> float:
    expected = counts.sum() * probs
    keep = expected > 0
    assert counts[~keep].sum() == 0, "a token the target gives probability 0 was emitted"
    return float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum())


def emitted_tokens(p: torch.Tensor, q: torch.Tensor, trials: int, seed: int, rule):
    """Run `rule` (rejection_sample or a wrong one) `trials` times with drafts drawn from q:
    the token emitted at position 0 every time, and at position 1 when there is one."""
    g = torch.Generator().manual_seed(seed)
    first, second = np.zeros(p.shape[1], int), np.zeros(p.shape[1], int)
    k = q.shape[0]
    for _ in range(trials):
        drafts = [int(torch.multinomial(q[i], 1, generator=g)) for i in range(k)]
        n, fix = rule(p[:k], q, drafts, g)
        bonus = int(torch.multinomial(p[k], 1, generator=g))
        out = drafts[:n] + [fix if fix is not None else bonus]
        first[out[0]] += 1
        if len(out) > 1:
            second[out[1]] += 1
    return first, second


@pytest.mark.parametrize("proposer", ["point mass (n-gram)", "draft distribution"])
def test_rejection_sampling_draws_from_the_target_distribution(proposer):
    """Whatever q proposes, the emitted tokens are distributed as the target's p, position by
    position. Vocabulary of 6, k = 2, 6,000 trials, fixed seed; each chi-square test has a
    false-alarm rate of 0.1% (two per case: < 0.2% that a correct rule fails)."""
    torch.manual_seed(1)
    vocab, k = 6, 2
    p = torch.rand(k + 1, vocab) ** 2
    p[:, 5] = 0                                # a token top-k / top-p removed from the target
    p /= p.sum(-1, keepdim=True)
    if proposer == "draft distribution":
        q = torch.softmax(torch.randn(k, vocab), -1)       # q also proposes token 5
    else:                                      # always "2", then always "5" (always rejected)
        q = torch.tensor([[0, 0, 1.0, 0, 0, 0], [0, 0, 0, 0, 0, 1.0]])
    first, second = emitted_tokens(p, q, 6000, seed=0, rule=rejection_sample)
    assert second.sum() > 500                  # position 1 is reached often enough to test
    assert chi_square(first, p[0].numpy()) < CHI2_CRITICAL_DF5
    assert chi_square(second, p[1].numpy()) < CHI2_CRITICAL_DF5

    # The test can fail: the classic mistake of drawing from p itself after a rejection
    # (instead of from norm(max(p - q, 0))) over-weights the drafts, and is caught.
    def resample_from_p(p, q, drafts, g):
        n, fix = rejection_sample(p, q, drafts, g)
        return n, None if fix is None else int(torch.multinomial(p[n], 1, generator=g))
    wrong, _ = emitted_tokens(p, q, 6000, seed=0, rule=resample_from_p)
    assert chi_square(wrong, p[0].numpy()) > CHI2_CRITICAL_DF5


# ------------------------------------------------------------------ configuration


@pytest.mark.parametrize("bad, message", [
    (ngram(0), "num_speculative_tokens must be an integer >= 1, got 0"),
    (ngram(2.5), "num_speculative_tokens must be an integer >= 1"),
    ({"prompt_lookup_max": 3}, "needs num_speculative_tokens"),
    ({"method": "eagle", "num_speculative_tokens": 2}, "unknown method 'eagle'"),
    ({"method": "ngram", "model": "/x", "num_speculative_tokens": 2}, "both method='ngram'"),
    ({"method": "draft_model", "num_speculative_tokens": 2}, "'draft_model' needs a model"),
    (ngram(2, prompt_lookup_min=3, prompt_lookup_max=2), "prompt_lookup_min <= "),
    (ngram(2, lookup=3), "unknown key(s) ['lookup']"),
    ("ngram", "must be a dict or None"),
])
def test_bad_speculative_configs_are_refused(bad, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[").replace("]", r"\]")):
        engine_config(speculative_config=bad)


def test_speculation_needs_paged_kv():
    with pytest.raises(ValueError, match="needs kv_layout='paged'"):
        engine_config(speculative_config=ngram(2), kv_layout="contiguous")


# ------------------------------------------------------------------ the packaged model


def steps_of(run, request_id: str) -> int:
    return sum(any(s.request_id == request_id for s in step.scheduled) for step in run.steps)


def predicted_counts(prompt_ids, output_ids, k, proposer
                     ) -> tuple[int, int, int, list[int], list[int]]:
    """Replay the engine's speculation on a known greedy output: at each step the proposer
    sees the sequence so far, the target accepts the drafts that match the real output.
    Returns (verifications, draft tokens, accepted tokens, per position: verifications that
    accepted draft i, and verifications that judged it)."""
    verifications = drafted = accepted = 0
    per_pos = [0] * k
    judged = [0] * k
    n = 1                                          # the first token comes from the prefill
    while n < len(output_ids):
        room = min(k, len(output_ids) - n - 1)     # max_tokens - num_output_tokens - 1
        drafts = proposer.propose(prompt_ids + output_ids[:n], room) if room > 0 else []
        m = 0
        while m < len(drafts) and drafts[m] == output_ids[n + m]:
            m += 1
        verifications += bool(drafts)
        drafted, accepted, n = drafted + len(drafts), accepted + m, n + m + 1
        per_pos[:m] = [c + 1 for c in per_pos[:m]]
        reached = min(m + 1, len(drafts))
        judged[:reached] = [c + 1 for c in judged[:reached]]
    return verifications, drafted, accepted, per_pos, judged


def test_greedy_output_is_unchanged_and_acceptance_is_as_predicted(smol):
    """A copying request and a free-form one, batched: the same tokens with k = 1, 3, 5 as
    without speculation; the engine's acceptance counts equal a replay of the proposer on
    the plain output (per draft position too); copying accepts most drafts, so it takes far
    fewer steps."""
    llm = smol(max_model_len=256)
    prompts = [copy_prompt(), "Once upon a time, in a small village by the sea,"]
    ids = [llm.tokenizer.encode(p, add_special_tokens=False) for p in prompts]
    requests = [Request(i, greedy(28)) for i in ids]
    plain = serve(llm, requests)
    for k in (1, 3, 5):
        llm.reconfigure(speculative_config=ngram(k))
        run = serve(llm, requests)
        assert tokens(run.outputs) == tokens(plain.outputs), k
        per_pos = [0] * k
        judged = [0] * k
        for prompt_ids, out in zip(ids, run.outputs):
            _, drafted, accepted, pos, judge = predicted_counts(
                prompt_ids, out.outputs[0].token_ids, k, NgramProposer(1, 4))
            assert (out.metrics.num_draft_tokens, out.metrics.num_accepted_tokens) == (
                drafted, accepted), k
            per_pos = [a + b for a, b in zip(per_pos, pos)]
            judged = [a + b for a, b in zip(judged, judge)]
        copying = run.outputs[0].metrics
        assert copying.acceptance_rate > 0.8, copying
        stats = run.steps[-1].stats
        assert stats.spec_decode_num_accepted_tokens == sum(
            o.metrics.num_accepted_tokens for o in run.outputs)
        pad = lambda counts: list(counts) + [0] * (k - len(counts))  # noqa: E731
        assert pad(stats.spec_decode_num_accepted_tokens_per_pos) == per_pos, k
        assert pad(stats.spec_decode_num_judged_tokens_per_pos) == judged, k
        assert judged[0] == stats.spec_decode_num_drafts        # draft 0 is always judged
        assert stats.spec_decode_acceptance_per_pos[0] == per_pos[0] / judged[0]
        assert stats.spec_decode_num_accepted_tokens == sum(s.num_accepted_tokens
                                                            for s in run.steps)
        assert stats.spec_decode_num_draft_tokens == sum(s.num_draft_tokens for s in run.steps)
        if k >= 3:                                 # ~k+1 tokens a step while copying
            assert steps_of(run, "req-0") < 0.6 * steps_of(plain, "req-0")
        assert pool_is_full(llm.engine)


def test_chunked_prefill_and_speculation_share_the_budget(smol):
    """A 24-token budget: a long prompt prefills in chunks while a copying request verifies
    its drafts in the same steps; drafts never take a later sequence's one token, and the
    output is the plain one."""
    llm = smol(max_model_len=256, max_num_batched_tokens=24)
    long_prompt = llm.tokenizer.encode(COPY_TEXT * 2, add_special_tokens=False)[:60]
    requests = [Request(copy_prompt(), greedy(20)), Request(long_prompt, greedy(6),
                                                            arrival_step=3)]
    plain = serve(llm, requests)
    llm.reconfigure(speculative_config=ngram(4))
    run = serve(llm, requests)
    assert tokens(run.outputs) == tokens(plain.outputs)
    mixed = [s for s in run.steps if s.num_prefill_tokens and s.num_draft_tokens]
    assert mixed, "no step verified drafts next to a prefill chunk"
    assert all(s.num_batched_tokens <= 24 for s in run.steps)
    assert pool_is_full(llm.engine)


def test_draft_model_keeps_greedy_output_and_frees_its_pool(smol, smol_path):
    """The default model cut to its first 10 of 30 layers drafts for the whole model: the
    same tokens as without speculation at k = 2 and 4, batched; the draft's pool gets every
    block back."""
    path = first_layers_checkpoint(str(smol_path), 10)
    llm = smol(max_model_len=256)
    requests = [Request(copy_prompt(), greedy(20)),
                Request("The capital of France is", greedy(12))]
    plain = serve(llm, requests)
    for k in (2, 4):
        llm.reconfigure(speculative_config=draft(path, k))
        run = serve(llm, requests)
        assert tokens(run.outputs) == tokens(plain.outputs), k
        stats = run.steps[-1].stats
        assert stats.spec_decode_num_draft_tokens > 0       # (few accepted: see its docstring)
        drafter = llm.engine.runner.drafter.proposer
        assert drafter.runner.hf_config.num_hidden_layers == 10
        llm.engine.core.step()                 # the runner (and drafter) forget the last
        assert not drafter.shadows
        assert drafter.block_manager.num_free_blocks == drafter.block_manager.num_blocks
        assert pool_is_full(llm.engine)


def test_a_quantized_copy_of_the_target_drafts_well(smol, smol_path):
    """The target's own weights in int8 as the draft: nearly every guess is the target's
    choice (measured 96-100% at k = 4), and the output is still exactly the target's."""
    llm = smol(max_model_len=256)
    requests = [Request("Once upon a time, in a small village by the sea,", greedy(16)),
                Request(copy_prompt(), greedy(16))]
    plain = serve(llm, requests)
    llm.reconfigure(speculative_config={"model": str(smol_path), "quantization": "int8",
                                        "num_speculative_tokens": 4})
    run = serve(llm, requests)
    assert tokens(run.outputs) == tokens(plain.outputs)
    assert run.steps[-1].stats.spec_decode_acceptance_rate > 0.8
    assert len(run.steps) < 0.5 * len(plain.steps)


def test_a_draft_with_another_vocabulary_is_refused(smol, tiny_checkpoint, tmp_path):
    config = json.loads((tiny_checkpoint("llama")[0] / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config | {"vocab_size": 1000}))
    with pytest.raises(ValueError, match="vocabulary of 1000 tokens, the target 49152"):
        smol(speculative_config=draft(tmp_path, 2))


# ------------------------------------------------------------------ a tiny random model


@pytest.fixture(scope="module")
def tiny_llm(tiny_checkpoint):
    path, _ = tiny_checkpoint("llama")
    return LLM(str(path), max_model_len=256)


@pytest.fixture
def tiny(tiny_llm):
    """tiny(**settings): the tiny model's LLM, reconfigured as a fresh LLM(**settings)."""
    from dataclasses import asdict

    from minivllm.engine.arg_utils import LOAD_TIME_ARGS, EngineArgs
    defaults = {k: v for k, v in asdict(EngineArgs()).items() if k not in LOAD_TIME_ARGS}
    defaults["max_model_len"] = 256
    return lambda **settings: tiny_llm.reconfigure(**{**defaults, **settings})


def tiny_requests(num: int, max_tokens: int) -> list[Request]:
    """Prompts that repeat themselves, so that prompt lookup proposes something."""
    rng = np.random.default_rng(0)
    out = []
    for i in range(num):
        motif = rng.integers(100, 40000, size=int(rng.integers(3, 7))).tolist()
        out.append(Request(motif * int(rng.integers(3, 6)), greedy(max_tokens)))
    return out


@pytest.mark.parametrize("proposer", ["ngram", "draft model"])
@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preemption_on_a_tiny_pool(tiny, tiny_checkpoint, mode, proposer):
    """Six requests of up to 50 tokens, 16 blocks of 4 tokens: sequences are preempted while
    holding drafts and lookahead blocks (and, with a draft model, twins in its pool); the
    output is the plain one and every block of both pools comes back."""
    settings = {"num_kv_blocks": 16, "block_size": 4, "preemption_mode": mode,
                "swap_space": 1 / 256, "max_model_len": 64}
    requests = tiny_requests(6, 20)
    plain = serve(tiny(**settings), requests)
    spec = (ngram(3) if proposer == "ngram" else
            draft(first_layers_checkpoint(str(tiny_checkpoint("llama")[0]), 1), 3))
    llm = tiny(**settings, speculative_config=spec)
    run = serve(llm, requests)
    assert tokens(run.outputs) == tokens(plain.outputs)
    assert run.steps[-1].stats.num_preemptions > 0
    assert run.steps[-1].stats.spec_decode_num_draft_tokens > 0
    assert pool_is_full(llm.engine)
    if proposer == "draft model":
        drafter = llm.engine.runner.drafter.proposer
        llm.engine.core.step()                 # the runner (and drafter) forget the last
        assert not drafter.shadows
        assert drafter.block_manager.num_free_blocks == drafter.block_manager.num_blocks


def test_rejected_slots_are_rolled_back_and_their_blocks_freed(tiny):
    """After every step, each decoding sequence holds K/V for all its tokens but the newest
    and no block past its tokens: the lookahead blocks of rejected drafts are gone, and the
    drafts it holds for the next step (the runner's prompt lookup on its tokens now, from
    the step's ModelRunnerOutput) have no slots yet. Sequences in one step propose different
    numbers of drafts, or none."""
    engine = tiny(block_size=4, speculative_config=ngram(5)).engine
    lookup = NgramProposer(1, 4)                           # ngram()'s defaults
    for i, r in enumerate(tiny_requests(4, 24)):
        engine.add_request(f"r{i}", r.prompt, r.params)
    with engine.trace() as steps:
        while engine.has_unfinished_requests():
            engine.step()
            for seq in engine.scheduler.running:
                room = min(5, seq.sampling_params.max_tokens - seq.num_output_tokens - 1)
                if seq.num_output_tokens:
                    assert seq.num_computed_tokens == len(seq) - 1
                    # (a plain decode's new token gets its slot next step; no lookahead kept)
                    assert cdiv(len(seq) - 1, 4) <= len(seq.block_table) <= cdiv(len(seq), 4)
                    assert seq.spec_token_ids == (lookup.propose(seq.token_ids, room)
                                                  if room > 0 else [])
                else:
                    assert seq.spec_token_ids == []
    assert any(len({s.num_draft_tokens for s in step.scheduled}) > 1 for step in steps)
    assert sum(s.num_accepted_tokens for s in steps) < sum(s.num_draft_tokens for s in steps)
    assert pool_is_full(engine)


def test_prefix_cache_never_holds_unverified_tokens(tiny):
    """Turn 2 repeats turn 1 (prompt and answer) and goes on: its prefix comes from blocks
    that turn 1 filled while speculating. Had a block been named with rejected drafts' K/V,
    turn 2's output would differ from the plain, uncached run."""
    first = tiny_requests(1, 30)[0]
    follow = Request([11, 12, 13], greedy(12), follows=0)
    plain = serve(tiny(enable_prefix_caching=False), [first, follow])
    run = serve(tiny(block_size=4, speculative_config=ngram(4)), [first, follow])
    assert tokens(run.outputs) == tokens(plain.outputs)
    assert run.steps[-1].stats.prefix_cache_hit_tokens >= 32
    assert run.outputs[0].metrics.num_draft_tokens > run.outputs[0].metrics.num_accepted_tokens


def test_sampling_with_speculation_is_seeded_and_keeps_logprobs(tiny):
    """Seeded sampling with drafts is reproducible; greedy logprobs are the plain ones."""
    llm = tiny(speculative_config=ngram(3))
    prompt = tiny_requests(1, 1)[0].prompt
    params = SamplingParams(temperature=0.8, top_k=50, top_p=0.9, seed=7, max_tokens=16,
                            ignore_eos=True)
    a, b = (llm.generate([prompt], params, use_tqdm=False)[0] for _ in range(2))
    assert a.outputs[0].token_ids == b.outputs[0].token_ids
    assert len(a.outputs[0].token_ids) == 16
    lp = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, logprobs=2)
    spec = llm.generate([prompt], lp, use_tqdm=False)[0]
    assert spec.metrics.num_accepted_tokens > 0
    plain = tiny().generate([prompt], lp, use_tqdm=False)[0]
    assert spec.outputs[0].token_ids == plain.outputs[0].token_ids
    for x, y in zip(spec.outputs[0].logprobs, plain.outputs[0].logprobs):
        assert x.keys() == y.keys()
        assert all(abs(x[t] - y[t]) < 1e-4 for t in x)


def test_parallel_samples_speculate_on_shared_blocks(tiny):
    """V0's fork (an n = 3 request handed to the core whole): the samples share the prompt's
    blocks; each verifies its own drafts, writing its lookahead slots through copy-on-write.
    All finish with max_tokens; every block returns."""
    from minivllm.engine.core import EngineCoreRequest
    from minivllm.config.scheduler import V0_SCHEDULER
    llm = tiny(block_size=4, speculative_config=ngram(3), scheduler_cls=V0_SCHEDULER)
    engine = llm.engine
    prompt = list(tiny_requests(1, 1)[0].prompt)          # token ids
    params = SamplingParams(n=3, temperature=0.05, seed=1, max_tokens=12, ignore_eos=True)
    engine.engine_core.add_request(EngineCoreRequest("v0", prompt, params))
    group = engine.scheduler.groups["v0"]
    with engine.trace() as steps:
        for _ in range(100):
            if not engine.has_unfinished_requests():
                break
            engine.step()
    assert [len(s.output_token_ids) for s in group.seqs] == [12, 12, 12]
    assert sum(s.num_draft_tokens for s in steps) > 0
    assert sum(s.num_blocks_copied for s in steps) >= 2
    assert pool_is_full(engine)
