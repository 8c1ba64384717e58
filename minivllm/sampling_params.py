"""SamplingParams: how one request wants its tokens chosen, with vLLM's field names (vLLM
twin: vllm/sampling_params.py).

Every value is checked in __post_init__, so a bad request fails when it is made, with a message
that names the field, the limit and the value, never deep inside a forward pass. Types are
checked too, because requests arrive as JSON: `temperature="1"` is a TypeError that says so
(not a bare `'<' not supported` from a comparison), `max_tokens=True` is refused (a bool is an
int to Python, never to a user), and NaN or infinity never reach the sampler, where NaN passes
every `<` test and poisons a softmax.

What is left to the engine (it needs the model): token ids within the vocabulary, and whether
a guided-decoding constraint compiles (minivllm/structured_output/manager.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from numbers import Integral, Real

MAX_LOGPROBS = 20    # vLLM's default max_logprobs: top-k over the vocabulary costs per token
# vLLM's _SAMPLING_EPS: a temperature below it is greedy. Dividing float32 logits by 1e-300
# (0.0 in float32) gives inf/NaN, and a NaN row's "sample" was token 0, every time.
SAMPLING_EPS = 1e-5
GUIDED_KINDS = ("json", "regex", "choice", "grammar", "json_object")


def _int(name: str, value, lo: int | None = None, hi: int | None = None,
         allowed: str | None = None) -> int:
    """value as an int, or a TypeError/ValueError naming the field, the limit and the value."""
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise TypeError(f"{name} must be an integer, got {value!r} ({type(value).__name__})")
    value = int(value)
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise ValueError(f"{name} must be {allowed}, got {value}")
    return value


def _float(name: str, value) -> float:
    """value as a finite float, or an error naming the field (bools and strings refused)."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{name} must be a number, got {value!r} ({type(value).__name__})")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value}")
    return value


def _bool(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be true or false, got {value!r} ({type(value).__name__})")
    return value


@dataclass(slots=True)
class GuidedDecodingParams:
    """One output constraint (vLLM's shape; set exactly one): `json` a JSON schema (dict or
    string), `regex` a regular expression, `choice` a list of strings, `grammar` an EBNF
    grammar (GBNF, `root ::= ...`), `json_object=True` any JSON object. minivllm/structured_output/manager.py
    compiles it with xgrammar, the one backend here."""
    json: dict | str | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    backend: str | None = None             # None or "xgrammar"
    disable_any_whitespace: bool = False   # JSON: no free whitespace between tokens

    def __post_init__(self):
        given = [k for k in GUIDED_KINDS if getattr(self, k) not in (None, False)]
        if len(given) != 1:
            raise ValueError(f"guided_decoding needs exactly one of {', '.join(GUIDED_KINDS)}; "
                             f"got {given or 'none'}")
        if self.json is not None and not isinstance(self.json, (dict, str)):
            raise TypeError(f"guided_decoding.json must be a JSON schema (dict or string), got "
                            f"{type(self.json).__name__}")
        for name in ("regex", "grammar"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), str):
                raise TypeError(f"guided_decoding.{name} must be a string")
        if self.choice is not None and (not isinstance(self.choice, (list, tuple))
                                        or not self.choice
                                        or not all(isinstance(c, str) and c for c in self.choice)):
            raise ValueError(f"guided_decoding.choice must be a non-empty list of non-empty "
                             f"strings, got {self.choice!r}")
        if self.backend not in (None, "xgrammar"):
            raise ValueError(f"guided_decoding.backend: only 'xgrammar' is available, got "
                             f"{self.backend!r}")
        _bool("guided_decoding.disable_any_whitespace", self.disable_any_whitespace)

    @property
    def kind(self) -> str:
        return next(k for k in GUIDED_KINDS if getattr(self, k) not in (None, False))


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
    # Logits processors (minivllm/sample/logits_processor.py, minivllm/structured_output/manager.py), vLLM's names.
    presence_penalty: float = 0.0       # minus this from every token already in the output
    frequency_penalty: float = 0.0      # minus this times how often it is in the output
    repetition_penalty: float = 1.0     # prompt or output tokens: logit / p if > 0, else * p
    min_tokens: int = 0                 # no EOS or stop token before this many new tokens
    guided_decoding: GuidedDecodingParams | None = None   # structured output
    logit_bias: dict[int, float] | None = None   # token id -> added to its logit (OpenAI's)

    def __post_init__(self):
        self.n = _int("n", self.n, lo=1, allowed="an integer >= 1")
        self.temperature = _float("temperature", self.temperature)
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.temperature < SAMPLING_EPS:
            self.temperature = 0.0                     # greedy, as vLLM treats it
        self.top_p = _float("top_p", self.top_p)
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        self.top_k = _int("top_k", self.top_k, lo=-1,
                          allowed="-1 (disabled), 0 (disabled) or >= 1")
        self.max_tokens = _int("max_tokens", self.max_tokens, lo=1,
                               allowed="an integer >= 1")
        if self.seed is not None:
            self.seed = _int("seed", self.seed)
        if self.logprobs is not None:
            self.logprobs = _int("logprobs", self.logprobs, lo=0, hi=MAX_LOGPROBS,
                                 allowed=f"None or an integer >= 0 and <= {MAX_LOGPROBS} "
                                         "(max_logprobs)")
        for name in ("ignore_eos", "include_stop_str_in_output", "skip_special_tokens"):
            _bool(name, getattr(self, name))
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if not isinstance(self.stop, (list, tuple)):
            raise TypeError(f"stop must be a string or a list of strings, got {self.stop!r}")
        self.stop = list(self.stop)
        for s in self.stop:
            if not isinstance(s, str):
                raise TypeError(f"stop must be a string or a list of strings, got an item "
                                f"{s!r} ({type(s).__name__})")
        if any(not s for s in self.stop):
            raise ValueError("stop strings must be non-empty")
        if not isinstance(self.stop_token_ids, (list, tuple)):
            raise TypeError(f"stop_token_ids must be a list of integers, got "
                            f"{self.stop_token_ids!r}")
        self.stop_token_ids = [_int("stop_token_ids", t, lo=0, allowed="token ids >= 0")
                               for t in self.stop_token_ids]
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict):
                raise TypeError(f"logit_bias must be a map of token id to bias, got "
                                f"{self.logit_bias!r}")
            self.logit_bias = {_int("logit_bias", t, lo=0, allowed="keyed by token ids >= 0"):
                               _float("logit_bias", b) for t, b in self.logit_bias.items()}
            bad = [b for b in self.logit_bias.values() if not -100 <= b <= 100]
            if bad:
                raise ValueError(f"logit_bias values must be in [-100, 100], got {bad[0]}")
        for name in ("presence_penalty", "frequency_penalty"):
            setattr(self, name, _float(name, getattr(self, name)))
            if not -2 <= getattr(self, name) <= 2:
                raise ValueError(f"{name} must be in [-2, 2], got {getattr(self, name)}")
        self.repetition_penalty = _float("repetition_penalty", self.repetition_penalty)
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        self.min_tokens = _int("min_tokens", self.min_tokens, lo=0, hi=self.max_tokens,
                               allowed=f"in [0, max_tokens={self.max_tokens}]")
        if isinstance(self.guided_decoding, dict):
            self.guided_decoding = GuidedDecodingParams(**self.guided_decoding)
        if not isinstance(self.guided_decoding, (GuidedDecodingParams, type(None))):
            raise TypeError(f"guided_decoding must be a GuidedDecodingParams, got "
                            f"{type(self.guided_decoding).__name__}")

    @property
    def has_penalties(self) -> bool:
        return (self.presence_penalty != 0 or self.frequency_penalty != 0
                or self.repetition_penalty != 1)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1
