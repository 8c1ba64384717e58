"""LoRALinear: a base linear layer plus the stacked A and B of every slot (vLLM twin:
vllm/lora/layers/, its ColumnParallelLinearWithLoRA and friends, and the punica wrapper's
per-step metadata, here LoRABatch).

The step's layout (which slot each token uses) is set once per forward on one LoRABatch that
every LoRALinear reads; each layer then adds shrink (x A^T) and expand (. B^T, scaled) to its
base output: on CUDA through kernels/lora.py (BGMV for decode, SGMV for prefill segments), on
CPU one GEMM per adapter present.

Left out, compared with vLLM: LoRA on the embeddings and the LM head, fused qkv / gate-up
layers, tensor-parallel shards of A and B, and CUDA-graph-friendly metadata.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn


@dataclass(slots=True)
class LoRABatch:
    """The step's adapter layout, set once per forward and read by every LoRALinear."""

    ops: object                    # kernels/lora.py, imported with the engine's first LoRA layer
    use_kernels: bool              # CUDA: the Triton kernels; CPU: the torch reference
    token_slots: torch.Tensor | None = None     # (T,) slot per token, -1 = base
    groups: list[tuple[int, torch.Tensor]] = field(default_factory=list)  # torch path: slot, rows
    segments: tuple | None = None               # SGMV: (seg_start, seg_slots, longest)


class LoRALinear(nn.Module):
    """base(x), plus each token's adapter: y += s (x A^T) B^T, over stacked slots."""

    def __init__(self, base: nn.Linear, batch: LoRABatch, max_loras: int, max_rank: int):
        super().__init__()
        self.base = base
        self.batch = batch
        n, k = base.weight.shape
        w = base.weight
        self.register_buffer("lora_a", w.new_zeros(max_loras, max_rank, k), persistent=False)
        self.register_buffer("lora_b", w.new_zeros(max_loras, n, max_rank), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)                                                 # (T, N)
        b = self.batch
        if b.token_slots is None:                                        # no adapter this step
            return y
        k = b.ops
        if not b.use_kernels:                                # CPU: one GEMM per adapter present
            buf = k.lora_shrink_ref(x, self.lora_a, None, b.groups)       # (T, R)
            return k.lora_expand_ref(y, buf, self.lora_b, None, b.groups)
        x = x.contiguous()
        if b.segments is None:                                           # decode: BGMV
            return k.bgmv_expand(y, k.bgmv_shrink(x, self.lora_a, b.token_slots), self.lora_b,
                                 b.token_slots)
        return k.sgmv_expand(y, k.sgmv_shrink(x, self.lora_a, *b.segments), self.lora_b,
                             *b.segments)
