"""SpeculativeDecoder: the engine's side of speculative decoding, which proposes the drafts
(vLLM twin: the proposer half of vllm/v1/worker/gpu_model_runner.py's propose_draft_token_ids).

A decode step reads every weight of the model to produce one token per sequence; on a CPU or a
GPU at small batch that read, not the arithmetic, sets the time. So running k + 1 tokens of
one sequence through the model costs little more than running 1, and if k of them were good
guesses, one forward yields up to k + 1 tokens:

    step t      tokens ... a b c        proposer: "d e f" (k = 3 drafts)
    verify      forward over [c d e f]  -> target logits at 4 positions: after c, d, e and f
    accept      d == target's pick after c?  yes.  e after d?  no: the target says x
    result      append d x              2 tokens from 1 forward; f is thrown away, and the KV
                                        slots of e and f are rolled back (num_computed_tokens)

Nothing is approximate (the acceptance rule: minivllm/sample/rejection_sampler.py).

Proposers:
    ngram   prompt lookup: propose the k tokens that followed the last n tokens earlier in
            the sequence (minivllm/spec_decode/ngram_proposer.py). No model at all.
    draft_model  a smaller model with the same vocabulary guesses greedily over its own paged
            KV cache (minivllm/spec_decode/draft_model.py).

In the engine, four seams (listed in minivllm/spec_decode/__init__.py): EngineCore.step calls
`propose` before scheduling and hands the drafts to Scheduler.update_draft_token_ids (vLLM V1's
runner proposes after sampling and returns them in its ModelRunnerOutput); the scheduler fits the drafts into the token budget
and reserves their lookahead slots; the model runner verifies them (k + 1 logits rows, the
rejection sampler); Scheduler.update_from_output appends what was accepted and rolls the
rejected slots back. A sequence without drafts (prefilling, or nothing found) takes a plain
one-token step in the same batch.

Left out, compared with vLLM: the EAGLE, Medusa and MTP proposers, tree attention over several
candidate continuations, and per-position acceptance counters.
"""

from __future__ import annotations

from minivllm.config import SpeculativeConfig
from minivllm.core.sequence import Sequence
from minivllm.spec_decode.ngram_proposer import NgramProposer


class SpeculativeDecoder:
    """Seam 1 of speculative decoding: before each schedule, draft tokens for every decoding
    sequence that has room for them."""

    def __init__(self, config: SpeculativeConfig, max_model_len: int, executor):
        """executor: the target's; a draft model is built beside its driver's runner."""
        self.config = config
        self.max_model_len = max_model_len
        if config.method == "draft_model":
            from minivllm.spec_decode.draft_model import DraftModelProposer
            target = executor.driver_worker.model_runner
            self.proposer = DraftModelProposer(config.model, target, config.quantization)
        else:
            self.proposer = NgramProposer(config.prompt_lookup_min, config.prompt_lookup_max)

    def propose(self, running: list[Sequence]) -> dict[int, list[int]]:
        """Draft tokens for every decoding sequence, by sequence id (for the scheduler's
        update_draft_token_ids): at most k, and no more than it may still produce (max_tokens,
        max_model_len) minus the one token the target always adds. A proposer with state (the
        draft model) drops what it held for sequences not asked."""
        seqs = []
        rooms = []
        for seq in running:
            room = min(self.config.num_speculative_tokens,
                       seq.params.max_tokens - seq.num_output_tokens - 1,
                       self.max_model_len - len(seq) - 1)
            if seq.num_uncomputed_tokens == 1 and seq.num_output_tokens > 0 and room > 0:
                seqs.append(seq)                                    # decoding, with room
                rooms.append(room)
        drafts = self.proposer.propose_batch(seqs, rooms)
        return {seq.seq_id: d for seq, d in zip(seqs, drafts) if d}
