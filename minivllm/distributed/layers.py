"""Tensor-parallel layers: one model split across N processes, each holding 1/N of every layer.

vLLM twins: vllm/model_executor/layers/linear.py (ColumnParallelLinear, RowParallelLinear) and
vllm/model_executor/layers/vocab_parallel_embedding.py (VocabParallelEmbedding, ParallelLMHead).
vLLM keeps them with the other layers because its models are built from them; here they live in
distributed/ beside the process group and the executor, because the model is built from plain
nn.Linear and `parallelize` swaps these in: the whole of tensor parallelism is one package.

Megatron-LM's split (Shoeybi et al. 2019), as vLLM and gpt-fast do it. In each decoder layer:

    q/k/v_proj, gate/up_proj   column-parallel: rank r keeps its slice of the output features
                               (its attention heads, its share of the MLP's intermediate units)
    o_proj, down_proj          row-parallel: rank r keeps the matching input features and
                               computes a partial sum; one all-reduce adds the N partials
    attention                  needs nothing from other ranks: a head only reads its own K/V

so a layer costs two all-reduces of (tokens, hidden). The embedding and lm_head are split over
the vocabulary: each rank embeds the token ids in its range (zeros elsewhere, then an
all-reduce), and computes the logits of its range (then an all-gather). Each rank's KV pool
holds only its KV heads; with fewer KV heads than ranks (GQA), a KV head is replicated on the
tp / kv_heads ranks whose query heads read it.

Left out, compared with vLLM: fused QKV / gate-up weights (QKVParallelLinear,
MergedColumnParallelLinear), vocab padding to a multiple of 64, sequence parallelism, and
quantized or LoRA variants of these layers (VllmConfig refuses those options with tp > 1).
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from minivllm.attention.layer import Attention
from minivllm.config import HfConfig
from minivllm.distributed.parallel_state import TensorParallelGroup, kv_head_range
from minivllm.models.llama import projection_layers


class ColumnParallelLinear(nn.Linear):
    """y[:, rows] = x @ W[rows].T: this rank's output features; no communication."""

    def __init__(self, full: nn.Linear, rows: slice):
        super().__init__(full.in_features, rows.stop - rows.start, bias=full.bias is not None)
        self.rows = rows

    def shard(self, tensor: torch.Tensor) -> torch.Tensor:   # called by load_weights
        return tensor[self.rows]


class RowParallelLinear(nn.Linear):
    """y = sum over ranks of x[:, cols] @ W[:, cols].T: a partial product, then an all-reduce.
    No bias: o_proj and down_proj have none in the Llama family (models/llama.py)."""

    def __init__(self, full: nn.Linear, cols: slice, group: TensorParallelGroup):
        super().__init__(cols.stop - cols.start, full.out_features, bias=False)
        self.cols = cols
        self.group = group

    def shard(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor[:, self.cols]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.group.all_reduce(F.linear(x, self.weight))         # (T, out) on every rank


class VocabParallelEmbedding(nn.Module):
    """Rank r holds rows [r * per, (r + 1) * per) of the embedding table (per = vocab / tp,
    rounded up, the last shard zero-padded); a token outside that range embeds to zeros here,
    and the all-reduce brings in the one rank that has it."""

    def __init__(self, vocab_size: int, hidden: int, group: TensorParallelGroup):
        super().__init__()
        self.vocab_size = vocab_size
        self.group = group
        self.per_rank = -(-vocab_size // group.size)
        self.start = group.rank * self.per_rank
        self.weight = nn.Parameter(torch.empty(self.per_rank, hidden))

    def shard(self, tensor: torch.Tensor) -> torch.Tensor:
        rows = tensor[self.start:self.start + self.per_rank]
        return torch.cat([rows, rows.new_zeros(self.per_rank - rows.shape[0], *rows.shape[1:])])

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        local = input_ids - self.start                                  # (T,)
        mine = (local >= 0) & (local < self.per_rank)
        x = F.embedding(local.clamp(0, self.per_rank - 1), self.weight) * mine[:, None]
        return self.group.all_reduce(x)                                 # (T, hidden)


class ParallelLMHead(VocabParallelEmbedding):
    """The same vocabulary split, used as a linear layer: each rank computes the logits of its
    range, and an all-gather puts the row back together on every rank."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.group.all_gather(F.linear(hidden, self.weight))  # (S, per_rank * tp)
        return logits[:, :self.vocab_size]


PARALLEL_LAYERS = (ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding)


def parallelize(model: nn.Module, config: HfConfig, group: TensorParallelGroup) -> HfConfig:
    """Swap model's layers (on the meta device, before any weight exists) for this rank's
    shards. Returns the config of this rank's attention: its query and KV head counts."""
    r = group.rank
    n = group.size
    hd = config.head_dim
    nh = config.num_attention_heads // n
    inter = config.intermediate_size // n
    kv = kv_head_range(config, r, n)
    q_rows = slice(r * nh * hd, (r + 1) * nh * hd)                   # this rank's query heads
    kv_rows = slice(kv.start * hd, kv.stop * hd)                     # ... and the KV they read
    mlp_rows = slice(r * inter, (r + 1) * inter)
    columns = {"q_proj": q_rows, "k_proj": kv_rows, "v_proj": kv_rows,
               "gate_proj": mlp_rows, "up_proj": mlp_rows}
    rows = {"o_proj": q_rows, "down_proj": mlp_rows}                 # one all-reduce each
    for p in projection_layers(model):
        if p.name in columns:
            p.replace(ColumnParallelLinear(p.linear, columns[p.name]))
        else:
            p.replace(RowParallelLinear(p.linear, rows[p.name], group))
    for layer in model.model.layers:                                 # attention over its heads
        a = layer.self_attn
        a.nh = nh
        a.nkv = len(kv)
        a.attn = Attention(nh, len(kv), hd)
    model.model.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size, group)
    model.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, group)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    return replace(config, num_attention_heads=nh, num_key_value_heads=len(kv))


def weight_bytes(model: nn.Module) -> dict[str, int]:
    """Bytes of this rank's weights: all of them, and those of the split layers."""
    sizes = {id(p): (p.numel() * p.element_size(), isinstance(m, PARALLEL_LAYERS))  # tied: once
             for m in model.modules() for p in m.parameters(recurse=False)}
    return {"total": sum(b for b, _ in sizes.values()),
            "split": sum(b for b, split in sizes.values() if split)}
