"""Requests in: everything a request can get wrong, checked before it is queued (vLLM twin:
vllm/v1/engine/processor.py, Processor). A bad request must fail here, alone, with a message
that says what to change, never inside a step that other requests share.

Left out, compared with vLLM: multi-modal inputs, tokenizing in the front-end process, and
turning the request into the engine core's wire format.
"""

from __future__ import annotations

from minivllm.core.block_manager import cdiv
from minivllm.config import VllmConfig
from minivllm.sampling_params import MAX_LOGPROBS, SamplingParams


def validate_request(token_ids: list[int], params: SamplingParams, vllm_config: VllmConfig,
                     block_manager) -> None:
    max_len = vllm_config.model_config.max_model_len
    vocab = vllm_config.model_config.hf_config.vocab_size
    max_num_seqs = vllm_config.scheduler_config.max_num_seqs
    if not isinstance(params, SamplingParams):
        raise TypeError(f"params must be a SamplingParams, got {type(params).__name__}")
    if not token_ids:
        raise ValueError("the prompt is empty: give at least one token")
    if params.n > 1 and vllm_config.cache_config.kv_layout != "paged":
        raise ValueError("parallel sampling (n > 1) shares the prompt's KV blocks, which "
                         "needs kv_layout='paged'; the contiguous baseline cannot share")
    if params.n > max_num_seqs:
        raise ValueError(f"n={params.n} samples exceed max_num_seqs ({max_num_seqs})")
    if len(token_ids) >= max_len:
        raise ValueError(f"the prompt has {len(token_ids)} tokens, but max_model_len is "
                         f"{max_len}: prompt + at least one new token must fit")
    if params.top_k > vocab:
        raise ValueError(f"top_k must be -1 (disabled) or at most the vocabulary size "
                         f"({vocab}), got {params.top_k}")
    bad = [t for t in token_ids if not 0 <= t < vocab]
    if bad:
        raise ValueError(f"token id {bad[0]} is outside the vocabulary (size {vocab})")
    bad = [t for t in params.logit_bias or () if not t < vocab]
    if bad:
        raise ValueError(f"logit_bias: {bad[0]} is outside the vocabulary (size {vocab})")
    bad = [t for t in params.stop_token_ids if not 0 <= t < vocab]
    if bad:
        raise ValueError(f"stop_token_ids: {bad[0]} is outside the vocabulary (size {vocab})")
    if params.logprobs is not None and params.logprobs > min(MAX_LOGPROBS, vocab):
        raise ValueError(f"logprobs={params.logprobs} is more than the engine returns "
                         f"(at most {min(MAX_LOGPROBS, vocab)})")
    # The request alone, at its longest, must fit the KV pool, or it could never finish.
    longest = min(len(token_ids) + params.max_tokens, max_len)
    need = cdiv(longest, block_manager.block_size)
    if need > block_manager.num_blocks:
        raise ValueError(
            f"the request needs up to {longest} tokens of KV cache ({need} blocks of "
            f"{block_manager.block_size}), but the pool has only {block_manager.num_blocks} "
            "blocks; lower max_tokens or give the engine more KV memory")


def encode_prompt(tokenizer, text: str, add_special_tokens: bool = False) -> list[int]:
    """text -> token ids, or a ValueError that says why not (a lone UTF-16 surrogate such as
    "\\ud800", valid JSON but not encodable, made the tokenizer raise a bare TypeError).
    add_special_tokens: the tokenizer's own BOS/EOS around the text (the server's option)."""
    try:
        return tokenizer.encode(text, add_special_tokens=add_special_tokens)
    except Exception as e:     # noqa: BLE001 -- whatever the tokenizer raises, the input's fault
        bad = next((f" (a lone surrogate at character {i})" for i, c in enumerate(text)
                    if 0xD800 <= ord(c) <= 0xDFFF), "")
        raise ValueError(f"prompt: the tokenizer cannot encode it{bad}: {e}") from None
