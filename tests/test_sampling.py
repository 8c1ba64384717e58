"""Sampling: seeds, top-k / top-p, stop conditions, logprobs. On the packaged model."""

import math

import pytest
import torch

from minivllm import SamplingParams
from minivllm.sample.sampler import apply_top_k_top_p

PROMPT = "Write a short poem about the sea."


def texts(outs):
    return [c.token_ids for o in outs for c in o.outputs]


def test_seeded_sampling_is_reproducible_in_any_batch(smol_llm):
    p = SamplingParams(temperature=0.9, top_p=0.95, max_tokens=24, seed=1234)
    alone = smol_llm.generate(PROMPT, p, use_tqdm=False)
    crowd = smol_llm.generate(["Hello there", PROMPT, "1 2 3"],
                              [SamplingParams(temperature=1.0, max_tokens=30), p,
                               SamplingParams(temperature=0.5, max_tokens=7)], use_tqdm=False)
    assert texts(alone) == [crowd[1].outputs[0].token_ids]
    other_seed = smol_llm.generate(PROMPT, SamplingParams(temperature=0.9, top_p=0.95,
                                                          max_tokens=24, seed=99),
                                   use_tqdm=False)
    assert texts(other_seed) != texts(alone)


def test_top_k_1_equals_greedy(smol_llm):
    greedy = smol_llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=20),
                               use_tqdm=False)
    top1 = smol_llm.generate(PROMPT, SamplingParams(temperature=1.3, top_k=1, max_tokens=20,
                                                    seed=7), use_tqdm=False)
    assert texts(top1) == texts(greedy)


def test_top_k_top_p_mask():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    keep = lambda k, p: torch.isfinite(  # noqa: E731
        apply_top_k_top_p(logits, torch.tensor([k]), torch.tensor([p])))[0].tolist()
    assert keep(4, 1.0) == [True, True, True, True]
    assert keep(2, 1.0) == [True, True, False, False]
    assert keep(4, 0.8) == [True, True, False, False]      # 0.5 + 0.3 reaches 0.8
    assert keep(4, 0.81) == [True, True, True, False]
    assert keep(4, 0.1) == [True, False, False, False]     # the top token always stays
    shuffled = logits[:, [2, 0, 3, 1]]
    assert torch.isfinite(apply_top_k_top_p(shuffled, torch.tensor([2]),
                                            torch.tensor([1.0])))[0].tolist() == [False, True, False, True]


def test_sampling_follows_the_distribution():
    """Exponential-race draws match the softmax probabilities (chi-square-ish bound)."""
    from minivllm.sample.sampler import Sampler
    from minivllm.worker.input_batch import CachedRequestState
    logits = torch.log(torch.tensor([[0.6, 0.25, 0.1, 0.05]]))
    seq = CachedRequestState("r", [1], 1, SamplingParams(temperature=1.0, seed=0), [], 0)
    sampler, counts = Sampler(torch.device("cpu")), torch.zeros(4)
    for _ in range(4000):
        token, _ = sampler(logits, [seq])
        counts[token[0]] += 1
    freq = counts / counts.sum()
    assert torch.allclose(freq, torch.tensor([0.6, 0.25, 0.1, 0.05]), atol=0.03), freq


def test_max_tokens_and_finish_reason(smol_llm):
    out = smol_llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=5, ignore_eos=True),
                            use_tqdm=False)[0].outputs[0]
    assert len(out.token_ids) == 5 and out.finish_reason == "length"


def test_stop_strings_cut_the_text(smol_llm):
    full = smol_llm.generate("1, 2, 3, 4,", SamplingParams(temperature=0, max_tokens=16),
                             use_tqdm=False)[0].outputs[0].text
    assert " 6," in full, full          # the model counts on; stop at "6"
    cut = smol_llm.generate("1, 2, 3, 4,", SamplingParams(temperature=0, max_tokens=16,
                                                          stop=["6"]), use_tqdm=False)
    c = cut[0].outputs[0]
    assert c.finish_reason == "stop"
    assert c.text == full[:full.index("6")]
    kept = smol_llm.generate("1, 2, 3, 4,", SamplingParams(
        temperature=0, max_tokens=16, stop=["6"], include_stop_str_in_output=True),
        use_tqdm=False)[0].outputs[0]
    assert kept.text == full[:full.index("6") + 1]


def test_stop_token_ids(smol_llm):
    greedy = smol_llm.generate("1, 2, 3, 4,", SamplingParams(temperature=0, max_tokens=10),
                               use_tqdm=False)[0].outputs[0].token_ids
    stop_at = greedy[3]
    out = smol_llm.generate("1, 2, 3, 4,", SamplingParams(temperature=0, max_tokens=10,
                                                          stop_token_ids=[stop_at]),
                            use_tqdm=False)[0].outputs[0]
    assert out.token_ids == greedy[:greedy.index(stop_at) + 1]
    assert out.finish_reason == "stop"


def test_eos_finishes_a_chat_reply(smol_llm):
    out = smol_llm.chat([{"role": "user", "content": "Say hi."}],
                        SamplingParams(temperature=0, max_tokens=64), use_tqdm=False)[0]
    c = out.outputs[0]
    assert c.finish_reason == "stop" and c.token_ids[-1] == smol_llm.tokenizer.eos_token_id
    assert "<|im_end|>" not in c.text and c.text.strip()


def test_logprobs(smol_llm):
    ids = smol_llm.tokenizer.encode(PROMPT)
    out = smol_llm.generate(ids, SamplingParams(temperature=0, max_tokens=3, logprobs=2,
                                                       ignore_eos=True),
                            use_tqdm=False)[0].outputs[0]
    assert len(out.logprobs) == 3
    first = out.logprobs[0]
    assert out.token_ids[0] in first and len(first) == 2     # greedy choice is in the top 2
    ref = smol_llm.engine.prompt_logits(ids)[-1].log_softmax(-1)
    for tok, lp in first.items():
        assert math.isclose(lp, ref[tok].item(), abs_tol=1e-4)
    assert max(first.values()) == first[out.token_ids[0]]


def test_logit_bias_pushes_and_bans_tokens(smol_llm):
    """OpenAI's logit_bias: +100 on a token makes greedy pick it every step; -100 on the token
    greedy picked first bans it; a bias on a token the text does not meet changes nothing."""
    prompt = "The capital of France is"
    plain = smol_llm.generate(prompt, SamplingParams(temperature=0, max_tokens=6),
                              use_tqdm=False)[0].outputs[0].token_ids
    forced = smol_llm.generate(prompt, SamplingParams(temperature=0, max_tokens=6,
                                                      logit_bias={42: 100}),
                               use_tqdm=False)[0].outputs[0].token_ids
    assert forced == [42] * 6
    banned = smol_llm.generate(prompt, SamplingParams(temperature=0, max_tokens=6,
                                                      logit_bias={plain[0]: -100}),
                               use_tqdm=False)[0].outputs[0].token_ids
    assert plain[0] not in banned
    unseen = next(t for t in range(100, 200) if t not in plain)
    same = smol_llm.generate(prompt, SamplingParams(temperature=0, max_tokens=6,
                                                    logit_bias={unseen: -5}),
                             use_tqdm=False)[0].outputs[0].token_ids
    assert same == plain
    with pytest.raises(ValueError, match=r"logit_bias values must be in \[-100, 100\]"):
        SamplingParams(logit_bias={1: 101})
    with pytest.raises(ValueError, match="logit_bias: 1000000 is outside the vocabulary"):
        smol_llm.generate(prompt, SamplingParams(logit_bias={10**6: 1}), use_tqdm=False)
