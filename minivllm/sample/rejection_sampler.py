"""The acceptance rule of speculative decoding: which draft tokens the target keeps (vLLM twin:
vllm/v1/sample/rejection_sampler.py). The ModelRunner calls `accept_drafts` for every sequence
that verified drafts this step, right after the Sampler drew its last row's token.

Nothing is approximate: greedy keeps the longest prefix of drafts equal to the target's argmax,
then the target's own token; sampling accepts draft i with probability min(1, p/q) and, at the
first rejection, draws from norm(max(p - q, 0)), which together draw every token from exactly
p (the target's distribution after temperature, top-k and top-p, sampler.sampling_probs).
Every proposer here (n-gram, draft model) guesses greedily, so q is a point mass on each draft.

Left out, compared with vLLM: the batched, GPU-side kernel (this one loops over sequences in
Python), and draft probabilities from a sampling draft model.
"""

from __future__ import annotations

import torch

from minivllm.outputs import Draw
from minivllm.sample.sampler import logprobs_entry, sampling_probs


# --8<-- [start:accept]
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
    idx = torch.arange(k)
    drafts = torch.tensor(draft_token_ids)
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
# --8<-- [end:accept]


def accept_drafts(seq, draft_logits: torch.Tensor, bonus: Draw,
                  generator: torch.Generator) -> list[Draw]:
    """seq's drafts checked against the target -> the draws to append: the accepted drafts,
    then the target's token at the first rejection, or, when every draft is accepted, `bonus`
    (what the Sampler drew from the last row). draft_logits (k, V): the target's logits at
    each draft's position."""
    drafts = seq.spec_token_ids
    params = seq.sampling_params
    if params.greedy:
        num_accepted, fix = greedy_accept(draft_logits, drafts)
    else:
        target = sampling_probs(draft_logits, [params] * len(drafts))
        proposed = torch.nn.functional.one_hot(                     # q: a point mass
            torch.tensor(drafts, device=draft_logits.device), draft_logits.shape[-1])
        num_accepted, fix = rejection_sample(target, proposed.to(target.dtype), drafts,
                                             generator)
    tokens = drafts[:num_accepted] + ([] if fix is None else [fix])
    raw = draft_logits[:len(tokens)].log_softmax(dim=-1) if params.logprobs is not None else None
    draws = [(t, None if raw is None else logprobs_entry(raw[i], t, params.logprobs))
             for i, t in enumerate(tokens)]
    return draws + ([bonus] if fix is None else [])
