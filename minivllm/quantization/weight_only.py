"""Weight-only quantization: int8 per output channel, int4 in groups, swapped in after loading.
vLLM twin: vllm/model_executor/layers/quantization/ (its many methods; this is the shape of
gpt-fast's int8 / int4 weight-only layers).

Decoding one token reads every weight once and does two FLOPs per weight: at batch 1 the step
is as fast as the weights stream from memory. Storing them in fewer bits moves fewer bytes:

    int8      q = round(w / s), s = max|w_row| / 127      one fp scale per output row
    int4-gG   q = round((w - m) / d) in 0..15              per G weights of a row: scale d, min m
              two q per byte; w ~ q * d + m                (GGUF's Q4_1 is this with G = 32)

The activations stay in floating point ("weight-only", W8A16 / W4A16): each kernel turns the
weights back into floats tile by tile, inside the matmul, never as a whole matrix in memory.

    CPU   torch's own weight-only kernels (aten._weight_int8pack_mm, _weight_int4pack_mm_for_cpu,
          what gpt-fast calls); they take bf16 activations, so x goes in as bf16
    CUDA  kernels/quant_matmul.py: a Triton matmul that dequantizes each weight tile it loads

`quantize_model` swaps the seven nn.Linear of every decoder layer, found by models/llama.py's
`projection_layers`, for four QuantLinear: q/k/v become one `qkv_proj` and gate/up one
`gate_up_proj` (the model's fused slots). Each output row is quantized on its own (its scale,
its groups along K), so a fused layer holds exactly the rows its parts would, and gives the
same tokens in fewer calls: at batch 1 a 576 x 192 int8 GEMV is mostly the cost of calling it.
The LM head gets an int8 copy of its own (per-row scales, torch's int8 kernel, as llama.cpp
keeps it in Q8_0) for every format, int4 ones too (`quantize_lm_head=True`, the default;
vLLM's GPTQ `lm_head_quantized` is opt-in, since its checkpoints ship a float head): in fp32 it
was 113 of the 180 MB an int4 token read, and int8 rounding of it costs +0.2-0.3% perplexity
(2048 tokens: int8 7.690 -> 7.711, int4-g32 7.682 -> 7.704, fp32 7.679; int4 groups cost far
more: 14.20 against 13.06 on 400 tokens). It unties the head from the embedding table, which
stays in float: a lookup reads one row a token, so the table costs memory, not bandwidth.
Left out, and why: the embedding table (a lookup reads one row per token, so its bytes cost memory, not time);
the norms (tiny). The float projections are dropped once quantized (kept, they made an int8
model hold more memory than the float one): to change format, `unquantize_model` puts empty
nn.Linear back and the runner reloads the checkpoint.

Left out, compared with vLLM: calibrated methods (GPTQ, AWQ, SmoothQuant), activation
quantization (W8A8, FP8 GEMMs), loading pre-quantized checkpoints, Marlin/Machete kernels and
MoE. The KV-cache half of quantization (kv_cache_dtype="fp8" | "int8") is in kernels/write_kv.py
(the row format) and minivllm/attention/torch_attention.py.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import minivllm.platforms  # noqa: F401  (first: Triton's interpreter switch, before kernels/)
from kernels.quant_matmul import (dequantize_int4, dequantize_int8, quantize_int4,
                                  quantize_int8, unpack_int4)
from minivllm.config import INT4_GROUP_SIZES
from minivllm.models.llama import PACKED_MODULES_MAPPING, projection_layers
from minivllm.quantization import parse_quantization

# False: the seven projections quantized one by one (the slower path the tests compare against).
FUSE_PROJECTIONS = True


class QuantLinear(nn.Module):
    """y = x @ dequant(W).T + b, with W stored as int8 or packed int4 (see the module docstring)."""

    def __init__(self, linear: nn.Linear, method: str, group_size: int = 0):
        super().__init__()
        self.method = method
        self.group_size = group_size
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.part_widths = [linear.out_features]    # a fused layer's parts (quantize_model)
        w = linear.weight.detach()
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone(),
                                                                 requires_grad=False)
        self.use_torch_cpu_kernel = w.device.type == "cpu"
        self.mins = self.scales_zeros = None
        if method == "int8":
            self.qweight, self.scales = quantize_int8(w)
            if self.use_torch_cpu_kernel:     # torch's kernel takes them in bf16: keep those
                self.scales = self.scales.to(torch.bfloat16)
        elif self.use_torch_cpu_kernel:
            # torch's int4 CPU kernel takes N in tiles of 16 rows: pad with zero rows (they
            # quantize to zeros) and drop their outputs, so any width works (72 -> 80 here).
            w = F.pad(w, (0, 0, 0, -self.out_features % 16))
            q, d, m = quantize_int4(w, group_size)
            # torch's CPU layout: q - 8 in [-8, 7], w ~ (q - 8) * d + z with z = m + 8d,
            # as (K/G, N, 2) [scale, zero] pairs; the weight repacked into its own tiles.
            self.scales_zeros = torch.stack([d, m + 8 * d], -1).transpose(0, 1) \
                .contiguous().to(torch.bfloat16)
            self.qweight = torch.ops.aten._convert_weight_to_int4pack_for_cpu(
                unpack_int4(q).to(torch.int32), 1)
            self.scales = None                # the packed tensor holds everything
        else:
            self.qweight, self.scales, self.mins = quantize_int4(w, group_size)

    def dequantized_weight(self) -> torch.Tensor:
        """The float weight this module stands for (N, K), for references and error plots."""
        if self.method == "int8":
            return dequantize_int8(self.qweight, self.scales.float())
        if self.use_torch_cpu_kernel:     # unpack through the kernel itself: x = identity
            eye = torch.eye(self.in_features, dtype=torch.bfloat16)
            return torch.ops.aten._weight_int4pack_mm_for_cpu(
                eye, self.qweight, self.group_size, self.scales_zeros).float().T[:self.out_features]
        return dequantize_int4(self.qweight, self.scales, self.mins, self.group_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, self.in_features)
        if self.use_torch_cpu_kernel:
            xb = x2.to(torch.bfloat16)
            if self.method == "int8":
                y = torch.ops.aten._weight_int8pack_mm(xb, self.qweight, self.scales)
            else:
                y = torch.ops.aten._weight_int4pack_mm_for_cpu(
                    xb, self.qweight, self.group_size, self.scales_zeros)[:, :self.out_features]
            y = y.to(x.dtype)
        else:
            from kernels.quant_matmul import quant_matmul
            y = quant_matmul(x2, self.qweight, self.scales, self.mins, self.group_size)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        g = f", group_size={self.group_size}" if self.method == "int4" else ""
        return f"{self.in_features}, {self.out_features}, {self.method}{g}"


def quantize_model(model: nn.Module, method: str | None, lm_head: bool = True) -> None:
    """Put `model`'s float projections in format `method` (None: leave them), dropping the float
    weights, and its LM head in int8 if `lm_head` (untied: the embedding keeps the float table).
    A model already quantized goes through `unquantize_model` and a reload first."""
    spec = parse_quantization(method)
    if spec is None:
        return
    projections = list(projection_layers(model))         # the 7 projections of every layer
    for p in projections:                                 # refuse before changing anything
        if type(p.linear) is not nn.Linear:
            raise ValueError(f"quantization={method!r}: {p.path} is a "
                             f"{type(p.linear).__name__}, not a plain nn.Linear; weight-only "
                             "quantization does not combine with LoRA or tensor-parallel "
                             "linears in minivllm (nor with a model quantized already)")
        if spec[0] == "int4" and p.linear.in_features % spec[1]:
            raise ValueError(f"quantization={method!r}: group size {spec[1]} does not divide "
                             f"{p.path}'s input dimension {p.linear.in_features}; use a group "
                             f"size that does (one of {list(INT4_GROUP_SIZES)})")
    parents: dict[nn.Module, dict[str, nn.Linear]] = {}
    for p in projections:
        parents.setdefault(p.parent, {})[p.name] = p.linear
    for parent, linears in parents.items():
        for fused, parts in PACKED_MODULES_MAPPING.items():
            if FUSE_PROJECTIONS and all(name in linears for name in parts):
                packed = QuantLinear(concat_linears([linears.pop(n) for n in parts]), *spec)
                packed.part_widths = [getattr(parent, n).out_features for n in parts]
                setattr(parent, fused, packed)
                for name in parts:
                    setattr(parent, name, None)
        for name, lin in linears.items():                 # o_proj, down_proj: on their own
            setattr(parent, name, QuantLinear(lin, *spec))
    if lm_head:                                           # int8 for every format (Q8_0's role)
        model.lm_head = QuantLinear(model.lm_head, "int8")


def concat_linears(linears: list[nn.Linear]) -> nn.Linear:
    """One nn.Linear whose output is the parts' outputs side by side (their rows stacked)."""
    first = linears[0]
    out = nn.Linear(first.in_features, sum(lin.out_features for lin in linears),
                    bias=first.bias is not None, device="meta")
    out.weight = nn.Parameter(torch.cat([lin.weight for lin in linears]), requires_grad=False)
    if first.bias is not None:
        out.bias = nn.Parameter(torch.cat([lin.bias for lin in linears]), requires_grad=False)
    return out


def unquantize_model(model: nn.Module) -> int:
    """Swap every QuantLinear (fused ones back into their parts) for an nn.Linear of its shape,
    uninitialized: the caller loads the checkpoint into it, the float weights were not kept.
    Returns how many projections it made (the head counts when it was not tied: it reloads)."""
    dtype = model.model.norm.weight.dtype
    n = 0
    if isinstance(model.lm_head, QuantLinear):            # a float head again, tied if it was
        q = model.lm_head
        model.lm_head = nn.Linear(q.in_features, q.out_features, bias=False, device="meta",
                                  dtype=dtype).to_empty(device=q.qweight.device)
        if model.config.tie_word_embeddings:
            model.lm_head.weight = model.model.embed_tokens.weight
        else:
            n += 1
    for p in list(projection_layers(model)):
        fused = next((f for f, parts in PACKED_MODULES_MAPPING.items() if p.name in parts), None)
        packed = getattr(p.parent, fused) if fused else None
        if packed is not None:                            # a part of a fused QuantLinear
            q = packed
            out = q.part_widths[PACKED_MODULES_MAPPING[fused].index(p.name)]
        elif isinstance(p.linear, QuantLinear):
            q = p.linear
            out = q.out_features
        else:
            continue
        empty = nn.Linear(q.in_features, out, bias=q.bias is not None, device="meta", dtype=dtype)
        p.replace(empty.to_empty(device=q.qweight.device))      # no time on a random init
        n += 1
    for p in projection_layers(model):                    # the fused slots empty again
        for fused in PACKED_MODULES_MAPPING:
            if hasattr(p.parent, fused):
                setattr(p.parent, fused, None)
    return n


def model_weight_bytes(model: nn.Module) -> int:
    """Bytes of every distinct weight tensor the model holds (tied ones once), quantized or not."""
    seen = set()
    total = 0
    for m in model.modules():
        own = [*m.parameters(recurse=False), *m.buffers(recurse=False)]
        if isinstance(m, QuantLinear):
            own = [m.qweight, m.scales, m.mins, m.scales_zeros, *own]
        for t in own:
            if t is not None and t.data_ptr() not in seen:
                seen.add(t.data_ptr())
                total += t.numel() * t.element_size()
    return total
