"""Guided decoding (structured output): a grammar decides which tokens may come next (vLLM
twin: vllm/v1/structured_output/__init__.py, StructuredOutputManager, and backend_xgrammar.py).

A constraint (GuidedDecodingParams: a JSON schema, a regex, a list of choices, an EBNF grammar,
or "any JSON object") is compiled by xgrammar, vLLM's default backend, into a pushdown
automaton over the model's vocabulary. Compiling costs milliseconds to a fraction of a second
(it precomputes, per grammar state, which of the 49,152 tokens can follow), so each constraint
is compiled once, when the first request that names it arrives, and cached by its text.

Each guided sequence then owns a GrammarMatcher, the automaton's current state. Every step:

    1. the matcher catches up with the tokens its sequence gained since the last step
       (accept_token: normally one; after speculation or a fork, what is there)
    2. it fills one row of a bitmask, one bit per vocabulary token (49,152 bits = 1,536 int32
       words): 1 = allowed next
    3. xgrammar applies the whole batch's bitmask to the logits in one call: 0 bits -> -inf

The matcher lives here by sequence id and reads the sequence's own tokens, which preemption
never changes: a sequence recomputed or swapped out and back finds its matcher where it left
it, and prefix caching and chunked prefill (which touch only the KV cache) cannot disturb it.
A forked sample (n > 1) gets its own matcher, which catches up from the fork's tokens.

Speculative decoding is refused with guided decoding (and with the other logits processors):
its draft tokens are verified against the unprocessed distribution, so a draft could break the
grammar; supporting it needs matcher rollback (xgrammar has one) and masks for the draft rows.

Compiling can take long: 20,000 guided choices took 40 s on a 2-core CPU. The server compiles
off the engine thread (AsyncLLMEngine hands `compile` to a worker thread; xgrammar releases
the GIL while it works), and the request waits in that "grammar pending" state while the other
requests keep stepping, as vLLM's StructuredOutputManager does with its thread pool. A request
keeps its own grammar (Request.grammar) for its life, so the cache can be bounded: past
`cache_limit_bytes` (xgrammar's own size estimate), the least recently used grammars go.

Left out, compared with vLLM: jump-forward decoding, the outlines / llguidance /
lm-format-enforcer backends, structural tags (tool calling), reasoning-parser hand-off.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import OrderedDict

import torch

from minivllm.config import PER_REQUEST, incompatibility
from minivllm.sampling_params import GuidedDecodingParams, SamplingParams
from minivllm.core.request import Request


def _reason(error: Exception) -> str:
    """xgrammar's message without its C++ source location prefix."""
    return re.sub(r"^\[[\d:]+\] \S+:\d+: (Check failed: .*? is false: )?", "",
                  str(error)).strip()


def choice_grammar(choices: list[str]) -> str:
    """An EBNF grammar whose only sentences are the choices (vLLM builds the same)."""
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


_NAMES = {"json": "JSON schema", "regex": "regex", "grammar": "grammar"}


class StructuredOutputManager:
    """vLLM's name: compiles and caches grammars, holds each guided sequence's matcher, and
    applies the step's bitmask. Importing xgrammar takes seconds, so it happens on the first
    guided request, not at engine start."""

    def __init__(self, tokenizer, vocab_size: int, eos_token_ids: set[int],
                 cache_limit_bytes: int = 256 << 20):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_token_ids = sorted(eos_token_ids)
        self.compiler = None
        self.cache_limit_bytes = cache_limit_bytes
        self.grammars: OrderedDict[tuple, object] = OrderedDict()  # key -> CompiledGrammar, LRU
        self._lock = threading.Lock()         # compile() runs on worker threads too
        self.matchers: dict[int, list] = {}              # seq_id -> [matcher, tokens fed]
        self.num_compiled = 0                           # grammars compiled (cache misses)
        self.compile_seconds = 0.0
        self.mask_seconds = 0.0                          # fill + apply, summed over steps
        self.num_masked_rows = 0

    def load(self):
        """Import xgrammar and prepare the vocabulary for it (once per engine); -> xgrammar."""
        import xgrammar as xgr
        with self._lock:
            if self.compiler is None:     # xgrammar's own cache off: ours is the bounded one
                self.tokenizer_info = xgr.TokenizerInfo.from_huggingface(
                    self.tokenizer, vocab_size=self.vocab_size,
                    stop_token_ids=self.eos_token_ids)
                self.compiler = xgr.GrammarCompiler(self.tokenizer_info, max_threads=2,
                                                    cache_enabled=False)
        return xgr

    def deserialize(self, data: str):
        """A grammar the front end compiled, from its serialize_json(): a CompiledGrammar does
        not pickle, and loading its JSON (~1-10 ms) spares the core process the compile."""
        xgr = self.load()
        return xgr.CompiledGrammar.deserialize_json(data, self.tokenizer_info)

    @staticmethod
    def key(g: GuidedDecodingParams) -> tuple:
        """The cache key: (kind, the constraint as text, whitespace rule). Not sort_keys: a
        schema's property order is the order the output must follow."""
        value = getattr(g, g.kind)
        text = json.dumps(value) if isinstance(value, (dict, list)) else str(value)
        return g.kind, text, g.disable_any_whitespace

    def compile(self, g: GuidedDecodingParams):
        """The CompiledGrammar for g, from the cache or compiled now; ValueError with xgrammar's
        reason if the schema, regex or grammar is invalid."""
        key = self.key(g)
        with self._lock:
            if key in self.grammars:
                self.grammars.move_to_end(key)
                return self.grammars[key]
        self.load()
        t0 = time.perf_counter()
        kind, text, strict_ws = key
        try:
            if kind == "json":
                grammar = self.compiler.compile_json_schema(text, any_whitespace=not strict_ws)
            elif kind == "json_object":
                grammar = self.compiler.compile_builtin_json_grammar()
            elif kind == "regex":
                grammar = self.compiler.compile_regex(text)
            elif kind == "choice":
                grammar = self.compiler.compile_grammar(choice_grammar(g.choice))
            else:
                grammar = self.compiler.compile_grammar(text)
        except Exception as e:   # noqa: BLE001 (RuntimeError mostly; a few of xgrammar's own)
            raise ValueError(f"guided_decoding: invalid {_NAMES.get(kind, kind)}: "
                             f"{_reason(e)}") from None
        self._check_admits_output(grammar, kind)
        with self._lock:
            self.compile_seconds += time.perf_counter() - t0
            self.num_compiled += 1
            self.grammars[key] = grammar
            while self.cache_bytes > self.cache_limit_bytes:   # oldest first, maybe this one
                self.grammars.popitem(last=False)
        return grammar

    def _check_admits_output(self, grammar, kind: str) -> None:
        """Refuse a constraint that compiles but allows no first token (a schema that only
        refers to itself, such as {"$ref": "#"}): served, it would fail at its first step."""
        import xgrammar as xgr
        matcher = xgr.GrammarMatcher(grammar)
        bitmask = xgr.allocate_token_bitmask(1, self.vocab_size)
        matcher.fill_next_token_bitmask(bitmask)
        if not bitmask.any() and not matcher.is_terminated():
            raise ValueError(f"guided_decoding: the {_NAMES.get(kind, kind)} admits no output: "
                             "no token can start it (a schema or rule that only refers to "
                             "itself, or a character class that matches nothing)")

    @property
    def cache_bytes(self) -> int:
        return sum(g.memory_size_bytes for g in self.grammars.values())

    def check(self, params: SamplingParams, speculative: bool, grammar=None):
        """At add_request: refuse what this engine cannot do; return the request's compiled
        constraint (`grammar` if it was compiled already, off this thread), or None."""
        if speculative and (params.guided_decoding or params.has_penalties or params.min_tokens
                            or params.logit_bias):    # the one per-request row of the table
            raise ValueError(incompatibility(PER_REQUEST, "speculative_config"))
        if params.guided_decoding is None or grammar is not None:
            return grammar
        return self.compile(params.guided_decoding)

    def matcher(self, seq: Request):
        """seq's GrammarMatcher, fed every output token it has not seen yet."""
        entry = self.matchers.get(seq.seq_id)
        if entry is None:
            import xgrammar as xgr
            grammar = seq.grammar or self.compile(seq.sampling_params.guided_decoding)
            entry = self.matchers[seq.seq_id] = [xgr.GrammarMatcher(grammar), 0]
        matcher, fed = entry
        for token in seq.output_token_ids[fed:]:
            if not matcher.accept_token(token):
                kind = seq.sampling_params.guided_decoding.kind
                raise ValueError(f"token {token} breaks the {kind} constraint")
        entry[1] = seq.num_output_tokens
        return matcher

    def apply_bitmask(self, logits: torch.Tensor, seqs: list[Request]) -> None:
        """In place: every guided row's disallowed tokens -> -inf. One bitmask for the batch,
        (B, ceil(V / 32)) int32, filled row by row by the matchers, applied in one call."""
        rows = [i for i, s in enumerate(seqs) if s.sampling_params.guided_decoding is not None]
        if not rows:
            return
        import xgrammar as xgr
        t0 = time.perf_counter()
        bitmask = xgr.allocate_token_bitmask(len(seqs), self.vocab_size)  # all bits 1
        for i in rows:
            self.matcher(seqs[i]).fill_next_token_bitmask(bitmask, i)
        xgr.apply_token_bitmask_inplace(logits, bitmask.to(logits.device, non_blocking=True),
                                        vocab_size=self.vocab_size, indices=rows)
        self.mask_seconds += time.perf_counter() - t0
        self.num_masked_rows += len(rows)

    def free(self, seq: Request) -> None:
        self.matchers.pop(seq.seq_id, None)
