"""Pipeline parallelism: the decoder layers split into stages, one after another (vLLM twins:
vllm/distributed/utils.py's get_pp_indices, vllm/model_executor/models/utils.py's
make_layers).

Stage s of pp holds the layers get_pp_indices gives it; the first stage also holds the
embedding, the last the final norm and the LM head (and the embedding too when the head is tied
to it). Everything else is a PPMissingLayer (models/llama.py): no weights, nothing loaded, nothing
computed. A
step's tokens go through the stages in order:

    stage 0        embed the token ids, run its layers, send the hidden states on
    stage 1..pp-2  receive, run its layers, send on
    stage pp-1     receive, run its layers, norm, logits, sample

What crosses is one (tokens, hidden) tensor a step: the residual stream. vLLM sends two,
hidden_states and residual (its IntermediateTensors), because its fused add-and-RMSNorm keeps
the residual apart; this model adds the residual in place (models/llama.py), so one is all
there is. Each stage's KV pool holds its own layers only, so a stage holds more blocks in the
same bytes; the engine takes the smallest count of any stage.

A stage idles while the others work on its batch unless several batches are in flight: the
engine core keeps up to pp of them (engine/core.py's batch queue), so that with m micro-batches
a step of the pipeline costs m + pp - 1 stage-times, not m x pp.
"""

from __future__ import annotations

from dataclasses import replace

from torch import nn

from minivllm.config import HfConfig
from minivllm.models.llama import PPMissingLayer


def get_pp_indices(num_layers: int, stage: int, pp: int) -> tuple[int, int]:
    """Layers [start, end) of `stage`: num_layers // pp each, the remainder one apiece to the
    stages before the last (it also computes the logits), as vLLM splits them."""
    sizes = [num_layers // pp] * pp
    for i in range(num_layers % pp):
        sizes[-2 - i] += 1
    start = sum(sizes[:stage])
    return start, start + sizes[stage]


def check_pipeline_parallel(config: HfConfig, pp: int) -> None:
    """Refuse more stages than the model has layers (a stage of none would only relay)."""
    if pp > config.num_hidden_layers:
        raise ValueError(f"pipeline_parallel_size={pp} is more stages than the model has "
                         f"layers ({config.num_hidden_layers}): every stage needs one")


def split_for_stage(model: nn.Module, config: HfConfig, stage: int, pp: int,
                    kv_config: HfConfig) -> HfConfig:
    """Replace what `stage` does not hold with PPMissingLayer (on the meta device, before any
    weight exists); record its layers as model.model.start_layer / end_layer. Returns the
    config of its KV pool: kv_config with only its layers."""
    check_pipeline_parallel(config, pp)
    start, end = get_pp_indices(config.num_hidden_layers, stage, pp)
    body = model.model
    for i in [*range(start), *range(end, config.num_hidden_layers)]:
        body.layers[i] = PPMissingLayer()
    first, last = stage == 0, stage == pp - 1
    if not (first or (last and config.tie_word_embeddings)):
        body.embed_tokens = PPMissingLayer()
    if not last:
        body.norm = PPMissingLayer()
        model.lm_head = PPMissingLayer()
    body.start_layer, body.end_layer = start, end
    model.attention_by_name = {a.layer_name: a for a in model.attention_layers()}
    return replace(kv_config, num_hidden_layers=end - start)
