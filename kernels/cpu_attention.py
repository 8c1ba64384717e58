"""Paged attention that costs only each sequence's own tokens: the CPU's fast path, torch ops.

The engine's reference (minivllm/attention/torch_attention.py, `paged_attention`) pads every sequence of a step
to the step's longest and masks the rest: a decode batch whose lengths run from 20 to 350 then
gathers and multiplies 350 keys for every sequence, about twice the real work on a mixed
workload. This file computes the same thing, and is checked against that reference
(tests/test_cpu_attention.py), with three changes:

  * Decode rows (one new token) are sorted by length and cut into groups whose longest is at
    most twice their shortest: one SDPA call per group, a handful per layer instead of one per
    sequence. (Measured on 16 sequences of 16..350 tokens, 2-core Zen 3 under load: groups
    within 4/3 made 6 calls and ran slower than 3 groups within 2x; the call, not the padding,
    is what costs at these lengths.)
  * A decode group folds the query heads that share a KV head into the query axis,
    (b, Hkv, heads per KV head, D): GQA without repeating K/V, and matmuls of several rows.
  * A sequence bringing several tokens (prefill, chunk, speculative verification) gets its own
    SDPA call: is_causal when nothing was cached before it, an explicit mask otherwise.

The grouping depends on the step, not on the layer: `VarlenLayout.build` runs once per step.
Left out, compared with vLLM's CPU backend: a fused C++ paged-attention kernel that reads the
blocks in place (no gather at all), and flex_attention with a block mask (its compile costs more
than a workshop run saves).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(slots=True)
class VarlenLayout:
    block_size: int
    # one per decode group: (token rows (b,), its sequences' first ceil(L / block_size) block
    # ids, row by row (b * that,), key mask (b, 1, 1, L)), L the group's longest sequence
    decode_groups: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    # one per multi-token sequence: (first row, end row, keys n, its first ceil(n / block_size)
    # block ids, mask (q_len, n) or None when the queries are all n tokens: is_causal then)
    multi: list[tuple[int, int, int, torch.Tensor, torch.Tensor | None]]

    @classmethod
    def build(cls, query_start_loc: torch.Tensor, seq_lens: torch.Tensor,
              block_tables: torch.Tensor, block_size: int) -> VarlenLayout:
        starts, lens = query_start_loc.tolist(), seq_lens.tolist()
        q_lens = [b - a for a, b in zip(starts, starts[1:])]
        device = block_tables.device

        def blocks(seqs, n):        # (b,) sequences -> (b * ceil(n / block_size),) block ids
            return block_tables[seqs][:, :-(-n // block_size)].flatten()    # once per step

        decode = sorted((i for i, n in enumerate(q_lens) if n == 1), key=lambda i: -lens[i])
        groups = []
        while decode:
            longest = lens[decode[0]]
            n = next((j for j, i in enumerate(decode) if 2 * lens[i] < longest), len(decode))
            seqs, decode = torch.tensor(decode[:n], device=device), decode[n:]
            mask = torch.arange(longest, device=device) < seq_lens[seqs][:, None]    # (b, L)
            groups.append((query_start_loc[seqs], blocks(seqs, longest), mask[:, None, None]))
        multi = []
        for i, q_len in enumerate(q_lens):
            if q_len > 1:
                n = lens[i]
                # query r sits at position n - q_len + r and sees keys 0..that position
                mask = None if q_len == n else (
                    torch.arange(n, device=device)[None]
                    <= torch.arange(n - q_len, n, device=device)[:, None])  # (q_len, n)
                multi.append((starts[i], starts[i + 1], n, blocks([i], n), mask))
        return cls(block_size, groups, multi)


def varlen_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     layout: VarlenLayout, scale: float, kv_cache_dtype: str = "auto"
                     ) -> torch.Tensor:
    """q: [num_tokens, num_heads, head_dim] -> the same shape, attending over the pool
    k_cache/v_cache [num_blocks, block_size, kv_heads, head_dim] as `layout` says.
    A quantized pool (kv_cache_dtype "int8" / "fp8") converts only the rows it gathers."""
    num_kv_heads, head_dim = k_cache.shape[2], q.shape[2]
    out = torch.empty_like(q)

    def gather(blocks, b, n):        # b sequences' block ids -> 2 x (b, Hkv, n, D)
        # Whole blocks (block_size x Hkv x D contiguous values each) through index_select,
        # then the first n keys: 2.5-3x faster than indexing slot by slot (advanced indexing).
        k, v = (cache.index_select(0, blocks).unflatten(0, (b, -1)).flatten(1, 2)[:, :n]
                for cache in (k_cache, v_cache))                         # (b, n, Hkv, D)
        if kv_cache_dtype != "auto":
            from kernels.write_kv import dequantize_kv          # (it imports Triton)
            k, v = (dequantize_kv(x, kv_cache_dtype, q.dtype) for x in (k, v))
        return k.transpose(1, 2), v.transpose(1, 2)

    for rows, blocks, mask in layout.decode_groups:
        k, v = gather(blocks, len(rows), mask.shape[-1])
        qg = q.index_select(0, rows).unflatten(1, (num_kv_heads, -1))   # (b, Hkv, H/Hkv, D)
        o = F.scaled_dot_product_attention(qg, k, v, attn_mask=mask, scale=scale)
        out.index_copy_(0, rows, o.flatten(1, 2))                     # (b, H, D)
    for start, end, n, blocks, mask in layout.multi:
        k, v = gather(blocks, 1, n)
        o = F.scaled_dot_product_attention(
            q[start:end].transpose(0, 1)[None], k, v, attn_mask=mask,
            is_causal=mask is None, scale=scale, enable_gqa=True)      # (1, H, q_len, D)
        out[start:end] = o[0].transpose(0, 1)
    return out
