"""Speculative decoding: guess k tokens cheaply, check them all in one target forward, keep
exactly what the target model would have produced (Leviathan et al. 2023, Chen et al. 2023).

A decode step reads every weight of the model to produce one token per sequence; on a CPU or a
GPU at small batch that read, not the arithmetic, sets the time. So running k + 1 tokens of
one sequence through the model costs little more than running 1, and if k of them were good
guesses, one forward yields up to k + 1 tokens:

    step t      tokens ... a b c        proposer: "d e f" (k = 3 drafts)
    verify      forward over [c d e f]  -> target logits at 4 positions: after c, d, e and f
    accept      d == target's pick after c?  yes.  e after d?  no: the target says x
    result      append d x              2 tokens from 1 forward; f is thrown away, and the KV
                                        slots of e and f are rolled back (num_computed_tokens)

Nothing is approximate: greedy keeps the longest prefix of drafts equal to the target's argmax,
then the target's own token; sampling accepts draft i with probability min(1, p/q) and, at the
first rejection, draws from norm(max(p - q, 0)), which together draw every token from exactly
p (the target's distribution after temperature, top-k and top-p, sampler.sampling_probs).

Proposers:
    ngram   prompt lookup: find the sequence's last n tokens earlier in the sequence (n from
            prompt_lookup_max down to prompt_lookup_min) and propose the k tokens that followed
            there. No model at all; q is a point mass on each draft. It shines when the output
            copies its input (editing, summarizing, code refactoring, RAG quotes).
    draft_model  a smaller model with the same vocabulary guesses greedily over its own paged
            KV cache (minivllm/spec_decode/draft_model.py); q is again a point mass on each guess.

In the engine: `propose` runs before the scheduler and sets seq.spec_token_ids; the scheduler
fits the drafts into the token budget and reserves their lookahead slots (BlockManager
append_slots); the model runner computes them after the sequence's own last token and returns
k + 1 logits rows; `take_draft_logits` sets the draft rows aside, the Sampler draws the
last-row token as usual (the bonus token), `accept` turns drafts + bonus into the tokens to
append, and `finish_step` rolls the rejected slots back and frees their blocks. A sequence
without drafts (prefilling, or nothing found) takes a plain one-token step in the same batch.

Left out, compared with vLLM: the EAGLE, Medusa and MTP proposers, tree
attention over several candidate continuations, per-position acceptance counters, and the
batched, GPU-side rejection sampler (this one loops over sequences in Python).
"""

from __future__ import annotations

import numpy as np
import torch

from minivllm.config import SpeculativeConfig
from minivllm.sample.sampler import Sampler, logprobs_entry, sampling_probs
from minivllm.core.sequence import Sequence


class NgramProposer:
    """Prompt lookup decoding (Saxena 2023; vLLM's method "ngram")."""

    def __init__(self, prompt_lookup_min: int, prompt_lookup_max: int):
        self.min_n, self.max_n = prompt_lookup_min, prompt_lookup_max

    def propose(self, token_ids: list[int], k: int) -> list[int]:
        """Up to k tokens that followed the earliest earlier occurrence of the longest suffix
        of token_ids (between min_n and max_n tokens long); [] when none occurs."""
        tokens = np.asarray(token_ids)
        for n in range(min(self.max_n, len(tokens) - 1), self.min_n - 1, -1):
            # Every n-gram that has at least one token after it (so never the suffix itself).
            windows = np.lib.stride_tricks.sliding_window_view(tokens[:-1], n)
            hits = np.flatnonzero((windows == tokens[-n:]).all(axis=1))
            if hits.size:
                start = int(hits[0]) + n
                return tokens[start:start + k].tolist()
        return []

    def propose_batch(self, seqs: list[Sequence], rooms: list[int]) -> list[list[int]]:
        return [self.propose(seq.token_ids, k) for seq, k in zip(seqs, rooms)]

    def drop(self, seq_id: int) -> None:
        """No per-sequence state to free (the draft-model proposer has some)."""


def greedy_accept(target_logits: torch.Tensor, draft_token_ids: list[int]):
    """Greedy: the longest prefix of drafts equal to the target's argmax. target_logits
    (k, V): the target's logits at each draft's position. Returns (number accepted, the
    target's token at the first mismatch, or None when all k match)."""
    target = target_logits.argmax(dim=-1).tolist()
    for i, (draft, best) in enumerate(zip(draft_token_ids, target)):
        if draft != best:
            return i, best
    return len(draft_token_ids), None


def rejection_sample(target_probs: torch.Tensor, draft_probs: torch.Tensor,
                     draft_token_ids: list[int], generator: torch.Generator | None = None):
    """Sampling: accept draft i with probability min(1, p_i(d_i) / q_i(d_i)); at the first
    rejection draw from norm(max(p_i - q_i, 0)) instead. Then every token is distributed
    exactly as p, whatever q is. target_probs p, draft_probs q: (k, V), rows summing to 1
    (for n-gram, q_i is one-hot on d_i). Returns (number accepted, the token drawn at the
    rejection, or None when all k are accepted: then the bonus token, drawn from the target's
    next distribution by the ordinary Sampler, follows)."""
    k = len(draft_token_ids)
    idx, drafts = torch.arange(k), torch.tensor(draft_token_ids)
    p = target_probs[idx, drafts]                               # (k,) p_i(d_i)
    q = draft_probs[idx, drafts]                                # (k,) q_i(d_i)
    u = torch.rand(k, generator=generator, device=target_probs.device)
    accepted = (u * q < p.to(u.device)).tolist()                # u < p/q, without dividing
    if all(accepted):
        return k, None
    i = accepted.index(False)                                   # the first rejection ends it
    residual = (target_probs[i] - draft_probs[i]).clamp(min=0)  # max(p - q, 0), unnormalized
    if residual.sum() <= 0:                                     # p == q up to rounding
        residual = target_probs[i]
    return i, int(torch.multinomial(residual, 1, generator=generator))


class SpeculativeDecoder:
    """The engine's side of speculative decoding: propose, set draft rows aside, accept, roll
    back, and count (per request in seq.metrics, per engine here)."""

    def __init__(self, config: SpeculativeConfig, runner):
        self.config = config
        self.max_model_len = runner.engine_config.max_model_len
        if config.method == "draft_model":
            from minivllm.spec_decode.draft_model import DraftModelProposer
            self.proposer = DraftModelProposer(config.model, runner, config.quantization)
        else:
            self.proposer = NgramProposer(config.prompt_lookup_min, config.prompt_lookup_max)
        self.draft_logits: dict[int, torch.Tensor] = {}   # seq_id -> (k, V), during a step
        self.num_drafts = self.num_draft_tokens = self.num_accepted_tokens = 0
        self.num_accepted_this_step = 0

    def propose(self, running: list[Sequence]) -> None:
        """Draft tokens for every decoding sequence: at most k, and no more than it may still
        produce (max_tokens, max_model_len) minus the one token the target always adds."""
        self.num_accepted_this_step = 0
        seqs, rooms = [], []
        for seq in running:
            room = min(self.config.num_speculative_tokens,
                       seq.params.max_tokens - seq.num_output_tokens - 1,
                       self.max_model_len - len(seq) - 1)
            seq.spec_token_ids = []
            if seq.num_uncomputed_tokens == 1 and seq.num_output_tokens > 0 and room > 0:
                seqs.append(seq)                                    # decoding, with room
                rooms.append(room)
        for seq, drafts in zip(seqs, self.proposer.propose_batch(seqs, rooms)):
            seq.spec_token_ids = drafts

    def take_draft_logits(self, seqs: list[Sequence], logits: torch.Tensor) -> torch.Tensor:
        """logits from ModelRunner.run (k + 1 rows for a sequence with k drafts) -> one row
        per sequence, its last, for the Sampler; the draft rows wait here for `accept`."""
        last, start = [], 0
        for seq in seqs:
            k = len(seq.spec_token_ids)
            if k:
                self.draft_logits[seq.seq_id] = logits[start:start + k]
            last.append(start + k)
            start += k + 1
        return logits[last] if start > len(seqs) else logits

    def accept(self, seq: Sequence, bonus, sampler: Sampler) -> list[tuple]:
        """seq's drafts checked against the target -> the (token id, logprobs) to append:
        the accepted drafts, then the target's token at the first rejection, or, when every
        draft is accepted, `bonus` (what the Sampler drew from the last row)."""
        drafts, params = seq.spec_token_ids, seq.params
        logits = self.draft_logits.pop(seq.seq_id)                  # (k, V)
        if params.greedy:
            num_accepted, fix = greedy_accept(logits, drafts)
        else:
            target = sampling_probs(logits, [params] * len(drafts))
            proposed = torch.nn.functional.one_hot(                 # n-gram: q is a point mass
                torch.tensor(drafts, device=logits.device), logits.shape[-1]).to(target.dtype)
            num_accepted, fix = rejection_sample(target, proposed, drafts,
                                                 sampler.generator(seq))
        self.num_drafts += 1
        self.num_draft_tokens += len(drafts)
        self.num_accepted_tokens += num_accepted
        self.num_accepted_this_step += num_accepted
        seq.metrics.num_draft_tokens += len(drafts)
        seq.metrics.num_accepted_tokens += num_accepted
        tokens = drafts[:num_accepted] + ([] if fix is None else [fix])
        raw = logits[:len(tokens)].log_softmax(dim=-1) if params.logprobs is not None else None
        draws = [(t, None if raw is None else logprobs_entry(raw[i], t, params.logprobs))
                 for i, t in enumerate(tokens)]
        return draws + ([bonus] if fix is None else [])

    def finish_step(self, seqs: list[Sequence], block_manager) -> None:
        """After the tokens are appended: a sequence that verified drafts has K/V for all its
        tokens but the newest (its accepted drafts' K/V was computed in the verification);
        the slots past that held rejected drafts and are rolled back, their blocks freed."""
        for seq in seqs:
            if seq.spec_token_ids and not seq.is_finished:
                seq.num_computed_tokens = len(seq) - 1
                block_manager.free_lookahead_slots(seq)
            seq.spec_token_ids = []
            if seq.is_finished:
                self.proposer.drop(seq.seq_id)                      # the draft's twin goes too
        self.draft_logits.clear()

    def stats(self) -> dict[str, int]:
        """The counters EngineStats reports."""
        return {"spec_decode_num_drafts": self.num_drafts,
                "spec_decode_num_draft_tokens": self.num_draft_tokens,
                "spec_decode_num_accepted_tokens": self.num_accepted_tokens}
