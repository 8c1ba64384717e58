"""Guided decoding (structured output): a grammar decides which tokens may come next (vLLM
twin: vllm/v1/structured_output/__init__.py, StructuredOutputManager, and backend_xgrammar.py).

A constraint (GuidedDecodingParams: a JSON schema, a regex, a list of choices, an EBNF grammar,
or "any JSON object") is compiled by xgrammar, vLLM's default backend, into a pushdown
automaton over the model's vocabulary. Compiling costs milliseconds to a fraction of a second
(it precomputes, per grammar state, which of the 49,152 tokens can follow), so each constraint
is compiled once, when the first request that names it arrives, and cached by its text.

Each guided request then owns a GrammarMatcher, the automaton's current state. The core, not
the worker, keeps it (on the core's Request), as vLLM V1 does. Every step:

    1. the core's matcher of each guided request that samples catches up with the tokens the
       request gained since the last step (accept_token: normally one; after a fork, what is
       there)
    2. it fills one row of the step's bitmask, one bit per vocabulary token (49,152 bits =
       1,536 int32 words): 1 = allowed next
    3. the bitmask travels with the SchedulerOutput (`grammar_bitmask`) and the worker's
       logits processors (sample/logits_processor.py) turn its 0 bits into -inf: the worker
       needs no grammar, no matcher, no xgrammar

The matcher reads the request's own tokens, which preemption never changes: a request
recomputed or swapped out and back finds its matcher where it left it, and prefix caching and
chunked prefill (which touch only the KV cache) cannot disturb it. A forked sample (n > 1) is
a request of its own and gets its own matcher, which catches up from the fork's tokens.

Speculative decoding is refused with guided decoding (and with the other logits processors):
its draft tokens are verified against the unprocessed distribution, so a draft could break the
grammar; supporting it needs matcher rollback (xgrammar has one) and masks for the draft rows.

Compiling can take long: 20,000 guided choices took 40 s on a 2-core CPU, and a schema of
two thousand required properties grew a server to 22 GB before the OOM killer took it. The
server compiles off the engine thread and out of its process: AsyncLLMEngine hands `compile`,
with the server's compile_limits, to a worker thread, which waits on a child process bounded
in CPU time and memory (sandbox.py) while the request is "grammar pending" and the other
requests keep stepping (vLLM's StructuredOutputManager uses a thread pool, unbounded). For a
core in another process the grammar stays xgrammar's JSON, sent once per grammar and loaded
off the core's loop (transfer.py). A request
keeps its own grammar (Request.grammar) for its life, so the cache can be bounded: past
`cache_limit_bytes` (xgrammar's own size estimate), the least recently used grammars go.

Left out, compared with vLLM: jump-forward decoding, the outlines / llguidance /
lm-format-enforcer backends, structural tags (tool calling), reasoning-parser hand-off.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections import OrderedDict

from minivllm.config import PER_REQUEST, incompatibility
from minivllm.sampling_params import GuidedDecodingParams, SamplingParams
from minivllm.structured_output.compiler import compile_constraint, make_compiler
from minivllm.structured_output.transfer import SerializedGrammar


class StructuredOutputManager:
    """vLLM's name: compiles and caches grammars, and fills the step's bitmask from each
    guided request's matcher. Importing xgrammar takes seconds, so it happens on the first
    guided request, not at engine start."""

    def __init__(self, tokenizer, vocab_size: int, eos_token_ids: set[int],
                 cache_limit_bytes: int = 256 << 20):
        self.tokenizer = tokenizer
        self.tokenizer_info = None
        self.vocab_size = vocab_size
        self.eos_token_ids = sorted(eos_token_ids)
        self.compiler = None
        self.cache_limit_bytes = cache_limit_bytes
        self.grammars: OrderedDict[tuple, object] = OrderedDict()  # key -> CompiledGrammar, LRU
        self._lock = threading.Lock()         # compile() runs on worker threads too
        self.sandboxes: dict[tuple[float, int], object] = {}      # limits -> GrammarSandbox
        self.compile_limits = (30.0, 2048)     # the server's: CPU seconds, MiB (its flags)
        self.num_compiled = 0                           # grammars compiled (cache misses)
        self.compile_seconds = 0.0
        self.mask_seconds = 0.0                          # fill + apply, summed over steps
        self.num_masked_rows = 0

    def load(self):
        """Import xgrammar and prepare the vocabulary for it (once per engine); -> xgrammar."""
        import xgrammar as xgr
        with self._lock:
            if self.compiler is None:
                if self.tokenizer_info is None:
                    self.tokenizer_info = xgr.TokenizerInfo.from_huggingface(
                        self.tokenizer, vocab_size=self.vocab_size,
                        stop_token_ids=self.eos_token_ids)
                self.compiler = make_compiler(self.tokenizer_info, max_threads=2)
        return xgr

    def sandbox(self, timeout_s: float, memory_mb: int):
        """The GrammarSandbox for these limits (one child process each, kept for the engine's
        life): compile() in it, bounded in CPU time and memory."""
        from minivllm.structured_output.sandbox import GrammarSandbox
        self.load()
        with self._lock:
            if (timeout_s, memory_mb) not in self.sandboxes:
                self.sandboxes[timeout_s, memory_mb] = GrammarSandbox(
                    self.tokenizer_info.serialize_json(), timeout_s, memory_mb)
            return self.sandboxes[timeout_s, memory_mb]

    def deserialize(self, data: str):
        """A grammar the front end compiled, from its serialize_json(): a CompiledGrammar does
        not pickle, and loading its JSON (~0.5 s for 23 MB) spares the core the compile."""
        xgr = self.load()
        return xgr.CompiledGrammar.deserialize_json(data, self.tokenizer_info)

    @staticmethod
    def key(g: GuidedDecodingParams) -> tuple:
        """The cache key: (kind, the constraint as text, whitespace rule). Not sort_keys: a
        schema's property order is the order the output must follow."""
        value = getattr(g, g.kind)
        text = json.dumps(value) if isinstance(value, (dict, list)) else str(value)
        return g.kind, text, g.disable_any_whitespace

    def compile(self, g: GuidedDecodingParams, limits: tuple[float, int] | None = None,
                serialized: bool = False):
        """The compiled constraint, from the cache or compiled now: a CompiledGrammar, or with
        `serialized` a SerializedGrammar (for a core in another process). `limits` (CPU
        seconds, MiB): compiled in a child process bounded by them (sandbox.py). A
        ValueError with xgrammar's reason if the schema, regex or grammar is invalid, or the
        limit it went over."""
        key = (*self.key(g), serialized)
        with self._lock:
            if key in self.grammars:
                self.grammars.move_to_end(key)
                return self.grammars[key]
        t0 = time.perf_counter()
        kind, text, strict_ws = key[:3]
        if limits is not None:
            data = self.sandbox(*limits).compile(kind, text, not strict_ws)
            grammar = None if serialized else self.deserialize(data)
        else:
            grammar = self.compile_text(kind, text, not strict_ws)
            data = grammar.serialize_json() if serialized else None
        if serialized:
            grammar = SerializedGrammar(hashlib.sha256(repr(key).encode()).hexdigest(), data)
        with self._lock:
            self.compile_seconds += time.perf_counter() - t0
            self.num_compiled += 1
            self.grammars[key] = grammar
            while self.cache_bytes > self.cache_limit_bytes:   # oldest first, maybe this one
                self.grammars.popitem(last=False)
        return grammar

    def compile_text(self, kind: str, text: str, any_whitespace: bool = True):
        """Compile one constraint here, uncached: a CompiledGrammar, or a ValueError."""
        self.load()
        return compile_constraint(self.compiler, self.vocab_size, kind, text, any_whitespace)

    @property
    def cache_bytes(self) -> int:
        return sum(len(g.json or "") if isinstance(g, SerializedGrammar) else
                   g.memory_size_bytes for g in self.grammars.values())

    def check(self, params: SamplingParams, speculative: bool, grammar=None,
              serialized: bool = False):
        """At add_request: refuse what this engine cannot do; return the request's compiled
        constraint (`grammar` if it was compiled already, off this thread), or None."""
        if speculative and (params.guided_decoding or params.has_penalties or params.min_tokens
                            or params.logit_bias):    # the one per-request row of the table
            raise ValueError(incompatibility(PER_REQUEST, "speculative_config"))
        if params.guided_decoding is None or grammar is not None:
            return grammar
        return self.compile(params.guided_decoding, serialized=serialized)

    def matcher(self, request):
        """The request's GrammarMatcher (kept on the core's Request, so it goes with it and
        survives its preemption), fed every output token it has not seen yet."""
        if request.matcher is None:
            import xgrammar as xgr
            grammar = request.grammar or self.compile(request.sampling_params.guided_decoding)
            request.matcher = [xgr.GrammarMatcher(grammar), 0]
        matcher, fed = request.matcher
        for token in request.output_token_ids[fed:]:
            if not matcher.accept_token(token):
                kind = request.sampling_params.guided_decoding.kind
                raise ValueError(f"token {token} breaks the {kind} constraint")
        request.matcher[1] = request.num_output_tokens
        return matcher

    def grammar_bitmask(self, scheduler_output, requests: dict) -> None:
        """The step's bitmask, built in the core and sent to the worker with the step (V1's
        grammar_bitmask): a row for each guided request that samples this step, (R, ceil(V /
        32)) int32, one bit per token (1: allowed), in the order of
        scheduler_output.structured_output_request_ids. A request whose tokens broke its
        grammar (a terminated one, under ignore_eos) keeps an open row and fails with the
        step (grammar_errors)."""
        so = scheduler_output
        ids = [req_id for req_id, samples in zip(so.req_ids, so.sampling)
               if samples and requests[req_id].sampling_params.guided_decoding is not None]
        if not ids:
            return
        import xgrammar as xgr
        t0 = time.perf_counter()
        bitmask = xgr.allocate_token_bitmask(len(ids), self.vocab_size)    # all bits 1
        for row, req_id in enumerate(ids):
            try:
                self.matcher(requests[req_id]).fill_next_token_bitmask(bitmask, row)
            except ValueError as e:
                so.grammar_errors[req_id] = f"structured output failed: {e}"
        so.structured_output_request_ids, so.grammar_bitmask = ids, bitmask
        self.mask_seconds += time.perf_counter() - t0
        self.num_masked_rows += len(ids)
