"""Multi-LoRA serving: one base model, many PEFT adapters, mixed in one batch. vLLM twin:
vllm/lora/models.py (LoRAModelManager) and vllm/lora/worker_manager.py (loading, the LRU).

An adapter turns a linear layer's W (N x K) into W + s B A, with A (r x K), B (N x r), r small
(8, 16) and s = lora_alpha / r (rslora: lora_alpha / sqrt(r)). Merging B A into W serves one
adapter at the price of a copy of the model per adapter, so multi-tenant servers never merge.
minivllm does what vLLM does (after Punica and S-LoRA):

  * at engine start every targeted nn.Linear (q, k, v, o, gate, up, down) is wrapped in a
    LoRALinear (layers.py) holding the A and B of `max_loras` slots, stacked and zero-padded to
    max_lora_rank (kernels/lora.py draws the layout); the base weights stay shared;
  * each step the runner tells the layers, once, which slot each token uses (-1: the base
    model), and every LoRALinear adds shrink + expand to its base output;
  * adapters are read from disk into host memory when a request names them (an LRU of
    max_cpu_loras), and copied into a slot when a step needs them (an LRU of max_loras slots);
    the scheduler never runs more distinct adapters at once than there are slots;
  * the adapter's id joins the prefix-cache key: the same prompt under two adapters has
    different K/V.

This file: adapter loading (load_adapter) and the LoRAManager (wrapping, host cache, slots).
LoRARequest is in request.py, LoRALinear in layers.py.

Left out, compared with vLLM: LoRA on the embeddings and LM head (extra vocabulary), PEFT's
per-module rank/alpha patterns, DoRA, fused qkv / gate-up shapes, tensor-parallel sharding of
A and B (VllmConfig refuses enable_lora with tp > 1), and adapters fetched from the hub
(local dirs only).
"""

from __future__ import annotations

import json
import math
import re
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

import minivllm.platforms  # noqa: F401  (first: Triton's interpreter switch, before kernels/)
from minivllm.lora.layers import LoRABatch, LoRALinear
from minivllm.lora.request import LoRARequest
from minivllm.models.llama import PROJECTIONS, projection_layers

# The projections a LoRA may target (all seven of a decoder layer), and the submodule holding each.
TARGETS = PROJECTIONS
_KEY = re.compile(r"(?:.*\.)?layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])\.weight")


@dataclass(slots=True)
class LoRAAdapter:
    """One adapter in host memory: (layer, module) -> (A (r, K), s B (N, r))."""

    rank: int
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes + b.nbytes for a, b in self.weights.values())


def load_adapter(req: LoRARequest, shapes: dict[str, tuple[int, int]], num_layers: int,
                 max_rank: int) -> LoRAAdapter:
    """Read and check a PEFT adapter directory; shapes: module -> (N, K) of the base layer."""
    from safetensors.torch import load_file
    where = f"LoRA adapter {req.lora_name!r} (id {req.lora_int_id}) at {req.lora_path}"
    path = Path(req.lora_path)
    files = path / "adapter_config.json", path / "adapter_model.safetensors"
    if not all(f.is_file() for f in files):
        raise ValueError(f"{where}: not a PEFT adapter directory (need adapter_config.json "
                         "and adapter_model.safetensors)")
    cfg = json.loads(files[0].read_text())
    r = cfg.get("r")
    targets = cfg.get("target_modules")
    if cfg.get("peft_type", "LORA") != "LORA" or cfg.get("use_dora"):
        raise ValueError(f"{where}: only plain LoRA is served, not {cfg.get('peft_type')} "
                         f"(use_dora={cfg.get('use_dora')})")
    if not isinstance(r, int) or r > max_rank:
        raise ValueError(f"{where}: rank r={r} exceeds max_lora_rank={max_rank}; start the "
                         f"engine with max_lora_rank >= {r}")
    if isinstance(targets, str) or cfg.get("modules_to_save") or cfg.get("rank_pattern") \
            or cfg.get("alpha_pattern") or cfg.get("bias", "none") != "none":
        raise ValueError(f"{where}: regex target_modules, modules_to_save, rank/alpha patterns "
                         "and LoRA biases are not supported")
    unknown = sorted(set(targets or []) - set(TARGETS))
    if unknown:
        raise ValueError(f"{where}: targets {unknown}, which this model's LoRA layers do not "
                         f"have (supported: {list(TARGETS)})")
    scale = cfg.get("lora_alpha", r) / (math.sqrt(r) if cfg.get("use_rslora") else r)
    pairs: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for key, tensor in load_file(files[1]).items():
        m = _KEY.fullmatch(key)
        if m is None or m[2] not in targets or int(m[1]) >= num_layers:
            raise ValueError(f"{where}: unexpected tensor {key!r} for a {num_layers}-layer "
                             f"model with targets {targets}")
        n, k = shapes[m[2]]
        want = (r, k) if m[3] == "A" else (n, r)
        if tuple(tensor.shape) != want:
            raise ValueError(f"{where}: {key} has shape {tuple(tensor.shape)}, expected {want}")
        pairs.setdefault((int(m[1]), m[2]), {})[m[3]] = tensor.float()
    weights = {lm: (ab["A"], ab["B"] * scale) for lm, ab in pairs.items() if len(ab) == 2}
    return LoRAAdapter(r, weights)


class LoRAManager:
    """Wraps the model's projections and keeps adapters in host memory and in slots."""

    def __init__(self, model: nn.Module, lora_config, device: torch.device):
        self.max_loras = lora_config.max_loras
        self.max_rank = lora_config.max_lora_rank
        self.max_cpu_loras = lora_config.max_cpu_loras or self.max_loras
        from kernels import lora as ops          # Triton imported here, not at engine import
        self.model = model
        self.batch = LoRABatch(ops, use_kernels=device.type == "cuda")
        self.layers: dict[tuple[int, str], LoRALinear] = {}
        self.shapes: dict[str, tuple[int, int]] = {}
        for p in projection_layers(model):
            if type(p.linear) is not nn.Linear:     # VllmConfig refuses the other swaps
                raise ValueError(f"enable_lora wraps nn.Linear layers; {p.path} is a "
                                 f"{type(p.linear).__name__}")
            wrapped = LoRALinear(p.linear, self.batch, self.max_loras, self.max_rank)
            p.replace(wrapped)
            self.layers[p.layer, p.name] = wrapped
            self.shapes[p.name] = tuple(p.linear.weight.shape)
        self.cpu_cache: OrderedDict[int, LoRAAdapter] = OrderedDict()   # LRU, oldest first
        self.slots: OrderedDict[int, int] = OrderedDict()               # lora id -> slot, LRU
        self.requests: dict[int, LoRARequest] = {}
        self.num_disk_loads = self.num_slot_loads = self.num_slot_evictions = 0

    def unwrap(self) -> None:
        """Put the plain nn.Linear layers back (a reconfigure without LoRA)."""
        for p in projection_layers(self.model):
            if isinstance(p.linear, LoRALinear):
                p.replace(p.linear.base)

    @property
    def slot_bytes(self) -> int:
        """Memory one slot takes in every wrapped layer (A and B at max_lora_rank)."""
        return sum(w.lora_a[0].nbytes + w.lora_b[0].nbytes for w in self.layers.values())

    def add_lora(self, req: LoRARequest) -> LoRAAdapter:
        """Check the request against what the engine knows, and load the adapter to host
        memory if it is not there (evicting the least recently used one beyond max_cpu_loras)."""
        known = self.requests.get(req.lora_int_id)
        if known not in (None, req):          # the same id, another name or path
            raise ValueError(f"lora_int_id {req.lora_int_id} is already {known.lora_name!r} at "
                             f"{known.lora_path}; give each adapter its own id")
        if req.lora_int_id in self.cpu_cache:
            self.cpu_cache.move_to_end(req.lora_int_id)
            return self.cpu_cache[req.lora_int_id]
        adapter = load_adapter(req, self.shapes, len(self.model.model.layers), self.max_rank)
        self.num_disk_loads += 1
        self.requests[req.lora_int_id] = req
        self.cpu_cache[req.lora_int_id] = adapter
        while len(self.cpu_cache) > self.max_cpu_loras:
            self.cpu_cache.popitem(last=False)
        return adapter

    def _activate(self, lora_id: int, keep: set[int]) -> int:
        """A slot holding adapter lora_id: found, free, or taken from the least recently used
        adapter not in this step (`keep`)."""
        if lora_id in self.slots:
            self.slots.move_to_end(lora_id)
            return self.slots[lora_id]
        free = set(range(self.max_loras)) - set(self.slots.values())
        if free:
            slot = min(free)
        else:
            slot = self.slots.pop(next(i for i in self.slots if i not in keep))
            self.num_slot_evictions += 1
        adapter = self.add_lora(self.requests[lora_id])      # from host memory (or disk again)
        for (i, module), layer in self.layers.items():
            layer.lora_a[slot].zero_()
            layer.lora_b[slot].zero_()
            if (i, module) in adapter.weights:
                a, b = adapter.weights[i, module]
                layer.lora_a[slot, :adapter.rank].copy_(a)
                layer.lora_b[slot, :, :adapter.rank].copy_(b)
        self.slots[lora_id] = slot
        self.num_slot_loads += 1
        return slot

    def set_batch(self, lora_ids: list[int], num_new_tokens: list[int], device) -> None:
        """The step's per-token slots, from each sequence's adapter id (0: base model)."""
        used = set(lora_ids) - {0}
        if len(used) > self.max_loras:          # the scheduler's _lora_fits prevents this
            raise RuntimeError(f"a step needs {len(used)} adapters but max_loras={self.max_loras}")
        b = self.batch
        if not used:
            b.token_slots = None
            b.groups = []
            b.segments = None
            return
        slot_of = {i: self._activate(i, used) for i in sorted(used)} | {0: -1}
        per_token = [slot_of[i] for i, n in zip(lora_ids, num_new_tokens) for _ in range(n)]
        b.token_slots = torch.tensor(per_token, dtype=torch.int64, device=device)
        b.groups = [] if b.use_kernels else b.ops.slot_groups(b.token_slots)
        prefill = max(num_new_tokens) > 1          # a prefill chunk: segments (SGMV), not BGMV
        b.segments = b.ops.segments(b.token_slots) if b.use_kernels and prefill else None

    def stats(self) -> dict:
        return {"slots": dict(self.slots), "cpu_cache": list(self.cpu_cache),
                "num_disk_loads": self.num_disk_loads, "num_slot_loads": self.num_slot_loads,
                "num_slot_evictions": self.num_slot_evictions, "slot_bytes": self.slot_bytes}
