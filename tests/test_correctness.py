"""Equivalence with Hugging Face transformers: same logits, same greedy tokens."""

import pytest
import torch

from conftest import PROMPTS, TINY_ARCHS, hf_greedy
from minivllm import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)


def test_smol_logits_match_transformers(smol_llm, hf_smol):
    for prompt in PROMPTS[:4]:
        ids = smol_llm.tokenizer.encode(prompt)
        ours = smol_llm.engine.prompt_logits(ids)
        with torch.no_grad():
            ref = hf_smol(torch.tensor([ids])).logits[0]
        assert ours.shape == ref.shape
        torch.testing.assert_close(ours, ref, atol=2e-4, rtol=1e-4)


def test_smol_greedy_matches_transformers_single_and_batched(smol_llm, hf_smol):
    tok = smol_llm.tokenizer
    refs = [hf_greedy(hf_smol, tok.encode(p), 32) for p in PROMPTS]
    batched = smol_llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    for prompt, ref, out in zip(PROMPTS, refs, batched):
        assert out.outputs[0].token_ids == ref, prompt
    for prompt, ref in zip(PROMPTS[:3], refs):
        single = smol_llm.generate(prompt, GREEDY, use_tqdm=False)[0]
        assert single.outputs[0].token_ids == ref, prompt


@pytest.mark.parametrize("arch", list(TINY_ARCHS))
def test_tiny_random_checkpoints_match_transformers(arch, tiny_checkpoint):
    path, hf = tiny_checkpoint(arch)
    llm = LLM(str(path), max_model_len=256, kv_cache_memory=16 << 20)
    prompts = [[5, 17, 300, 4000, 42] * k for k in (1, 3, 9)]   # 5, 15 and 45 tokens
    for ids in prompts:
        with torch.no_grad():
            ref_logits = hf(torch.tensor([ids])).logits[0]
        torch.testing.assert_close(llm.engine.prompt_logits(ids), ref_logits,
                                   atol=1e-4, rtol=1e-4)
    refs = [hf_greedy(hf, ids, 24) for ids in prompts]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True),
                        use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == refs


def test_contiguous_cache_gives_the_same_tokens(smol):
    prompts = PROMPTS[:4]
    b = smol(max_model_len=256).generate(prompts, GREEDY, use_tqdm=False)
    contiguous = smol(max_model_len=256, kv_layout="contiguous", kv_cache_memory=64 << 20)
    assert contiguous.engine.runner.block_size == 256
    a = contiguous.generate(prompts, GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in a] == [o.outputs[0].token_ids for o in b]
