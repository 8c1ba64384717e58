"""The Llama family as one readable module: Llama 2/3, SmolLM2, Qwen2 (q/k/v bias) and Qwen3
(per-head RMSNorm on q and k). vLLM twin: vllm/model_executor/models/llama.py (and qwen2.py,
qwen3.py).

Unlike Hugging Face's implementation, which works on padded [batch, seq] rectangles, this model
takes a *flat* batch: the new tokens of every sequence in the step, concatenated, each with its
explicit position. Attention is the only layer that needs to know which token belongs to which
sequence, and it learns that from AttentionMetadata. Everything else (norms, projections, MLP)
is per-token and does not care. That is what lets one forward pass mix prefills and decodes.

Parameter names match Hugging Face's, so checkpoints load by name.
Follows: Llama (Touvron et al. 2023), RoPE (Su et al. 2021), GQA (Ainslie et al. 2023).

The model is built with plain nn.Linear projections; the add-ons that change them (tensor
parallelism's shards, weight-only quantization, LoRA) swap them after construction, all through
`projection_layers` below, so this file never names them. An add-on may also fuse q/k/v into
one `qkv_proj` and gate/up into one `gate_up_proj` (vLLM's `packed_modules_mapping`):
quantization does, since at batch 1 a quantized GEMV costs about as much to call as to run
(measured in docs/benchmarks.md: 4 matmuls a layer instead of 7). Float models stay unfused
(no faster on a 2-core CPU, batch 1 to 16, and LoRA and TP shard or wrap each projection).

Left out, compared with vLLM's model files: custom fused kernels (RMSNorm + residual,
SiLU-and-mul, rotary), and the other architectures (MoE, sliding-window, multi-modal).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from minivllm.attention.layer import Attention
from minivllm.attention.metadata import AttentionMetadata
from minivllm.config import HfConfig
from minivllm.forward_context import set_forward_context


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.float()                        # the variance in fp32, as every reference does
        return self.weight * (y * (y.pow(2).mean(-1, keepdim=True) + self.eps).rsqrt()).to(x.dtype)


def rope_inv_freq(config: HfConfig) -> torch.Tensor:
    """Rotation frequency of each pair of dimensions, with Llama 3's long-context rescaling."""
    d = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    scaling = config.rope_scaling or {}
    kind = scaling.get("rope_type")
    if kind is None:
        return inv_freq
    if kind == "linear":
        return inv_freq / scaling["factor"]
    if kind != "llama3":
        raise ValueError(f"unsupported rope_type {kind!r}: minivllm has default, linear, llama3")
    # Llama 3: slow (long-wavelength) pairs are stretched by `factor`, fast ones are kept, and the
    # band between is interpolated smoothly.
    factor = scaling["factor"]
    low = scaling["low_freq_factor"]
    high = scaling["high_freq_factor"]
    old_len = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    return torch.where(medium, smoothed, scaled)


class RotaryEmbedding(nn.Module):
    """cos/sin tables for every position, computed once; rotate q and k by their positions."""

    def __init__(self, config: HfConfig):
        super().__init__()
        self.config = config
        self.cos = self.sin = None          # (P, D) tables, made by build()

    def build(self, max_positions: int, device: torch.device, dtype: torch.dtype) -> None:
        inv_freq = rope_inv_freq(self.config).to(device)
        freqs = torch.arange(max_positions, device=device).float()[:, None] * inv_freq[None]
        # sin's first half negated: x.roll(D/2) * sin is then HF's rotate_half(x) * sin, 1 op not 3
        self.cos = torch.cat([freqs, freqs], dim=-1).cos().to(dtype)   # (P, D)
        self.sin = torch.cat([-freqs.sin(), freqs.sin()], dim=-1).to(dtype)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The step's cos/sin rows, looked up once and shared by every layer: (T, 1, D)."""
        return self.cos[positions][:, None], self.sin[positions][:, None]


def apply_rotary(q: torch.Tensor, k: torch.Tensor, cos_sin: tuple[torch.Tensor, torch.Tensor]):
    """Rotate each (x_i, x_{i+D/2}) pair of q and k by its token's position angle."""
    cos, sin, half = *cos_sin, q.shape[-1] // 2
    return q * cos + q.roll(half, -1) * sin, k * cos + k.roll(half, -1) * sin


def linear(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """layer(x); a plain fp32 nn.Linear on a CPU at up to 64 rows (decode) as (W x^T)^T, copied
    back to rows: MKL streams W instead of repacking it (batch 4: 0.68x a step's CPU); strided,
    the next GEMM ran 1.5x slower. Prefill keeps F.linear (512 rows: 148 vs 128 GFLOP/s here).
    The rows become columns, padded with zeros: one row to two (with one column the product is
    a matrix-vector one, sgemv, which read the 113 MB LM head at 17 GB/s against 45 GB/s for
    two columns), and past 8 rows to a multiple of 8, the blocks MKL's GEMM works in: a count
    off them paid for the whole block and more (Zen 3: 15 rows 139 ms, 16 rows 70 ms). Not
    while torch.compile traces: each test on the rows is a guard, and each guard one more
    graph (5 graphs against 3 for the same steps)."""
    rows = x.shape[0]
    transposed = (x.device.type, x.dtype) == ("cpu", torch.float32) and rows <= 64
    if type(layer) is not nn.Linear or not transposed:  # LoRA, quant, TP; CUDA; bf16; prefill
        return layer(x)
    blocks = not torch.compiler.is_compiling() and rows > 8
    cols = 2 if rows == 1 else -(-rows // 8) * 8 if blocks else rows
    padded = F.pad(x, (0, 0, 0, cols - rows)) if cols > rows else x
    y = F.linear(layer.weight, padded)[:, :rows].T.clone(memory_format=torch.contiguous_format)
    return y if layer.bias is None else y + layer.bias


class LlamaAttention(nn.Module):
    def __init__(self, config: HfConfig):
        super().__init__()
        h, nh, nkv, hd = (config.hidden_size, config.num_attention_heads,
                          config.num_key_value_heads, config.head_dim)
        self.q_proj = nn.Linear(h, nh * hd, bias=config.attention_bias)   # Qwen2: q/k/v bias
        self.k_proj = nn.Linear(h, nkv * hd, bias=config.attention_bias)
        self.v_proj = nn.Linear(h, nkv * hd, bias=config.attention_bias)
        self.o_proj = nn.Linear(nh * hd, h, bias=False)
        if config.qk_norm:
            self.q_norm = RMSNorm(hd, config.rms_norm_eps)
            self.k_norm = RMSNorm(hd, config.rms_norm_eps)
        self.qk_norm = config.qk_norm
        self.nh = nh
        self.nkv = nkv
        self.hd = hd
        self.attn = Attention(nh, nkv, hd)
        self.qkv_proj = None        # q, k, v as one module, when an add-on fused them

    def forward(self, x, md: AttentionMetadata, cos_sin):
        T = x.shape[0]
        if self.qkv_proj is not None:                                   # one matmul, not three
            q, k, v = self.qkv_proj(x).split([self.nh * self.hd, self.nkv * self.hd,
                                              self.nkv * self.hd], -1)
        else:
            q, k, v = linear(self.q_proj, x), linear(self.k_proj, x), linear(self.v_proj, x)
        q = q.view(T, self.nh, self.hd)                                 # (T, nh, hd)
        k = k.view(T, self.nkv, self.hd)                                # (T, nkv, hd)
        v = v.view(T, self.nkv, self.hd)                                # (T, nkv, hd)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rotary(q, k, cos_sin)
        o = self.attn(q, k, v, md)                                      # (T, nh, hd)
        return linear(self.o_proj, o.reshape(T, self.nh * self.hd))


class LlamaMLP(nn.Module):
    def __init__(self, config: HfConfig):
        super().__init__()
        h = config.hidden_size
        i = config.intermediate_size
        self.gate_proj = nn.Linear(h, i, bias=False)
        self.up_proj = nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)
        self.gate_up_proj = None    # gate and up as one module, when an add-on fused them

    def forward(self, x):
        if self.gate_up_proj is not None:
            gate, up = self.gate_up_proj(x).chunk(2, -1)                # (T, i) each
        else:
            gate, up = linear(self.gate_proj, x), linear(self.up_proj, x)
        return linear(self.down_proj, F.silu(gate) * up)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: HfConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = LlamaAttention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = LlamaMLP(config)

    def forward(self, x, md, cos_sin):
        x = x + self.self_attn(self.input_layernorm(x), md, cos_sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class PPMissingLayer(nn.Identity):
    """A module another pipeline stage holds: no weights here, none loaded (vLLM twin:
    PPMissingLayer in vllm/model_executor/models/utils.py; distributed/pipeline.py places it)."""


class LlamaModel(nn.Module):
    def __init__(self, config: HfConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(config)
                                    for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(config)
        # The layers this process runs: all, unless a pipeline stage holds only some
        # (minivllm/distributed/pipeline.py, which also drops the embedding and the norm).
        self.start_layer, self.end_layer = 0, config.num_hidden_layers

    def forward(self, input_ids, positions, md, hidden=None):
        """hidden: the previous pipeline stage's output, instead of embedding input_ids."""
        x = self.embed_tokens(input_ids) if hidden is None else hidden  # (T, hidden)
        cos_sin = self.rotary_emb(positions)
        for layer in self.layers[self.start_layer:self.end_layer]:
            x = layer(x, md, cos_sin)
        return self.norm(x)              # a stage before the last: PPMissingLayer, x as it is


# --8<-- [start:causal_lm]
class LlamaForCausalLM(nn.Module):
    def __init__(self, config: HfConfig):
        super().__init__()
        self.config = config
        self.model = LlamaModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.attention_by_name = {}     # what a compiled graph's attention op looks up
        for i, layer in enumerate(self.model.layers):
            attn = layer.self_attn.attn
            attn.layer_name = f"model.layers.{i}.self_attn.attn"
            self.attention_by_name[attn.layer_name] = attn

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                md: AttentionMetadata, hidden: torch.Tensor | None = None) -> torch.Tensor:
        """input_ids, positions: (T,) flat over the batch -> hidden states (T, hidden)."""
        with set_forward_context(md, self.attention_by_name):   # for a compiled self.model
            return self.model(input_ids, positions, md, hidden)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        # Only the rows that will be sampled reach here: a 500-token prefill needs 1 row of
        # logits, not 500 x vocab (49,152 floats each for SmolLM2).
        return linear(self.lm_head, hidden).float()
# --8<-- [end:causal_lm]

    def attention_layers(self) -> list[Attention]:
        """This process's (a pipeline stage's layers only)."""
        body = self.model
        return [layer.self_attn.attn for layer in body.layers[body.start_layer:body.end_layer]]


# The seven projections of a decoder layer (Hugging Face's names), and the submodule holding each.
PROJECTIONS = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn",
               "o_proj": "self_attn", "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}
# The fused modules an add-on may make, and their parts in output order (vLLM's name).
PACKED_MODULES_MAPPING = {"qkv_proj": ["q_proj", "k_proj", "v_proj"],
                          "gate_up_proj": ["gate_proj", "up_proj"]}


@dataclass(frozen=True, slots=True)
class Projection:
    """One projection of one decoder layer, and where it hangs (to swap it for another module)."""

    layer: int             # decoder layer index
    name: str              # q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj or down_proj
    parent: nn.Module      # the LlamaAttention or LlamaMLP that holds it
    linear: nn.Module      # the module there now: nn.Linear, or what an add-on put in its place

    @property
    def path(self) -> str:
        """Its name in the model, as in the checkpoint: model.layers.3.self_attn.q_proj."""
        return f"model.layers.{self.layer}.{PROJECTIONS[self.name]}.{self.name}"

    def replace(self, module: nn.Module) -> None:
        setattr(self.parent, self.name, module)


def projection_layers(model: LlamaForCausalLM) -> Iterator[Projection]:
    """Every decoder layer's seven projections, in order: the layers tensor parallelism shards
    (distributed/layers.py), quantization rounds (quantization/weight_only.py) and LoRA wraps
    (lora/models.py). Each is read when reached, so a caller may replace it as it goes."""
    for i, layer in enumerate(model.model.layers):
        for name, parent_name in PROJECTIONS.items():
            parent = getattr(layer, parent_name)
            yield Projection(i, name, parent, getattr(parent, name))
