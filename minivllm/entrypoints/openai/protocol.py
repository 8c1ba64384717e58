"""The OpenAI API's request bodies as pydantic models, and what the server answers with
(vLLM twin: vllm/entrypoints/openai/protocol.py).

Strict types: JSON `"temperature": "1"` is a 400 naming `temperature`, not silently 1.0, and
unknown fields are refused by name (a typo such as `max_token` would otherwise be ignored and
the default used). Ranges are checked once, by SamplingParams, whose messages name the field.

Fields beyond OpenAI's are vLLM's extras with vLLM's names (top_k, ignore_eos, stop_token_ids,
skip_special_tokens, include_stop_str_in_output, repetition_penalty, min_tokens,
add_special_tokens, echo, stream_options.continuous_usage_stats, use_beam_search and
length_penalty (/v1/completions: minivllm/beam_search.py), and the guided_json /
guided_regex / guided_choice / guided_grammar constraints), and OpenAI's logit_bias.
`response_format` ({"type": "json_object"} or {"type": "json_schema", "json_schema":
{"schema": ...}}) becomes a guided-decoding constraint too
(minivllm/structured_output/manager.py).

OpenAI's parameters that mean nothing to a self-hosted server (user, service_tier, store,
metadata, reasoning_effort, parallel_tool_calls) are accepted and ignored, as vLLM does. What
this server does not do is refused by name with a 400 that says so (UNSUPPORTED), never
accepted and ignored: tools and function calling, min_p, best_of, suffix,
prompt_logprobs, echo with logprobs; any other unknown field is a 400 too (a typo).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from minivllm.beam_search import BeamSearchParams
from minivllm.outputs import CompletionOutput
from minivllm.sampling_params import MAX_LOGPROBS, GuidedDecodingParams, SamplingParams


@dataclass(frozen=True)
class RequestLimits:
    """Every field of a request that sizes work, bounded before anything proportional to it
    exists (n = 10**9 once built a billion child ids, and the OOM killer took the server):
    each request's sizes() say which limit holds each field; over it, a 400 that names the
    field, the limit and where it is set. Bounded elsewhere: the body (--max-request-body-mb,
    before parsing), a prompt's text (max_model_len times the longest token's characters,
    before tokenizing), max_tokens (with the prompt, against max_model_len, once tokenized:
    vLLM's message), a constraint's compile (--max-grammar-compile-seconds / -memory-mb), and
    the logprob entries an answer holds (max_logprob_entries, once prompts are tokenized)."""
    max_model_len: int                     # vLLM's: messages (a token each, at least)
    max_num_seqs: int                      # vLLM's: n, the samples or beams of one prompt
    max_prompts: int                       # prompts, and prompts x n, of one request
    max_logprobs: int = MAX_LOGPROBS       # vLLM's max_logprobs: logprobs, top_logprobs
    max_items: int = 1024                  # stop strings, stop_token_ids, logit_bias, parts
    max_stop_chars: int = 1024             # one stop string (a stream holds back that much)
    max_logprob_entries: int = 1_000_000   # prompts x n x max_tokens x (logprobs + 1)

    def check(self, sizes: list[tuple[str, int, str]]) -> None:
        """OpenAIError (400) for the first (field, size, limit) whose size is over it."""
        for field, size, name in sizes:
            if size > getattr(self, name):
                raise OpenAIError(400, f"{field}: {size:,} is over this server's limit of "
                                  f"{getattr(self, name):,} ({WHERE[name]})", field)


WHERE = {"max_model_len": "--max-model-len: each message is a token at least",
         "max_num_seqs": "--max-num-seqs", "max_logprobs": "vLLM's max_logprobs",
         "max_prompts": "--max-prompts-per-request, for prompts and for prompts x n",
         "max_items": "items, a fixed limit",
         "max_stop_chars": "characters in one stop string, a fixed limit",
         "max_logprob_entries": "prompts x n x max_tokens x (logprobs + 1) entries, a fixed "
                                "limit; lower max_tokens, n or logprobs"}


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(_Request):
    include_usage: bool = False
    continuous_usage_stats: bool = False     # vLLM's: usage in every chunk (guidellm sends it)


class JsonSchema(_Request):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)
    name: str = "schema"
    description: str | None = None
    json_schema: dict = Field(alias="schema")
    strict: bool | None = None


class ResponseFormat(_Request):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchema | None = None


class _SamplingFields(_Request):
    model: str | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None     # OpenAI's newer name (guidellm sends both)
    temperature: float = 1.0
    top_p: float = 1.0
    n: int = 1
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    logit_bias: dict[str, float] | None = None   # JSON keys are strings: token ids
    # OpenAI's, accepted and ignored: they mean nothing to a self-hosted server (as vLLM)
    user: str | None = None
    service_tier: str | None = None
    store: bool | None = None
    metadata: dict[str, str] | None = None
    reasoning_effort: str | None = None
    # Known, and refused by name (UNSUPPORTED) rather than as unknown or silently ignored
    min_p: float | None = None
    best_of: int | None = None
    prompt_logprobs: int | None = None
    # vLLM's extras
    top_k: int = -1
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_tokens: int = 0
    response_format: ResponseFormat | None = None
    guided_json: dict | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    add_special_tokens: bool = False          # vLLM's: the tokenizer's BOS/EOS around prompts

    def check_supported(self) -> None:
        """OpenAIError (400) for a field this server knows and does not do, or a combination
        OpenAI's API refuses."""
        for name, why in UNSUPPORTED.items():
            value = getattr(self, name, None)
            if value in (None, False, 0, []) or (name == "best_of" and value == self.n):
                continue                       # absent, or the value that changes nothing
            raise OpenAIError(400, f"{name} is not supported by this server ({why})", name)
        if None not in (self.max_tokens, self.max_completion_tokens) and (
                self.max_tokens != self.max_completion_tokens):
            raise OpenAIError(400, f"max_completion_tokens: {self.max_completion_tokens} "
                              f"differs from max_tokens {self.max_tokens}; give one, or both "
                              "equal", "max_completion_tokens")
        if self.stream_options is not None and not self.stream:
            raise OpenAIError(400, "stream_options: only allowed when stream is true",
                              "stream_options")

    def sizes(self) -> list[tuple[str, int, str]]:
        """(field, its size, the RequestLimits field that bounds it), for each sizing field."""
        stop = [self.stop] if isinstance(self.stop, str) else self.stop or []
        return [("n", self.n, "max_num_seqs"),        # max_tokens: with the prompt, later
                ("stop", len(stop), "max_items"),
                ("stop", max(map(len, stop), default=0), "max_stop_chars"),
                ("stop_token_ids", len(self.stop_token_ids or ()), "max_items"),
                ("logit_bias", len(self.logit_bias or ()), "max_items")]

    def guided_decoding(self) -> GuidedDecodingParams | None:
        """response_format or one guided_* field -> the constraint (ValueError if several)."""
        rf = self.response_format
        given = {k: v for k, v in [("json", self.guided_json), ("regex", self.guided_regex),
                                   ("choice", self.guided_choice),
                                   ("grammar", self.guided_grammar)] if v is not None}
        if rf is not None and rf.type == "json_object":
            given["json_object"] = True
        elif rf is not None and rf.type == "json_schema":
            if rf.json_schema is None:
                raise ValueError('response_format: type "json_schema" needs a "json_schema" '
                                 'object with the "schema"')
            given["json"] = rf.json_schema.json_schema
        if len(given) > 1:
            raise ValueError("guided_decoding: give one constraint of response_format, "
                             "guided_json, guided_regex, guided_choice, guided_grammar")
        return GuidedDecodingParams(**given) if given else None

    def sampling_params(self, max_tokens: int, logprobs: int | None) -> SamplingParams:
        """Raises TypeError/ValueError naming the field, like any SamplingParams."""
        return SamplingParams(
            n=self.n, temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
            max_tokens=max_tokens, stop=self.stop or [], stop_token_ids=self.stop_token_ids or [],
            seed=self.seed, logprobs=logprobs, ignore_eos=self.ignore_eos,
            skip_special_tokens=self.skip_special_tokens,
            include_stop_str_in_output=self.include_stop_str_in_output,
            presence_penalty=self.presence_penalty, frequency_penalty=self.frequency_penalty,
            repetition_penalty=self.repetition_penalty, min_tokens=self.min_tokens,
            guided_decoding=self.guided_decoding(), logit_bias=self.token_bias())

    def token_bias(self) -> dict[int, float] | None:
        """logit_bias with its keys as token ids (JSON's keys are strings)."""
        if self.logit_bias is None:
            return None
        try:
            return {int(t): b for t, b in self.logit_bias.items()}
        except ValueError:
            raise ValueError(f"logit_bias must be keyed by token ids, got "
                             f"{cut(repr(list(self.logit_bias)))}") from None

    @property
    def max_new_tokens(self) -> int | None:
        """max_completion_tokens or max_tokens (check_supported made sure they agree)."""
        return self.max_tokens if self.max_completion_tokens is None else (
            self.max_completion_tokens)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.continuous_usage_stats)


class CompletionRequest(_SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    echo: bool = False                       # the prompt's text before each completion
    suffix: str | None = None                # refused (UNSUPPORTED)
    use_beam_search: bool = False            # vLLM's: the n best of n beams
    length_penalty: float = 1.0              # ... their score: cum_logprob / length ** this

    def check_supported(self) -> None:
        super().check_supported()
        if self.echo and self.logprobs is not None:
            raise OpenAIError(400, "echo with logprobs is not supported by this server (it "
                              "needs the prompt's logprobs)", "echo")
        refused = self.model_fields_set & set(NOT_WITH_BEAMS) - (
            {"temperature"} if self.temperature == 0 else set())
        if self.use_beam_search and refused:
            raise OpenAIError(400, f"{min(refused)} does not apply to beam search "
                              "(use_beam_search: the n most likely beams; temperature may only "
                              "be 0)", min(refused))
        if "length_penalty" in self.model_fields_set and not self.use_beam_search:
            raise OpenAIError(400, "length_penalty applies only with use_beam_search",
                              "length_penalty")

    def sizes(self) -> list[tuple[str, int, str]]:
        prompts = len(self.prompts())
        return [*super().sizes(), ("prompt", prompts, "max_prompts"),
                ("n", prompts * self.n, "max_prompts"),
                ("logprobs", self.logprobs or 0, "max_logprobs")]

    def beam_search_params(self, max_tokens: int) -> BeamSearchParams:
        return BeamSearchParams(beam_width=self.n, max_tokens=max_tokens,
                                ignore_eos=self.ignore_eos, length_penalty=self.length_penalty)

    def prompts(self) -> list[str | list[int]]:
        p = self.prompt
        if isinstance(p, str) or (p and isinstance(p[0], int)):
            return [p]
        return list(p)


class ChatMessage(_Request):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict] | None = None
    name: str | None = None

    def text(self) -> str:
        """The content as one string (text parts of a multi-part content, joined)."""
        if isinstance(self.content, list):
            parts = []
            for i, part in enumerate(self.content):
                if part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise ValueError(f"content part {i} must be "
                                     f'{{"type": "text", "text": "..."}}, got {part!r}')
                parts.append(part["text"])
            return "".join(parts)
        return self.content or ""


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    add_generation_prompt: bool = True           # vLLM's extra
    parallel_tool_calls: bool | None = None      # accepted and ignored (no tools here)
    tools: list[dict] | None = None              # refused (UNSUPPORTED)
    tool_choice: str | dict | None = None        # refused unless "none"

    def check_supported(self) -> None:
        super().check_supported()
        if self.tool_choice not in (None, "none"):
            raise OpenAIError(400, f"tool_choice is not supported by this server "
                              f"({UNSUPPORTED['tools']})", "tool_choice")
        if self.top_logprobs is not None and not self.logprobs:
            raise OpenAIError(400, "top_logprobs: logprobs must be true when top_logprobs is "
                              "given", "top_logprobs")
        for i, m in enumerate(self.messages):
            if m.content is None and m.role != "assistant":
                raise OpenAIError(400, f"messages.{i}.content: a {m.role} message needs "
                                  "content", "messages")

    def sizes(self) -> list[tuple[str, int, str]]:
        parts = [len(m.content) for m in self.messages if isinstance(m.content, list)]
        return [*super().sizes(), ("top_logprobs", self.top_logprobs or 0, "max_logprobs"),
                ("messages", len(self.messages), "max_model_len"),
                ("messages", max(parts, default=0), "max_items")]

    def logprobs_k(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None


# What would change a sample but not the n most likely beams: refused with use_beam_search.
NOT_WITH_BEAMS = ("stream", "logprobs", "echo", "stop", "stop_token_ids", "top_p", "top_k",
                  "temperature", "presence_penalty", "frequency_penalty", "repetition_penalty",
                  "min_tokens", "logit_bias", "response_format", "guided_json", "guided_regex",
                  "guided_choice", "guided_grammar", "include_stop_str_in_output")

UNSUPPORTED = {
    "tools": "no tool or function calling",
    "min_p": "no min-p sampling; top_p and top_k are",
    "best_of": "n samples are returned, none dropped",
    "prompt_logprobs": "no logprobs of prompt tokens",
    "suffix": "no insertion",
}


def random_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


FIELDS = ("n", "temperature", "top_p", "top_k", "max_tokens", "stop", "stop_token_ids", "seed",
          "logprobs", "ignore_eos", "include_stop_str_in_output", "skip_special_tokens",
          "presence_penalty", "frequency_penalty", "repetition_penalty", "min_tokens",
          "guided_decoding", "response_format", "logit_bias")


class OpenAIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param


def cut(text: str, limit: int = 200) -> str:
    """An input echoed in an error, at most `limit` characters: a 100,000-entry field echoed
    whole made a 1.2 MB error body."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


def param_of(message: str, default: str | None = None) -> str | None:
    """The field an error message names first (SamplingParams' messages open with it)."""
    return next((f for f in sorted(FIELDS, key=len, reverse=True) if message.startswith(f)),
                default)


def error_body(status: int, message: str, param: str | None = None) -> dict:
    """OpenAI's error shape; `type` with vLLM's names."""
    kind = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError",
            405: "MethodNotAllowedError", 413: "RequestEntityTooLargeError",
            499: "ClientClosedRequest", 503: "ServiceUnavailableError"}.get(
                status, "InternalServerError")
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


# ---------------------------------------------------------------- logprobs, OpenAI's two shapes
def _top(entry: dict[int, float], k: int) -> list[tuple[int, float]]:
    """The k most likely of a logprob entry (top-k plus the chosen token, which may be extra)."""
    return sorted(entry.items(), key=lambda kv: -kv[1])[:k]


def completion_logprobs(c: CompletionOutput, start: int, k: int, decode,
                        text_offset: int) -> dict:
    """Legacy completions shape: parallel lists, top_logprobs as {token text: logprob}."""
    tokens = []
    token_lps = []
    tops = []
    offsets = []
    for tid, entry in zip(c.token_ids[start:], c.logprobs[start:]):
        tokens.append(decode(tid))
        token_lps.append(entry[tid])
        tops.append({decode(t): lp for t, lp in _top(entry, k)})
        offsets.append(text_offset)
        text_offset += len(tokens[-1])
    return {"tokens": tokens, "token_logprobs": token_lps, "top_logprobs": tops,
            "text_offset": offsets}


def chat_logprobs(c: CompletionOutput, start: int, k: int, decode) -> dict:
    """Chat shape: one object per token, with bytes, and its top alternatives."""
    def item(tid: int, lp: float) -> dict:
        text = decode(tid)
        return {"token": text, "logprob": lp, "bytes": list(text.encode())}
    return {"content": [{**item(tid, entry[tid]),
                         "top_logprobs": [item(t, lp) for t, lp in _top(entry, k)]}
                        for tid, entry in zip(c.token_ids[start:], c.logprobs[start:])]}
