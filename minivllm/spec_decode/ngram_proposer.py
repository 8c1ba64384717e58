"""The n-gram proposer: prompt lookup decoding (Saxena 2023), vLLM's method "ngram" (vLLM twin:
vllm/v1/spec_decode/ngram_proposer.py). No model at all: find the sequence's last n tokens
earlier in the sequence (n from prompt_lookup_max down to prompt_lookup_min) and propose the k
tokens that followed there. It shines when the output copies its input (editing, summarizing,
code refactoring, RAG quotes).

Left out, compared with vLLM: the numba-compiled KMP search (numpy's sliding windows here).
"""

from __future__ import annotations

import numpy as np


class NgramProposer:
    """Prompt lookup decoding (Saxena 2023; vLLM's method "ngram")."""

    def __init__(self, prompt_lookup_min: int, prompt_lookup_max: int):
        self.min_n = prompt_lookup_min
        self.max_n = prompt_lookup_max

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

    def propose_batch(self, req_ids: list[str], token_ids: list[list[int]],
                      rooms: list[int]) -> list[list[int]]:
        return [self.propose(tokens, k) for tokens, k in zip(token_ids, rooms)]

    def free(self, req_ids) -> None:
        """Prompt lookup keeps no state of a request."""
