"""The public API's contract: shapes of outputs, chat, and a clear error for every bad input."""

import pytest
import torch

from minivllm import LLM, SamplingParams
from minivllm.config import HfConfig

from conftest import engine_config


def test_generate_shapes_and_order(smol_llm):
    prompts = ["Hello", "The sky is", "Numbers: 1, 2,"]
    outs = smol_llm.generate(prompts, SamplingParams(temperature=0, max_tokens=4),
                             use_tqdm=False)
    assert [o.prompt for o in outs] == prompts
    for o in outs:
        assert o.finished and o.prompt_token_ids == smol_llm.tokenizer.encode(o.prompt)
        assert len(o.outputs) == 1 and 1 <= len(o.outputs[0].token_ids) <= 4
        assert o.outputs[0].text == smol_llm.tokenizer.decode(
            o.outputs[0].token_ids, skip_special_tokens=True)
        assert o.metrics.ttft is not None and o.metrics.ttft > 0


def test_token_id_prompts_and_n_samples(smol_llm):
    ids = smol_llm.tokenizer.encode("Tell me a joke.")
    out = smol_llm.generate([ids], SamplingParams(n=3, temperature=1.0, max_tokens=6, seed=3),
                            use_tqdm=False)[0]
    assert out.prompt is None and out.prompt_token_ids == ids
    assert [c.index for c in out.outputs] == [0, 1, 2]
    # sample i uses seed + i: it equals a lone request with that seed
    lone = smol_llm.generate([ids], SamplingParams(temperature=1.0, max_tokens=6, seed=4),
                             use_tqdm=False)[0]
    assert out.outputs[1].token_ids == lone.outputs[0].token_ids


def test_chat_batch_of_conversations(smol_llm):
    convs = [[{"role": "user", "content": "Name three rivers."}],
             [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]]
    outs = smol_llm.chat(convs, SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)
    assert len(outs) == 2
    assert outs[0].prompt.endswith("<|im_start|>assistant\n")
    assert "Be brief." in outs[1].prompt


@pytest.mark.parametrize("kwargs, message", [
    ({"max_tokens": 0}, "max_tokens must be an integer >= 1, got 0"),
    ({"temperature": -0.5}, "temperature must be >= 0, got -0.5"),
    ({"top_p": 0.0}, "top_p must be in (0, 1], got 0.0"),
    ({"top_p": 1.5}, "top_p must be in (0, 1], got 1.5"),
    ({"top_k": -3}, "top_k must be -1"),
    ({"n": 0}, "n must be an integer >= 1, got 0"),
    ({"logprobs": -1}, "logprobs must be None or an integer >= 0"),
    ({"stop": [""]}, "stop strings must be non-empty"),
])
def test_bad_sampling_params(kwargs, message):
    with pytest.raises(ValueError) as e:
        SamplingParams(**kwargs)
    assert message in str(e.value)


def test_bad_prompts(smol_llm):
    with pytest.raises(ValueError, match="the prompt is empty"):
        smol_llm.generate("", use_tqdm=False)
    with pytest.raises(ValueError, match=r"the prompt has 1500 tokens, but max_model_len is 1024"):
        smol_llm.generate([[5] * 1500], use_tqdm=False)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        smol_llm.generate([[5, 10**6]], use_tqdm=False)
    with pytest.raises(ValueError, match="2 SamplingParams for 1 prompts"):
        smol_llm.generate(["a"], [SamplingParams(), SamplingParams()], use_tqdm=False)
    assert not smol_llm.engine.has_unfinished_requests()     # nothing half-queued


def test_bad_chat_messages(smol_llm):
    with pytest.raises(ValueError, match="message 0 must be a dict with 'role' and 'content'"):
        smol_llm.chat([{"content": "no role"}], use_tqdm=False)
    with pytest.raises(ValueError, match="at least one conversation"):
        smol_llm.chat([], use_tqdm=False)


def test_request_that_can_never_fit_the_pool(smol):
    llm = smol(max_model_len=512, num_kv_blocks=4, block_size=16)
    with pytest.raises(ValueError, match=r"needs up to 105 tokens of KV cache \(7 blocks of 16\), "
                                         r"but the pool has only 4 blocks"):
        llm.generate([[5] * 100], SamplingParams(max_tokens=5), use_tqdm=False)


def test_bad_model_and_engine_arguments(tmp_path):
    with pytest.raises(FileNotFoundError, match="GGUF file not found"):
        LLM(str(tmp_path / "missing.gguf"))
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        LLM(str(tmp_path))
    with pytest.raises(FileNotFoundError, match="neither a .gguf file"):
        LLM("./not/a/model/anywhere")
    with pytest.raises(ValueError, match="unsupported architecture"):
        HfConfig.from_hf_dict({"architectures": ["GPT2LMHeadModel"]})
    with pytest.raises(ValueError, match="block_size must be a positive integer, got 0"):
        engine_config(block_size=0)
    with pytest.raises(ValueError, match="unknown dtype"):
        LLM(dtype="float8")
    with pytest.raises(ValueError, match="num_kv_blocks must be a positive integer, got 0"):
        engine_config(num_kv_blocks=0)
    with pytest.raises(ValueError, match="kv_cache_memory must be a positive integer"):
        engine_config(kv_cache_memory=-1)


def test_pool_size_settings(tiny_checkpoint):
    """num_kv_blocks, then kv_cache_memory, size the pool on any device and in both layouts
    (a contiguous "block" is a slab of max_model_len tokens); with neither, a CPU gets 1 GiB."""
    from minivllm.core.kv_cache import kv_bytes_per_token
    path, _ = tiny_checkpoint("llama")
    per_token = kv_bytes_per_token(LLM(str(path), max_model_len=64, num_kv_blocks=1)
                                   .engine.model_config.hf_config, torch.float32)
    cases = [(dict(num_kv_blocks=5), "paged", 5),
             (dict(num_kv_blocks=3), "contiguous", 3),
             (dict(kv_cache_memory=7 * 16 * per_token), "paged", 7),
             (dict(kv_cache_memory=2 * 64 * per_token + 1), "contiguous", 2),
             (dict(num_kv_blocks=4, kv_cache_memory=1 << 30), "paged", 4),
             ({}, "paged", (1 << 30) // (16 * per_token))]
    for kwargs, layout, blocks in cases:
        llm = LLM(str(path), max_model_len=64, device="cpu", kv_layout=layout, **kwargs)
        assert llm.engine.runner.num_blocks == blocks, (kwargs, layout)
        assert llm.engine.block_manager.num_blocks == blocks
    slabs = LLM(str(path), max_model_len=64, device="cpu", kv_layout="contiguous",
                num_kv_blocks=2)
    prompts = [[5, 6, 7]] * 5
    outs = slabs.generate(prompts, SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
    assert all(len(o.outputs[0].token_ids) == 4 for o in outs)
    assert slabs.engine.block_manager.num_free_blocks == 2   # every slab came back


def test_max_model_len_above_the_model(smol_path):
    with pytest.raises(ValueError, match="exceeds the model's max_position_embeddings"):
        LLM(str(smol_path), max_model_len=10**6)
