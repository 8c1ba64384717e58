"""Random paged batches for the kernel tests, the benchmark and lesson 03.

A batch here is what the engine hands one attention layer in one step: flat queries for the new
tokens of every sequence, a block pool holding each sequence's earlier K/V (and this step's,
already written), and the metadata that says which token belongs where. Blocks are handed out
in shuffled order, so a kernel that ignored the block table and read the pool as if it were
contiguous would fail every test.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PagedBatch:
    q: torch.Tensor                # [num_tokens, num_heads, head_dim]
    k_cache: torch.Tensor          # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor          # [num_blocks, block_size, num_kv_heads, head_dim]
    query_start_loc: torch.Tensor  # [num_seqs + 1] int64
    seq_lens: torch.Tensor         # [num_seqs] int64: cached context + new tokens
    block_tables: torch.Tensor     # [num_seqs, max_blocks] int64, padded with 0
    max_query_len: int
    max_seq_len: int


def random_paged_batch(q_lens: list[int], ctx_lens: list[int], num_heads: int, num_kv_heads: int,
                       head_dim: int, block_size: int = 16, dtype=torch.float32, device="cpu",
                       seed: int = 0, spare_blocks: int = 3) -> PagedBatch:
    """Request i brings q_lens[i] new tokens on top of ctx_lens[i] cached ones.

    Unused slots of the pool hold 100, not zero, so reading past a sequence's end
    shows up as a wrong answer instead of hiding behind zeros.
    """
    g = torch.Generator(device).manual_seed(seed)
    seq_lens = [q + c for q, c in zip(q_lens, ctx_lens)]
    blocks_per_seq = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(blocks_per_seq) + spare_blocks
    order = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(seed)).tolist()
    tables, i = [], 0
    for n in blocks_per_seq:
        tables.append(order[i:i + n])
        i += n
    max_blocks = max(blocks_per_seq)
    tables = [t + [0] * (max_blocks - len(t)) for t in tables]
    as_long = lambda x: torch.tensor(x, dtype=torch.int64, device=device)  # noqa: E731
    block_tables = as_long(tables)

    # Slots the sequences own get random K/V; every other slot holds 100.
    slots = torch.cat([block_tables[i, torch.arange(n, device=device) // block_size] * block_size
                       + torch.arange(n, device=device) % block_size
                       for i, n in enumerate(seq_lens)])                  # (sum(seq_lens),)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.full(shape, 100.0, device=device, dtype=dtype)
    v_cache = torch.full(shape, 100.0, device=device, dtype=dtype)
    rand = lambda *s: torch.randn(*s, generator=g, device=device).to(dtype)  # noqa: E731
    k_cache.view(-1, num_kv_heads, head_dim)[slots] = rand(len(slots), num_kv_heads, head_dim)
    v_cache.view(-1, num_kv_heads, head_dim)[slots] = rand(len(slots), num_kv_heads, head_dim)
    return PagedBatch(
        q=rand(sum(q_lens), num_heads, head_dim), k_cache=k_cache, v_cache=v_cache,
        query_start_loc=as_long([0] + torch.tensor(q_lens).cumsum(0).tolist()),
        seq_lens=as_long(seq_lens), block_tables=block_tables,
        max_query_len=max(q_lens), max_seq_len=max(seq_lens))
