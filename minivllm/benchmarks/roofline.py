"""One cost model for the course: this device's roofline, and what an engine step costs on it.

    peaks = measure_peaks("cpu", torch.float32)        # a large matmul and a large copy
    cost = StepCost.of(llm.engine.model_config.hf_config, torch.float32)
    flops, moved = cost.step([512], [512], sampled=1)  # one 512-token prefill
    flops, moved = cost.step([1] * 8, [40] * 8, sampled=8)   # 8 sequences decoding
    peaks.bound(flops, moved)                          # the fastest that step could run, s

A step's arithmetic intensity is FLOPs over bytes moved; below the device's ridge
(peak FLOP/s over peak bytes/s) it waits on memory, above it on arithmetic. Decode reads every
weight once to make one token per sequence, so at small batch it sits far below the ridge:
its best time is weight bytes over bandwidth, the roofline that batch-1 decode is judged
against. The model counts the linear layers, attention (QK^T and PV over the context) and the
LM head; norms, rotary and activations are left out (a few percent of the work), and the
bytes are a lower bound (weights once, KV read once, activations roughly).

No vLLM twin: vLLM has no counterpart in its engine; its benchmarks report achieved
throughput, and the roofline figures in its docs and papers are computed the same way.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DevicePeaks:
    """Measured peaks of one device for one dtype: FLOP/s of a large matmul, bytes/s of a
    large copy (read + write counted)."""
    flops: float
    bandwidth: float

    @property
    def ridge(self) -> float:
        """The arithmetic intensity (FLOP/byte) where the two roofs meet."""
        return self.flops / self.bandwidth

    def bound(self, flops: float, moved: float) -> float:
        """The least time a step of `flops` FLOPs moving `moved` bytes can take here."""
        return max(flops / self.flops, moved / self.bandwidth)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def measure_peaks(device="cpu", dtype=torch.float32, n: int = 1024, copy_mib: int = 128,
                  repeats: int = 3) -> DevicePeaks:
    """Best of `repeats`: an n x n matmul in `dtype` (FLOP/s) and a copy of `copy_mib` MiB
    (bytes/s, large enough to leave every cache). On a GPU pass n=8192, copy_mib=2048.
    The matmul is `a @ a.T`, a linear layer's layout (x @ W.T): on a CPU without bf16 units a
    bf16 `a @ a` takes a slow fallback (0.3 GFLOP/s here) that no layer of the model takes."""
    device = torch.device(device)
    a = torch.randn(n, n, device=device, dtype=dtype)
    x = torch.ones(copy_mib * 2**18, device=device, dtype=torch.float32)
    y = torch.zeros_like(x)
    a @ a.T, y.copy_(x)                                                  # warm up, touch pages
    flops = []
    bandwidth = []
    for _ in range(repeats):
        _sync(device)
        t = time.perf_counter()
        for _ in range(4):
            a @ a.T
        _sync(device)
        flops.append(4 * 2 * n**3 / (time.perf_counter() - t))
        t = time.perf_counter()
        y.copy_(x)
        _sync(device)
        bandwidth.append(2 * x.numel() * 4 / (time.perf_counter() - t))
    return DevicePeaks(max(flops), max(bandwidth))


@dataclass(frozen=True)
class StepCost:
    """FLOPs and bytes of a Llama-style forward, from the model's shapes."""
    linear_params: int          # every projection of every layer: 2 FLOPs per param per token
    head_params: int            # the LM head, paid once per sampled row
    layers: int
    q_dim: int
    kv_token_bytes: int         # K and V of one token, all layers
    hidden_bytes: int           # one token's hidden state
    elem: int                   # bytes per weight

    @classmethod
    def of(cls, mc, dtype=torch.float32) -> "StepCost":
        """From a HfConfig (hidden_size, intermediate_size, layers, heads, head_dim)."""
        elem = torch.empty((), dtype=dtype).element_size()
        h = mc.hidden_size
        i = mc.intermediate_size
        layers = mc.num_hidden_layers
        q = mc.num_attention_heads * mc.head_dim
        kv = mc.num_key_value_heads * mc.head_dim
        return cls(linear_params=layers * (h * (q + 2 * kv) + q * h + 3 * h * i),
                   head_params=h * mc.vocab_size, layers=layers, q_dim=q,
                   kv_token_bytes=2 * layers * kv * elem, hidden_bytes=h * elem, elem=elem)

    @property
    def weight_bytes(self) -> int:
        """What one forward must read at least once: every weight."""
        return (self.linear_params + self.head_params) * self.elem

    def step(self, new_tokens, context_lens, sampled: int) -> tuple[int, int]:
        """(FLOPs, bytes) of one step in which sequence i computes new_tokens[i] tokens and
        then holds context_lens[i]; `sampled` rows go through the LM head."""
        attn = sum(4 * self.layers * self.q_dim * sum(range(c - n + 1, c + 1))
                   for n, c in zip(new_tokens, context_lens))
        flops = 2 * self.linear_params * sum(new_tokens) + attn + 2 * self.head_params * sampled
        moved = (self.weight_bytes + self.kv_token_bytes * sum(context_lens)
                 + 4 * self.hidden_bytes * sum(new_tokens))
        return flops, moved
