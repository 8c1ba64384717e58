"""The draft-model proposer of speculative decoding (vLLM twin:
vllm/v1/spec_decode/draft_model.py): a smaller model with the target's vocabulary guesses k
tokens, one cheap decode step at a time, and the target checks them all in one forward
(minivllm/spec_decode/decoder.py does the checking; this file only guesses).

The draft runs on the engine's own machinery: a ModelRunner (its weights and its own paged KV
pool, built by decoder.py's make_drafter beside the target's) and a BlockManager. Every target
sample that speculates has a *shadow* sequence on the draft side holding the same tokens.
Each step, after the target's sampling (SpeculativeDecoder.propose, in the target's runner):

    sync       the shadow takes the sample's tokens (the runner's state plus what it just
               sampled); it keeps the K/V of the prefix both agree on (everything up to the
               first rejected draft) and drops the rest
    catch up   one forward computes what the shadow lacks: the whole prompt the first time,
               then the target's correction or bonus token (1 or 2 tokens)
    draft      k - 1 more one-token forwards; each step's argmax is the next guess

All shadows advance together, one batched forward per draft position. The guesses are greedy,
so the draft's distribution q is a point mass on each guess and the same acceptance rule as
for n-gram lookup keeps the output exact (greedy: identical tokens; sampling: the target's
distribution). A shadow lives as long as the runner's state of its sample: `free` drops it
when the executor frees the finished sample (a preempted sample keeps its shadow, whose K/V
is still right for the tokens it shares). A shadow that the draft's pool cannot hold
proposes nothing.

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

import json
import re
import shutil
from pathlib import Path

import torch

from minivllm.core.block_manager import BlockManager
from minivllm.config import HfConfig
from minivllm.models.loader import load_hf_config, resolve_model_path
from minivllm.sampling_params import SamplingParams
from minivllm.core.request import Request


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


def draft_model_config(model: str, vocab_size: int) -> tuple[Path, HfConfig]:
    """The draft checkpoint's path and config; refused unless it shares the target's
    vocabulary (of vocab_size tokens)."""
    path = resolve_model_path(model)
    config = HfConfig.from_hf_dict(load_hf_config(path))
    if config.vocab_size != vocab_size:
        raise ValueError(f"speculative_config: the draft model at {path} has a vocabulary "
                         f"of {config.vocab_size} tokens, the target {vocab_size}: "
                         "a draft must share the target's tokenizer")
    return path, config


class DraftModelProposer:
    def __init__(self, runner):
        """runner: the draft's ModelRunner, loaded and given a pool (make_drafter)."""
        self.runner = runner
        self.block_manager = BlockManager(runner.num_blocks, runner.block_size)
        self.shadows: dict[str, Request] = {}        # target request id -> its draft-side twin

    def _sync(self, req_id: str, token_ids: list[int]) -> Request | None:
        """The shadow of request req_id holding token_ids, with the K/V of the prefix they
        share kept; None when the draft pool has no room for it (it then proposes nothing)."""
        bm = self.block_manager
        shadow = self.shadows.get(req_id)
        if shadow is None:
            shadow = Request(f"draft:{req_id}", token_ids, SamplingParams())
            if not bm.can_allocate(shadow):
                return None
            bm.allocate(shadow, use_prefix_cache=False)
            self.shadows[req_id] = shadow
            return shadow
        old = shadow.token_ids
        agree = next((i for i, (a, b) in enumerate(zip(old, token_ids)) if a != b),
                     min(len(old), len(token_ids)))
        shadow.token_ids = list(token_ids)
        shadow.num_computed_tokens = min(shadow.num_computed_tokens, agree)
        bm.free_lookahead_slots(shadow)                 # blocks past the shadow's last token
        if not bm.can_append_slots(shadow):
            self.free([req_id])
            return None
        bm.append_slots(shadow)
        return shadow

    def free(self, req_ids) -> None:
        for req_id in req_ids:
            shadow = self.shadows.pop(req_id, None)
            if shadow is not None:
                self.block_manager.free(shadow)

    @torch.inference_mode()
    def propose_batch(self, req_ids: list[str], token_ids: list[list[int]],
                      rooms: list[int]) -> list[list[int]]:
        """Up to rooms[i] greedy guesses for request req_ids[i], whose tokens are
        token_ids[i], from one batched forward per position."""
        drafts: list[list[int]] = [[] for _ in req_ids]
        shadows = [self._sync(req_id, tokens) for req_id, tokens in zip(req_ids, token_ids)]
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
