"""AttentionMetadata: where this step's new tokens go in the paged KV cache and what they may see
(vLLM twin: vllm/v1/attention/backends/utils.py, CommonAttentionMetadata). Built by the
ModelRunner once per step, read by every layer's attention, whatever the backend.

Every token's K and V live in a pool of fixed-size blocks, one pool per layer:

    k_cache, v_cache: [num_blocks, block_size, num_kv_heads, head_dim]

A sequence's `block_table` lists its blocks in order, so token j of that sequence sits in block
block_table[j // block_size], at offset j % block_size. Its *slot* is the flat index
block * block_size + offset. One step of the model does two things per layer:

  1. write the K/V of this step's new tokens into their slots (`slot_mapping`), then
  2. let each new token attend to every earlier token of its own sequence, wherever its blocks
     are (`block_tables`), causally.

The batch is flat: the new tokens of all sequences are concatenated ([num_tokens, ...]), and
`query_start_loc` marks where each sequence's tokens begin, as FlashAttention's varlen API and
vLLM do. A sequence may bring one token (decode), its whole prompt (prefill), or a chunk of it
over K/V already cached (chunked prefill, prefix-cache hits): the same metadata covers all three.

Left out (vLLM has them): a metadata builder per backend, and cascade attention's extra fields.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(slots=True)
class AttentionMetadata:
    """Where this step's tokens go and what they may see. Built by the ModelRunner each step."""

    slot_mapping: torch.Tensor      # [num_tokens] int64: cache slot of each new token
    query_start_loc: torch.Tensor   # [num_seqs + 1] int64: cumulative new-token counts
    seq_lens: torch.Tensor          # [num_seqs] int64: tokens in the cache after this step
    block_tables: torch.Tensor      # [num_seqs, max_blocks] int64, padded with 0
    max_query_len: int
    max_seq_len: int
    # The torch backend's gather indices depend on the batch, not on the layer: the first layer
    # builds them, the other layers of the step reuse them.
    torch_layout: object | None = None     # torch_attention.TorchBatchLayout
    varlen_layout: object | None = None    # kernels.cpu_attention.VarlenLayout (the fast path)
    # The Triton backend's decode partials: the ModelRunner's, allocated once per engine.
    decode_scratch: object | None = None    # kernels.paged_attention.DecodeScratch
