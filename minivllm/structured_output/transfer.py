"""A compiled grammar on its way to an engine core in another process, and its loading there.

No single vLLM twin: vLLM V1 compiles in the core process, so nothing crosses. Here the front
end compiles (in its sandbox, bounded), so the core gets xgrammar's JSON of the grammar (a
CompiledGrammar does not pickle), which can be large (23 MB for a 4,000-way guided_choice) and
slow to load (0.6-1.9 s). Two things keep that off every other stream:

    GrammarsSent (the client's side)   a guided request's n children carry one grammar: its
                                       JSON crosses once, then only its digest; the KEEP_SENT
                                       most recent digests are remembered, in the same order
                                       the core keeps them (16 children of a new 4,000-way
                                       choice each sent and loaded their 23 MB: one stream
                                       waited 26.6 s)
    GrammarLoader (the core's side)    loads each JSON on a thread of its own while the busy
                                       loop steps the other requests; a guided request is
                                       added once its grammar is loaded, in the order it came
"""

from __future__ import annotations

import dataclasses
import json
from collections import OrderedDict, deque
from concurrent.futures import Future, ThreadPoolExecutor

KEEP_SENT = 8        # grammars a core keeps by digest (and its sender remembers sending)


@dataclasses.dataclass(frozen=True)
class SerializedGrammar:
    """A compiled grammar as it crosses: xgrammar's JSON of it, and a digest of the constraint
    it came from. `json` is None when the core already has it under this digest."""
    digest: str | None
    json: str | None


class GrammarsSent:
    """The sender's side: what the core was sent, so each grammar's JSON crosses once."""

    def __init__(self):
        self.digests: OrderedDict[str, None] = OrderedDict()

    def prepare(self, request):
        """A guided EngineCoreRequest as it crosses: its grammar a SerializedGrammar (JSON
        None if this core has it), its schema as text (pickle recursed past Python's limit
        on a schema 300 levels deep)."""
        grammar, guided = request.grammar, request.sampling_params.guided_decoding
        if not isinstance(grammar, SerializedGrammar):      # a CompiledGrammar given directly
            grammar = SerializedGrammar(None, grammar.serialize_json())
        elif grammar.digest in self.digests:
            self.digests.move_to_end(grammar.digest)
            grammar = SerializedGrammar(grammar.digest, None)
        else:
            self.digests[grammar.digest] = None
            while len(self.digests) > KEEP_SENT:
                self.digests.popitem(last=False)
        if isinstance(guided.json, dict):
            guided = dataclasses.replace(guided, json=json.dumps(guided.json))
        params = dataclasses.replace(request.sampling_params, guided_decoding=guided)
        return dataclasses.replace(request, grammar=grammar, sampling_params=params)


class GrammarLoader:
    """The core's side: each guided request waits here while its grammar loads on the loader's
    thread (xgrammar releases the GIL while it parses), and leaves, in the order it came, once
    it has its CompiledGrammar or the error that kept it from one."""

    def __init__(self, manager):
        self.manager = manager                       # its deserialize(), its vocabulary
        self.received: OrderedDict[str, object] = OrderedDict()   # digest -> CompiledGrammar
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="minivllm-grammar-load")
        self.waiting: deque[tuple[object, Future]] = deque()      # (request, its load)

    def add(self, request) -> None:
        self.waiting.append((request, self.pool.submit(self.receive, request.grammar)))

    def ready(self) -> list[tuple[object, Future]]:
        """The requests at the head of the line whose grammar is loaded (or failed to)."""
        done = []
        while self.waiting and self.waiting[0][1].done():
            done.append(self.waiting.popleft())
        return done

    def abort(self, request_ids) -> None:
        """Drop waiting requests (their loads still run: the digests stay in step)."""
        ids = set(request_ids)
        self.waiting = deque(w for w in self.waiting if w[0].request_id not in ids)

    def receive(self, grammar: SerializedGrammar):
        """The CompiledGrammar a SerializedGrammar names: loaded from its JSON, or (JSON None)
        the one loaded under its digest before. One thread, in order: the same KEEP_SENT most
        recent digests as the sender's."""
        if grammar.json is None:
            if grammar.digest not in self.received:
                raise ValueError("the request's grammar was not sent (a front-end bug)")
            self.received.move_to_end(grammar.digest)
            return self.received[grammar.digest]
        compiled = self.manager.deserialize(grammar.json)
        if grammar.digest is not None:
            self.received[grammar.digest] = compiled
            while len(self.received) > KEEP_SENT:
                self.received.popitem(last=False)
        return compiled
