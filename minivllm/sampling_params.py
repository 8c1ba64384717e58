"""SamplingParams: how one request wants its tokens chosen, with vLLM's field names.

Every value is checked in __post_init__, so a bad request fails when it is made, with a message
that names the field, the limit and the value, never deep inside a forward pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class SamplingParams:
    n: int = 1                          # independent samples per prompt
    temperature: float = 1.0            # 0 means greedy
    top_p: float = 1.0                  # keep the smallest set of tokens with this much mass
    top_k: int = -1                     # keep the k most likely tokens; -1 (or 0) keeps all
    max_tokens: int = 16                # new tokens, at most
    stop: list[str] = field(default_factory=list)           # cut the text before these
    stop_token_ids: list[int] = field(default_factory=list)  # finish on these tokens
    seed: int | None = None             # per-request RNG: same seed, same tokens
    logprobs: int | None = None         # return this many top logprobs per token (+ the chosen)
    ignore_eos: bool = False            # keep going past EOS (benchmarks)
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True

    def __post_init__(self):
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop)
        self.stop_token_ids = list(self.stop_token_ids)
        if not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"n must be an integer >= 1, got {self.n!r}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not isinstance(self.top_k, int) or self.top_k < -1:
            raise ValueError(f"top_k must be -1 (disabled), 0 (disabled) or >= 1, got {self.top_k!r}")
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if self.logprobs is not None and (not isinstance(self.logprobs, int) or self.logprobs < 0):
            raise ValueError(f"logprobs must be None or an integer >= 0, got {self.logprobs!r}")
        if any(not s for s in self.stop):
            raise ValueError("stop strings must be non-empty")
        if self.n > 1 and self.temperature == 0:
            raise ValueError(f"n={self.n} samples with temperature=0 would be {self.n} copies of "
                             "the same greedy output; use temperature > 0")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1
