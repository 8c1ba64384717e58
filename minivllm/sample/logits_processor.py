"""Logits processors: per-request edits of a step's logits rows, before the Sampler draws
(vLLM twin: vllm/v1/sample/logits_processor/builtin.py and vllm/v1/sample/ops/penalties.py).

Every processor here is batched: it builds one tensor for the rows that ask for it and edits
those rows at once, never a Python loop over the vocabulary. In the Sampler's order:

    logit_bias     OpenAI's: a request's bias added to the logits of the tokens it names
    min_tokens     until a sequence has min_tokens new tokens, its stop tokens (EOS unless
                   ignore_eos, and stop_token_ids) are masked to -inf: it cannot stop early
    penalties      vLLM's three, from the token counts of each sequence (one scatter_add):
                     repetition_penalty r   tokens seen in the prompt or the output:
                                            logit / r if logit > 0, else logit * r
                     frequency_penalty f    logit -= f * (times the token is in the output)
                     presence_penalty p     logit -= p * (1 if it is in the output at all)
    guided         the grammar's token bitmask, built by the core (structured_output/manager.py)
                   and sent with the step: tokens that would break the JSON schema / regex /
                   choice go to -inf

Requests that ask for none of these cost nothing: their rows are never touched, so greedy
output of a plain request is the same bits as before the seam existed.

Left out, compared with vLLM: its persistent batch (V1 keeps the token counts in tensors that
live across steps; we count again from seq.token_ids every step, O(length) host work per
penalized row), min_p, bad_words, allowed_token_ids, and user-supplied processors.
"""

from __future__ import annotations

import torch


def apply_logit_bias(logits: torch.Tensor, seqs: list) -> None:
    """In place: each row's logit_bias added to the logits of the tokens it names."""
    rows = []
    cols = []
    bias = []
    for i, s in enumerate(seqs):
        for token, b in (s.sampling_params.logit_bias or {}).items():
            rows.append(i)
            cols.append(token)
            bias.append(b)
    if rows:
        logits[rows, cols] += torch.tensor(bias, dtype=logits.dtype, device=logits.device)


def apply_min_tokens(logits: torch.Tensor, seqs: list, eos_token_ids: set[int]):
    """In place: stop tokens of rows still short of min_tokens go to -inf. logits (B, V)."""
    rows = []
    cols = []
    for i, s in enumerate(seqs):
        p = s.sampling_params
        if p.min_tokens and s.num_output_tokens < p.min_tokens:
            stops = set(p.stop_token_ids) | (set() if p.ignore_eos else eos_token_ids)
            rows += [i] * len(stops)
            cols += sorted(stops)
    if rows:
        logits[rows, cols] = float("-inf")


def token_counts(token_lists: list[list[int]], vocab: int, device) -> torch.Tensor:
    """How often each token occurs in each list: (R, V) int64, one scatter_add for all rows."""
    width = max(map(len, token_lists), default=0)
    padded = torch.full((len(token_lists), width), vocab, dtype=torch.int64)  # pad: column V
    for r, toks in enumerate(token_lists):
        padded[r, :len(toks)] = torch.tensor(toks, dtype=torch.int64)
    counts = torch.zeros(len(token_lists), vocab + 1, dtype=torch.int64)
    counts.scatter_add_(1, padded, torch.ones_like(padded))
    return counts[:, :vocab].to(device)                               # (R, V)


def apply_penalties(logits: torch.Tensor, seqs: list) -> None:
    """In place: vLLM's repetition, frequency and presence penalties. logits (B, V)."""
    rows = [i for i, s in enumerate(seqs) if s.sampling_params.has_penalties]
    if not rows:
        return
    vocab = logits.shape[-1]
    device = logits.device
    params = [seqs[i].sampling_params for i in rows]
    col = lambda xs: torch.tensor(xs, dtype=logits.dtype, device=device)[:, None]  # noqa: E731
    output = token_counts([seqs[i].output_token_ids for i in rows], vocab, device)   # (R, V)
    prompt = token_counts([seqs[i].prompt_token_ids for i in rows], vocab, device) > 0
    x = logits[rows]                                                   # (R, V)
    rep = col([p.repetition_penalty for p in params])
    seen = prompt | (output > 0)
    x = torch.where(seen, torch.where(x > 0, x / rep, x * rep), x)    # shrink toward 0
    x -= col([p.frequency_penalty for p in params]) * output
    x -= col([p.presence_penalty for p in params]) * (output > 0)
    logits[rows] = x


def apply_grammar_bitmask(logits: torch.Tensor, seqs: list) -> None:
    """In place: the tokens a guided row's bitmask forbids go to -inf. A row of the bitmask is
    ceil(V / 32) int32 words, bit j of word w for token 32 w + j (xgrammar's layout)."""
    rows = [i for i, s in enumerate(seqs) if s.grammar_bitmask is not None]
    if not rows:
        return
    words = torch.stack([seqs[i].grammar_bitmask for i in rows]).to(logits.device)   # (R, W)
    bits = (words[:, :, None] >> torch.arange(32, device=logits.device)) & 1         # (R, W, 32)
    allowed = bits.flatten(1)[:, :logits.shape[-1]].bool()
    logits[rows] = logits[rows].masked_fill(~allowed, float("-inf"))


def apply_logits_processors(logits: torch.Tensor, seqs: list,
                            eos_token_ids: set[int]) -> torch.Tensor:
    """Every processor, in order, on a copy of logits (the caller keeps the raw rows for
    logprobs); seqs[i]: the runner's state of row i's request (worker/input_batch.py).
    Returns logits itself when no row asks for anything (no copy, no change)."""
    p = [s.sampling_params for s in seqs]
    if not any(x.min_tokens or x.has_penalties or x.logit_bias for x in p) and all(
            s.grammar_bitmask is None for s in seqs):
        return logits
    logits = logits.clone()
    apply_logit_bias(logits, seqs)
    apply_min_tokens(logits, seqs, eos_token_ids)
    apply_penalties(logits, seqs)
    apply_grammar_bitmask(logits, seqs)
    return logits
