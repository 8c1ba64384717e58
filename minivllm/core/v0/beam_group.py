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
    its table), each other one as a fork, a new request whose table points at the same blocks
    (V0Scheduler.fork: reference counts up, nothing copied); the one block both will write
    into, the last, partly filled one, is copied by the first to write (copy-on-write)
    a beam that no survivor extends is finished: its references go, and a block no beam
    holds any more goes back to the pool

When the search is done, every beam is finished and the core reports the finished hypotheses,
best first, as requests "0_{id}" .. "{k-1}_{id}" (V1's child ids), each with its tokens and
their logprobs. The beams themselves are named "{id}", "{id}#1", "{id}#2", ... as they fork.
"""

from __future__ import annotations

from minivllm.beam_search import (BeamSearchInstance, BeamSearchParams, BeamSearchSequence,
                                  num_candidates)
from minivllm.core.request import Request, RequestStatus
from minivllm.core.v0.group import SequenceGroup
from minivllm.outputs import EngineCoreOutput


class BeamGroup(SequenceGroup):
    def __init__(self, first: Request, params: BeamSearchParams, eos_token_ids: set[int]):
        self.params, self.eos_token_ids = params, set(eos_token_ids)
        wanted = num_candidates(params.beam_width, self.eos_token_ids)
        sampling = first.sampling_params
        if sampling.temperature != 0 or sampling.n != 1 or (sampling.logprobs or 0) < wanted:
            raise ValueError(f"a beam samples greedily, n=1, with logprobs >= {wanted}: "
                             f"got {sampling}")
        super().__init__(first, params.beam_width)
        self.search = BeamSearchInstance(first.num_prompt_tokens,
                                         [BeamSearchSequence(list(first.token_ids))])
        self.rows: dict[str, dict[int, float]] = {}   # beam id -> its continuations this round

    def add_row(self, beam: Request, logprobs: dict[int, float]) -> bool:
        """A beam's continuations this round; True once every beam has its row."""
        self.rows[beam.request_id] = logprobs
        return len(self.rows) == len(self.seqs)

    def restart(self) -> list[Request]:
        """Back to the prompt, one beam: the group's first request (a preempted group is
        searched again from there; greedy, it finds the same beams). Returns the other beams,
        which the scheduler finishes."""
        first = self.first
        first.status = RequestStatus.WAITING   # (before the others finish: the group stays)
        first.metrics.finished_time = None
        del first.token_ids[first.num_prompt_tokens:]
        first.block_hashes = []
        others = [beam for beam in self.seqs if beam is not first]
        self.search = BeamSearchInstance(first.num_prompt_tokens,
                                         [BeamSearchSequence(list(first.token_ids))])
        self.seqs, self.rows = [first], {}
        return others

    def advance(self, scheduler) -> list[EngineCoreOutput]:
        """The round, once every beam has its row: fork the survivors, finish the others
        (all of them when the search is done, then the outputs)."""
        parents = self.search.advance([self.rows.pop(b.request_id) for b in self.seqs],
                                      self.params, self.eos_token_ids)
        beams = []
        for i in ([] if self.search.done else parents):
            parent = self.seqs[i]
            if parent in beams:                # extended in place already: a fork
                self.num_made += 1
                beams.append(scheduler.fork(self, parent, f"{self.request_id}#{self.num_made}"))
            else:
                beams.append(parent)
        for beam, sequence in zip(beams, self.search.running):
            beam.append_token(sequence.tokens[-1], None)
        for beam in self.seqs:
            if beam not in beams:
                scheduler.finish(beam, RequestStatus.FINISHED_STOPPED)
        self.seqs = beams
        return [] if beams else self.outputs()

    def outputs(self) -> list[EngineCoreOutput]:
        """The finished hypotheses, best first, as requests "0_{id}" .. "{k-1}_{id}": their
        generated tokens and each one's logprob."""
        start = self.search.prompt_len
        return [EngineCoreOutput(self.child_id(index), beam.tokens[start:], beam.logprobs,
                                 beam.finish_reason, None, self.first.metrics.first_scheduled_time)
                for index, beam in enumerate(self.search.finished)]
