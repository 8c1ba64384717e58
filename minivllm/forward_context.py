"""The forward context: what every layer of one forward pass may read without being handed it
as an argument (vLLM twin: vllm/forward_context.py).

A compiled graph (compilation_config=3, worker/compilation.py) must not take the step's
AttentionMetadata as an input: its Python ints (the longest sequence, the batch layout) would
become guards, and the graph would be recompiled whenever a sequence grew. So the model sets
the metadata here for the length of one forward, and attention, the one layer that needs it,
runs as an op the graph cannot see into (attention/layer.py, `unified_attention`), which
reads it back: the graph holds the per-token math only, and one graph serves every step.
Left out, compared with vLLM's: the data-parallel and batch-descriptor fields, per-layer
metadata dicts (one metadata serves every layer here), and the timing of each forward.

The step's AttentionMetadata is held here, its class not imported: attention/ reads this
module, so this module names attention/ in comments only (vLLM imports the class for type
checkers, and the two packages then need each other: a cycle tests/test_import_graph.py refuses).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch


@dataclass(slots=True)
class ForwardContext:
    attn_metadata: object               # attention/metadata.py's AttentionMetadata
    attention_layers: dict[str, torch.nn.Module]    # layer_name -> the Attention module


_forward_context: ForwardContext | None = None


@contextmanager
def set_forward_context(attn_metadata: object,
                        attention_layers: dict[str, torch.nn.Module]) -> Iterator[None]:
    """The context of one forward pass; the previous one (None, mostly) comes back after."""
    global _forward_context
    previous = _forward_context
    _forward_context = ForwardContext(attn_metadata, attention_layers)
    try:
        yield
    finally:
        _forward_context = previous


def get_forward_context() -> ForwardContext:
    if _forward_context is None:
        raise RuntimeError("no forward context: attention ran outside the model's forward "
                           "(LlamaForCausalLM.forward sets it)")
    return _forward_context
