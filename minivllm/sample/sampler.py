"""Sampler: turn one row of logits per sequence into its next token.

Order of operations, as in vLLM: logprobs are read from the raw distribution; then the logits
processors edit the rows that ask for it (min_tokens, penalties, the guided-decoding bitmask:
minivllm/sample/logits_processor.py); then temperature, top-k and top-p reshape it; then each row draws
with its own torch.Generator. Drawing is the "exponential race": argmax(p / E) with E ~ Exp(1)
picks token i with probability p_i, exactly like multinomial, but without a host sync on GPUs.

Each request draws from its own torch.Generator, kept here by request id (seeded with the
request's seed, or from the OS; sample i of an n > 1 request is a request of its own, seeded
seed + i), so its tokens do not depend on what else shares the batch: a seeded request is
reproducible in any company. The ModelRunner calls `free` for the requests the scheduler
reports finished.

Left out, compared with vLLM: min_p, logit_bias, user-supplied logits processors, and batched
(FlashInfer) top-k/top-p kernels.
"""

from __future__ import annotations

import torch

from minivllm.sample.logits_processor import apply_logits_processors


# --8<-- [start:top_k_top_p]
def apply_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor):
    """Mask (to -inf) what top-k and top-p discard. logits (B, V); top_k, top_p (B,)."""
    sorted_logits, sorted_idx = logits.sort(dim=-1, descending=True)
    # top-k: everything below the k-th largest logit goes.
    kth = sorted_logits.gather(1, (top_k - 1).clamp(min=0)[:, None])
    sorted_logits = sorted_logits.masked_fill(sorted_logits < kth, float("-inf"))
    # top-p: keep the smallest prefix whose mass reaches top_p, and always the first token
    # (a top_p of 1e-300 is 0.0 in float32: without that, no token is left and the row NaN).
    probs = sorted_logits.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    drop = mass_before >= top_p[:, None]
    drop[:, 0] = False
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter(1, sorted_idx, sorted_logits)
# --8<-- [end:top_k_top_p]


def sampling_probs(logits: torch.Tensor, params: list) -> torch.Tensor:
    """The distribution each row is drawn from: temperature, then top-k and top-p, then
    softmax. logits (B, V), params[i] the SamplingParams of row i (none greedy) -> (B, V).
    Speculative decoding verifies draft tokens against exactly this distribution."""
    vocab = logits.shape[-1]
    device = logits.device
    temp = torch.tensor([p.temperature for p in params], device=device)
    top_k = torch.tensor([p.top_k if p.top_k > 0 else vocab for p in params], device=device)
    top_p = torch.tensor([p.top_p for p in params], device=device)
    logits = logits / temp[:, None]
    # Only rows that ask for top-k / top-p pay for the sort over the vocabulary: 16 rows of
    # 49,152 logits took 350 ms sorted against 6 ms without, on a 2-core CPU under load.
    cut = ((top_k < vocab) | (top_p < 1)).nonzero().flatten()
    if len(cut):
        logits[cut] = apply_top_k_top_p(logits[cut], top_k[cut], top_p[cut])
    return logits.softmax(dim=-1)


def logprobs_entry(raw_logprobs: torch.Tensor, token_id: int, num: int) -> dict[int, float]:
    """What RequestOutput shows for one token: the `num` most likely of the raw (unprocessed)
    distribution, plus the token chosen. raw_logprobs: (V,) log_softmax of the logits."""
    top = raw_logprobs.topk(num) if num else None
    entry = dict(zip(top.indices.tolist(), top.values.tolist())) if top else {}
    entry[token_id] = raw_logprobs[token_id].item()
    return entry


class Sampler:
    """Draws every sampling row of a step. Its state is its own: the random generator of each
    request, and what it was given at construction (the tokens min_tokens holds back)."""

    def __init__(self, device: torch.device, eos_token_ids: set[int] = frozenset()):
        self.device = device
        self.eos_token_ids = set(eos_token_ids)
        self.generators: dict[str, torch.Generator] = {}     # request id -> its generator

    def generator(self, req_id: str, seed: int | None) -> torch.Generator:
        """req_id's generator, made on first use and seeded (from the OS if seed is None)."""
        g = self.generators.get(req_id)
        if g is None:
            g = self.generators[req_id] = torch.Generator(device=self.device)
            if seed is None:
                g.seed()
            else:
                g.manual_seed(seed)
        return g

    def get_generator_state(self, req_id: str) -> torch.Tensor | None:
        """Its generator's state, None if it has drawn nothing (disaggregation sends it)."""
        g = self.generators.get(req_id)
        return None if g is None else g.get_state()

    def set_generator_state(self, req_id: str, state: torch.Tensor) -> None:
        """Take over another engine's generator for req_id (the disaggregation consumer)."""
        self.generator(req_id, None).set_state(state)

    def free(self, req_id: str) -> None:
        """The request has finished: drop its generator."""
        self.generators.pop(req_id, None)

    def reset(self) -> None:
        """A new engine configuration: no request from before survives it (requests that
        finished last are forgotten with the next step, which may not come)."""
        self.generators.clear()

    def __call__(self, logits: torch.Tensor, seqs: list):
        """logits: (B, V) float32, row i for seqs[i] (the runner's CachedRequestStates) ->
        (token ids, per-token logprob dicts)."""
        want_logprobs = any(s.sampling_params.logprobs is not None for s in seqs)
        raw_logprobs = logits.log_softmax(dim=-1) if want_logprobs else None
        logits = apply_logits_processors(logits, seqs, self.eos_token_ids)
        tokens = logits.argmax(dim=-1)                      # greedy rows are done here
        sampled = [i for i, s in enumerate(seqs) if not s.sampling_params.greedy]
        if sampled:
            probs = sampling_probs(logits[sampled], [seqs[i].sampling_params for i in sampled])
            for j, i in enumerate(sampled):
                g = self.generator(seqs[i].req_id, seqs[i].sampling_params.seed)
                noise = torch.empty_like(probs[j]).exponential_(generator=g)
                tokens[i] = (probs[j] / noise).argmax()

        token_ids = tokens.tolist()
        logprobs = [None] * len(seqs)
        for i, s in enumerate(seqs):
            num_logprobs = s.sampling_params.logprobs
            if num_logprobs is not None:
                logprobs[i] = logprobs_entry(raw_logprobs[i], token_ids[i], num_logprobs)
        return token_ids, logprobs

    def draw(self, logits: torch.Tensor, seqs: list, errors: dict[str, str]) -> list:
        """Every row at once, as (token id, logprobs) pairs; if that fails, row by row, to find
        the rows at fault (their requests go into `errors`, their draws are None)."""
        try:
            return list(zip(*self(logits, seqs)))
        except Exception:                                           # noqa: BLE001
            draws = []
            for i, seq in enumerate(seqs):
                try:
                    token_ids, logprobs = self(logits[i:i + 1], [seq])
                    draws.append((token_ids[0], logprobs[0]))
                except Exception as e:                              # noqa: BLE001
                    draws.append(None)
                    errors.setdefault(seq.req_id, f"sampling failed: {e!r}")
            return draws
