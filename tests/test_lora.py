"""Multi-LoRA serving (minivllm/lora/models.py) on the real model, with PEFT-made adapters
(scripts/lora_adapters.py): each request's greedy tokens equal PEFT + transformers with that
adapter merged; a batch mixing the base and four adapters equals each alone; slots are swapped
in and evicted under max_loras; no block leaks; bad adapters fail alone, with a message."""

import copy
import json
import runpy
import shutil
from pathlib import Path

import pytest
from torch import nn

from minivllm import LoRARequest, SamplingParams

from conftest import hf_greedy, reconfigured

SCRIPT = runpy.run_path(str(Path(__file__).resolve().parents[1] / "scripts" / "lora_adapters.py"))
NAMES = list(SCRIPT["ADAPTERS"])                    # pirate, robot, yoda, french
QUESTIONS = ["What is the capital of France?", "Write a haiku about the sea."]
PROMPTS = [SCRIPT["chat_prompt"](q) for q in QUESTIONS]
GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


@pytest.fixture(scope="module")
def adapters():
    paths = SCRIPT["ensure_adapters"]()              # trained once, then cached
    return {name: LoRARequest(name, i + 1, str(paths[name])) for i, name in enumerate(NAMES)}


@pytest.fixture(scope="module")
def lora_llm(smol_llm):
    with reconfigured(smol_llm, enable_lora=True, max_loras=4, max_lora_rank=16,
                      max_num_seqs=16, enforce_eager=True) as llm:      # no graphs with LoRA
        yield llm


def tokens(outs):
    return [list(o.outputs[0].token_ids) for o in outs]


@pytest.fixture(scope="module")
def mixed(lora_llm, adapters):
    """Base + 4 adapters x 2 prompts, all in one generate call, traced."""
    loras = [None] + [adapters[n] for n in NAMES]
    prompts = [p for _ in loras for p in PROMPTS]
    requests = [lora for lora in loras for _ in PROMPTS]
    with lora_llm.engine.trace() as steps:
        outs = lora_llm.generate(prompts, GREEDY, lora_request=requests, use_tqdm=False)
    return requests, prompts, outs, steps


def test_each_adapter_matches_peft_merged(mixed, hf_smol, lora_llm):
    from peft import PeftModel
    requests, prompts, outs, _ = mixed
    for name in NAMES:
        lora = next(r for r in requests if r and r.lora_name == name)
        ref = PeftModel.from_pretrained(copy.deepcopy(hf_smol), lora.lora_path)
        ref = ref.merge_and_unload().eval()          # W + s B A: the reference no one here wrote
        for prompt, out, req in zip(prompts, outs, requests):
            if req is lora:
                ids = lora_llm.tokenizer.encode(prompt, add_special_tokens=False)
                assert list(out.outputs[0].token_ids) == hf_greedy(ref, ids, GREEDY.max_tokens)
        del ref
    # ...and each adapter does what it was trained to: open with its phrase.
    for out, req in zip(outs, requests):
        if req is not None:
            assert out.outputs[0].text.startswith(SCRIPT["ADAPTERS"][req.lora_name][0]), \
                (req.lora_name, out.outputs[0].text)
        else:
            assert not any(out.outputs[0].text.startswith(a[0])
                           for a in SCRIPT["ADAPTERS"].values())


def test_mixed_batch_equals_each_alone(mixed, lora_llm):
    requests, prompts, outs, steps = mixed
    # The batch really mixed: some step ran the base and all four adapters at once.
    assert max(len({s.lora_int_id for s in st.scheduled}) for st in steps) == 5
    for lora in dict.fromkeys(requests):             # base first, then each adapter alone
        alone = lora_llm.generate(PROMPTS, GREEDY, lora_request=lora, use_tqdm=False)
        assert tokens(alone) == [t for t, r in zip(tokens(outs), requests) if r is lora]
    assert lora_llm.engine.stats().num_blocks_used == 0


def test_slots_swap_and_evict_under_max_loras(mixed, smol_llm, adapters):
    requests, prompts, outs, _ = mixed
    with reconfigured(smol_llm, enable_lora=True, max_loras=2, max_cpu_loras=3,
                      max_num_seqs=16, enforce_eager=True) as llm:
        with llm.engine.trace() as steps:
            again = llm.generate(prompts, GREEDY, lora_request=requests, use_tqdm=False)
        assert tokens(again) == tokens(outs)        # same tokens, two slots instead of four
        most = max(len({s.lora_int_id for s in st.scheduled} - {0}) for st in steps)
        assert most == 2                            # never more adapters at once than slots
        stats = llm.engine.runner.lora_manager.stats()
        assert stats["num_slot_evictions"] >= 2 and len(stats["slots"]) == 2
        # Four adapters through a host cache of three, LRU: adding all four pushes the first
        # out, and each activation, in arrival order, pushes out the next one needed: 4 + 4.
        assert stats["num_disk_loads"] == 8 and len(stats["cpu_cache"]) == 3
        assert llm.engine.stats().num_blocks_used == 0
        assert llm.engine.list_loras() == set(stats["slots"])


def test_prefix_cache_is_per_adapter(lora_llm, adapters):
    long_prompt = SCRIPT["chat_prompt"]("Please describe, in one sentence, the colour of the "
                                        "sky on a clear summer afternoon.")
    engine = lora_llm.engine
    one = SamplingParams(temperature=0, max_tokens=1)
    hits = []
    for lora in (None, adapters["pirate"], adapters["pirate"], adapters["robot"]):
        before = engine.stats().prefix_cache_hit_tokens
        lora_llm.generate(long_prompt, one, lora_request=lora, use_tqdm=False)
        hits.append(engine.stats().prefix_cache_hit_tokens - before)
    # The base's blocks are not the pirate's; the pirate's second request reuses its own;
    # the robot reuses neither.
    assert hits[1] == 0 and hits[2] >= 16 and hits[3] == 0


def test_bad_adapters_fail_alone_with_a_message(lora_llm, adapters, tmp_path, smol_llm):
    def broken(edit: dict, name: str) -> LoRARequest:
        path = tmp_path / name
        shutil.copytree(adapters["pirate"].lora_path, path)
        cfg = json.loads((path / "adapter_config.json").read_text())
        (path / "adapter_config.json").write_text(json.dumps(cfg | edit))
        return LoRARequest(name, 90 + len(name), str(path))

    cases = [
        (LoRARequest("nowhere", 77, str(tmp_path / "missing")), "not a PEFT adapter directory"),
        (broken({"r": 32}, "big"), "exceeds max_lora_rank=16"),
        (broken({"target_modules": ["embed_tokens", "q_proj"]}, "embed"),
         "targets ['embed_tokens']"),
    ]
    for bad, message in cases:
        with pytest.raises(ValueError, match=message.replace("[", r"\[")):
            lora_llm.generate(PROMPTS, GREEDY, lora_request=[None, bad], use_tqdm=False)
        assert not lora_llm.engine.requests          # nothing half-queued
    # The engine still serves, adapters and base alike.
    out = lora_llm.generate(PROMPTS[0], GREEDY, lora_request=adapters["yoda"], use_tqdm=False)
    assert out[0].outputs[0].text.startswith("Hmm, yes.")
    with pytest.raises(ValueError, match="lora_int_id 3 is already 'yoda'"):
        lora_llm.generate(PROMPTS[0], GREEDY, lora_request=LoRARequest("other", 3, "/x"),
                          use_tqdm=False)
    with pytest.raises(ValueError, match="positive integer"):
        LoRARequest("zero", 0, "/x")
    assert lora_llm.engine.stats().num_blocks_used == 0


def test_lora_off_refuses_a_request_and_unwraps(smol_llm, adapters):
    with reconfigured(smol_llm, enable_lora=False):
        # Plain nn.Linear layers again (a LoRA engine wrapped them), and a LoRA is refused.
        assert type(smol_llm.engine.runner.model.model.layers[0].mlp.down_proj) is nn.Linear
        with pytest.raises(ValueError, match="enable_lora=True"):
            smol_llm.generate(PROMPTS[0], GREEDY, lora_request=adapters["pirate"],
                              use_tqdm=False)
        assert len(smol_llm.generate(PROMPTS[0], GREEDY, use_tqdm=False)[0].outputs[0]
                   .token_ids) == GREEDY.max_tokens
        with pytest.raises(ValueError, match="max_cpu_loras"):
            smol_llm.reconfigure(enable_lora=True, max_loras=4, max_cpu_loras=2)
        with pytest.raises(ValueError, match="max_lora_rank must be a positive integer"):
            smol_llm.reconfigure(enable_lora=True, max_lora_rank=0)
        assert smol_llm.engine.list_loras() == set()
