"""Speculative decoding (vLLM twin: vllm/config/speculative.py)."""

from __future__ import annotations

from dataclasses import dataclass

from minivllm.config.utils import check_keys

SPECULATIVE_METHODS = ("ngram", "draft_model")


@dataclass(slots=True, frozen=True)
class SpeculativeConfig:
    """Speculative decoding (minivllm/spec_decode/decoder.py), from vLLM's `speculative_config`
    dict.

    method "ngram": prompt lookup, no extra model. "draft_model": a smaller model sharing the
    target's vocabulary, named by `model` (a checkpoint path, as for the target), guesses
    greedily over its own KV cache; `quantization` quantizes its weights (a quantized copy of
    the target is a draft that agrees with it often). Only the keys below exist.
    """

    num_speculative_tokens: int           # k: draft tokens proposed, then verified, per step
    method: str = "ngram"
    model: str | None = None              # the draft model's checkpoint ("draft_model" only)
    quantization: str | None = None       # ... and its weights' format, as LLM(quantization=)
    prompt_lookup_max: int = 4            # n-gram: longest suffix to look up in the sequence
    prompt_lookup_min: int = 1            # ... and the shortest

    @classmethod
    def from_dict(cls, d: dict) -> SpeculativeConfig:
        d = dict(check_keys(cls, "speculative_config", d, "num_speculative_tokens", " (k >= 1)"))
        if d.get("model") is not None:
            if d.get("method", "draft_model") != "draft_model":
                raise ValueError(f"speculative_config names both method={d['method']!r} and "
                                 f"model={d['model']!r}: the n-gram proposer needs no model; "
                                 "give one or the other")
            d["method"] = "draft_model"
        return cls(**d)

    def __post_init__(self):
        k = self.num_speculative_tokens
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise ValueError(f"speculative_config: num_speculative_tokens must be an integer "
                             f">= 1, got {k!r}")
        if self.method not in SPECULATIVE_METHODS:
            raise ValueError(f"speculative_config: unknown method {self.method!r}; minivllm "
                             f"has {list(SPECULATIVE_METHODS)}")
        if (self.method == "draft_model") != (self.model is not None):
            raise ValueError("speculative_config: method 'draft_model' needs a model (a "
                             "checkpoint sharing the target's vocabulary), and only it does")
        lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
        if not all(isinstance(n, int) and n >= 1 for n in (lo, hi)) or lo > hi:
            raise ValueError(f"speculative_config: need 1 <= prompt_lookup_min <= "
                             f"prompt_lookup_max, got {lo} and {hi}")
