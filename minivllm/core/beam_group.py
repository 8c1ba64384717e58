"""BeamGroup: beam search inside the engine core, on forked block tables. This is vLLM V0's
design (its SequenceGroup held a request's beams and vllm/engine/output_processor/
single_step.py chose them); V1 removed it for beam search over the public API, which
minivllm/beam_search.py also has. Both pick the beams by the same rules (BeamSearchInstance,
transformers'); they differ in where the beams' shared history lives.

A request handed to the core with `beam_search` set starts as one beam. Every round, each
running beam computes one token, and the sampler returns its top continuations (its logprobs,
at temperature 0). A beam that has its row waits, computing nothing, until every beam of its
group has one: a beam the token budget left out, or one that was preempted, catches up first.
Then the round's survivors are picked, and the block tables follow them:

    a survivor extends the beam it comes from: the first one in place (that beam's table is
    its table), each other one as a fork, a new sample whose table points at the same blocks
    (BlockManager.fork: reference counts up, nothing copied); the one block both will write
    into, the last, partly filled one, is copied by the first to write (copy-on-write)
    a beam that no survivor extends is finished: its references go, and a block no beam
    holds any more goes back to the pool

When the search is done, every beam is finished and the core reports the finished hypotheses,
best first, as the request's samples 0..k-1, each with its tokens and their logprobs.
"""

from __future__ import annotations

from minivllm.beam_search import (BeamSearchInstance, BeamSearchParams, BeamSearchSequence,
                                  num_candidates)
from minivllm.core.request import Request, RequestStatus
from minivllm.outputs import EngineCoreOutput


class BeamGroup:
    def __init__(self, first: Request, params: BeamSearchParams, eos_token_ids: set[int]):
        self.params, self.eos_token_ids = params, set(eos_token_ids)
        wanted = num_candidates(params.beam_width, self.eos_token_ids)
        sampling = first.sampling_params
        if sampling.temperature != 0 or sampling.n != 1 or (sampling.logprobs or 0) < wanted:
            raise ValueError(f"a beam samples greedily, n=1, with logprobs >= {wanted}: "
                             f"got {sampling}")
        self.search = BeamSearchInstance(first.num_prompt_tokens,
                                         [BeamSearchSequence(list(first.token_ids))])
        self.first = first                     # the request as it came (its id, its metrics)
        self.beams = [first]                   # the requests of search.running, in its order
        self.rows: dict[int, dict[int, float]] = {}   # seq_id -> its continuations this round
        first.beam = self

    @property
    def width(self) -> int:
        return self.params.beam_width

    def add_row(self, beam: Request, logprobs: dict[int, float]) -> bool:
        """A beam's continuations this round; True once every beam has its row."""
        self.rows[beam.seq_id] = logprobs
        return len(self.rows) == len(self.beams)

    def restart(self) -> list[Request]:
        """Back to the prompt, one beam: the group's first request (a preempted group is
        searched again from there; greedy, it finds the same beams). Returns the other beams,
        which the scheduler finishes."""
        first = self.first
        first.status = RequestStatus.WAITING   # (before the others finish: the request stays)
        first.metrics.finished_time = None
        del first.token_ids[first.num_prompt_tokens:]
        first.block_hashes = []
        others = [beam for beam in self.beams if beam is not first]
        self.search = BeamSearchInstance(first.num_prompt_tokens,
                                         [BeamSearchSequence(list(first.token_ids))])
        self.beams, self.rows = [first], {}
        return others

    def advance(self, scheduler, seq_ids) -> list[EngineCoreOutput]:
        """The round, once every beam has its row: fork the survivors, finish the others
        (all of them when the search is done, then the outputs)."""
        parents = self.search.advance([self.rows.pop(b.seq_id) for b in self.beams],
                                      self.params, self.eos_token_ids)
        beams = []
        for i in ([] if self.search.done else parents):
            parent = self.beams[i]
            if parent in beams:                # extended in place already: a fork
                child = parent.copy(next(seq_ids))
                scheduler.fork(parent, [child])
                beams.append(child)
            else:
                beams.append(parent)
        for beam, sequence in zip(beams, self.search.running):
            beam.append_token(sequence.tokens[-1], None)
        for beam in self.beams:
            if beam not in beams:
                scheduler.finish(beam, RequestStatus.FINISHED_STOPPED)
        self.beams = beams
        return [] if beams else self.outputs()

    def outputs(self) -> list[EngineCoreOutput]:
        """The finished hypotheses, best first, as samples 0..k-1: their generated tokens
        and each one's logprob."""
        start = self.search.prompt_len
        return [EngineCoreOutput(self.first.request_id, index, beam.tokens[start:], beam.logprobs,
                                 beam.finish_reason, None, self.first.metrics.first_scheduled_time)
                for index, beam in enumerate(self.search.finished)]
