"""The draft-model proposer of speculative decoding (vLLM twin:
vllm/v1/spec_decode/draft_model.py): a smaller model with the target's vocabulary guesses k
tokens, one cheap decode step at a time, and the target checks them all in one forward
(minivllm/spec_decode/decoder.py does the checking; this file only guesses).

The draft runs on the engine's own machinery: a ModelRunner (its weights and its own paged KV
pool) and a BlockManager. Every target sequence that speculates has a *shadow* sequence on
the draft side holding the same tokens. Each step:

    sync       the shadow takes the target's tokens; it keeps the K/V of the prefix both
               agree on (everything up to the first rejected draft) and drops the rest
    catch up   one forward computes what the shadow lacks: the whole prompt the first time,
               then the target's correction or bonus token (1 or 2 tokens)
    draft      k - 1 more one-token forwards; each step's argmax is the next guess

All shadows advance together, one batched forward per draft position. The guesses are greedy,
so the draft's distribution q is a point mass on each guess and the same acceptance rule as
for n-gram lookup keeps the output exact (greedy: identical tokens; sampling: the target's
distribution). Shadows of sequences that finished, were preempted or aborted are dropped.

The code takes any checkpoint with the target's vocabulary. The default model has no smaller
sibling here; `first_layers_checkpoint` cuts it to its first layers, an untrained "early
exit". That exercises every path (the tests use it), but it drafts badly: measured on
SmolLM2-135M at k = 4, greedy, the first 10 of 30 layers had 1% of drafts accepted, the
first 26 of 30 14-29%, and keeping first and last layers (8 + 4, every other one, 10 + 6)
0-5%. Early exit pays only for models trained for it (LayerSkip). A quantized copy of the
target (`"quantization": "int8"` in speculative_config) agrees with it 96-100% of the time;
on this CPU it still saves no wall time (each draft step reads a whole model's int8 weights,
and a k + 1-token verification costs about 1.5 plain steps here), but on a GPU at batch 1,
where verification is nearly free, it is the classic setup; a distilled small model is better.

Left out, compared with vLLM: sampled drafts with their probabilities as q, EAGLE / Medusa /
MTP heads that reuse the target's hidden states, a draft on its own GPUs (draft TP), and
CUDA graphs for the draft's decode steps.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from pathlib import Path

import torch

from minivllm.core.block_manager import BlockManager
from minivllm.config import ModelConfig
from minivllm.models.loader import load_hf_config, resolve_model_path
from minivllm.sampling_params import SamplingParams
from minivllm.core.sequence import Sequence, SequenceGroup


def first_layers_checkpoint(model: str | None, num_layers: int) -> Path:
    """A checkpoint of `model` (None: the default model) cut to its first `num_layers`
    decoder layers, with its embeddings, final norm and lm_head; written once, next to it."""
    src = resolve_model_path(model)
    config = json.loads((src / "config.json").read_text())
    if not 1 <= num_layers <= config["num_hidden_layers"]:
        raise ValueError(f"num_layers must be in 1..{config['num_hidden_layers']}, "
                         f"got {num_layers}")
    dst = src.parent / f"{src.name}-first{num_layers}"
    if (dst / "model.safetensors").is_file():
        return dst
    from safetensors import safe_open
    from safetensors.torch import save_file
    tmp = dst.with_name(dst.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for f in src.iterdir():                          # tokenizer files, chat template, ...
        if f.is_file() and f.suffix != ".safetensors" and f.name != "config.json":
            shutil.copy(f, tmp / f.name)
    (tmp / "config.json").write_text(json.dumps(config | {"num_hidden_layers": num_layers}))
    tensors = {}
    for file in sorted(src.glob("*.safetensors")):
        with safe_open(file, framework="pt") as f:
            for name in f.keys():
                layer = re.match(r"model\.layers\.(\d+)\.", name)
                if layer is None or int(layer.group(1)) < num_layers:
                    tensors[name] = f.get_tensor(name)
    save_file(tensors, tmp / "model.safetensors")
    shutil.rmtree(dst, ignore_errors=True)
    tmp.rename(dst)
    return dst


class DraftModelProposer:
    def __init__(self, model: str, target_runner, quantization: str | None = None):
        from minivllm.worker.worker import Worker
        path = resolve_model_path(model)
        config = ModelConfig.from_hf_dict(load_hf_config(path))
        target = target_runner.config
        if config.vocab_size != target.vocab_size:
            raise ValueError(f"speculative_config: the draft model at {path} has a vocabulary "
                             f"of {config.vocab_size} tokens, the target {target.vocab_size}: "
                             "a draft must share the target's tokenizer")
        # As many blocks as the target's pool: the draft then always fits what it must hold.
        engine_config = dataclasses.replace(
            target_runner.engine_config, speculative_config=None, preemption_mode="recompute",
            enable_prefix_caching=False, num_kv_blocks=target_runner.num_blocks,
            quantization=quantization)
        self.path = path
        worker = Worker(config, engine_config, path, target_runner.device, target_runner.dtype)
        worker.load_model()
        worker.initialize_cache(engine_config)
        self.runner = worker.model_runner
        self.block_manager = BlockManager(self.runner.num_blocks, self.runner.block_size)
        self.shadows: dict[int, Sequence] = {}        # target seq_id -> its draft-side twin

    def _sync(self, seq: Sequence) -> Sequence | None:
        """seq's shadow holding seq's tokens, with the K/V of the prefix they share kept;
        None when the draft pool has no room for it (seq then proposes nothing)."""
        bm = self.block_manager
        shadow = self.shadows.get(seq.seq_id)
        if shadow is None:
            shadow = SequenceGroup(f"draft:{seq.request_id}", None, list(seq.token_ids),
                                   SamplingParams(), -1).seqs[0]
            if not bm.can_allocate(shadow):
                return None
            bm.allocate(shadow, use_prefix_cache=False)
            self.shadows[seq.seq_id] = shadow
            return shadow
        old = shadow.token_ids
        new = seq.token_ids
        agree = next((i for i, (a, b) in enumerate(zip(old, new)) if a != b),
                     min(len(old), len(new)))
        shadow.token_ids = list(new)
        shadow.num_computed_tokens = min(shadow.num_computed_tokens, agree)
        bm.free_lookahead_slots(shadow)                 # blocks past the shadow's last token
        if not bm.can_append_slots(shadow):
            self.drop(seq.seq_id)
            return None
        bm.append_slots(shadow)
        return shadow

    def drop(self, seq_id: int) -> None:
        shadow = self.shadows.pop(seq_id, None)
        if shadow is not None:
            self.block_manager.free(shadow)

    @torch.inference_mode()
    def propose_batch(self, seqs: list[Sequence], rooms: list[int]) -> list[list[int]]:
        """Up to rooms[i] greedy guesses for seqs[i], from one batched forward per position."""
        for seq_id in set(self.shadows) - {s.seq_id for s in seqs}:
            self.drop(seq_id)                           # finished, preempted or not drafting
        drafts: list[list[int]] = [[] for _ in seqs]
        shadows = [self._sync(seq) for seq in seqs]
        live = [i for i, sh in enumerate(shadows) if sh is not None and rooms[i] > 0]
        while live:
            batch = [shadows[i] for i in live]
            num_new = [len(sh) - sh.num_computed_tokens for sh in batch]
            _, logits = self.runner.run(batch, num_new)
            for i, sh, token in zip(live, batch, logits.argmax(dim=-1).tolist()):
                sh.num_computed_tokens = len(sh)
                sh.token_ids.append(token)
                drafts[i].append(token)
            live = [i for i in live if len(drafts[i]) < rooms[i]]
            for i in list(live):                        # the next guess needs a slot
                if self.block_manager.can_append_slots(shadows[i]):
                    self.block_manager.append_slots(shadows[i])
                else:
                    live.remove(i)
        return drafts
