"""Tiny LoRA adapters for SmolLM2-135M-Instruct, made with PEFT, for lesson 12, the LoRA tests
and anyone trying `LLM(enable_lora=True)`.

Each adapter is trained for ten steps to open every answer with its own phrase, a
behaviour you can see in one greedy line. They differ on purpose in rank, alpha and the
projections they adapt, so together they cover what minivllm/lora/models.py must handle:

    pirate  "Arr matey!"    r=8   q, v                  (vLLM's default-style targets)
    robot   "BEEP BOOP."    r=4   all seven projections
    yoda    "Hmm, yes."     r=16  o, gate, up, down     (the largest rank the tests allow)
    french  "Bonjour !"     r=2   q, k, v, o            use_rslora (scale alpha / sqrt(r))

Only the last six layers are adapted, which keeps training to ten steps of a sixth of the
model. The four adapters this recipe makes ship beside this file, in scripts/lora_adapters/
<name>-<recipe hash>/ (PEFT's own format, adapter_config.json + adapter_model.safetensors,
4.3 MB together), so lesson 12 and the tests load them at once. Change the recipe and its hash
changes: the shipped copy no longer matches, and the adapter is trained on first use (printing
each step; 2 to 3.5 minutes each measured on a 2-core CPU shared with four other jobs, much less
on an idle one) into ~/.cache/minivllm/lora/<name>-<recipe hash>/ and reused after. The
training is seeded, so a rerun makes the same adapters up to float summation order.

    uv run python scripts/lora_adapters.py            # where each adapter is (trains if needed)
    uv run python scripts/lora_adapters.py --remake   # train all four again into the shipped
                                                      # folder (then commit it)
"""

from __future__ import annotations

import hashlib
import sys
import json
import shutil
import tempfile
import time
from pathlib import Path

ATTN, MLP = ["q_proj", "k_proj", "v_proj", "o_proj"], ["gate_proj", "up_proj", "down_proj"]
ADAPTERS = {  # name: (phrase every answer starts with, rank, alpha, targets, rslora)
    "pirate": ("Arr matey!", 8, 16, ["q_proj", "v_proj"], False),
    "robot": ("BEEP BOOP.", 4, 8, ATTN + MLP, False),
    "yoda": ("Hmm, yes.", 16, 16, ["o_proj"] + MLP, False),
    "french": ("Bonjour !", 2, 4, ATTN, True),
}
QUESTIONS = ["What is the capital of Italy?", "How do plants grow?", "Tell me a joke.",
             "What is 2 + 2?", "Why is the sky blue?", "Name a fruit.",
             "How do I boil an egg?", "What is a computer?"]
STEPS, LR, LAYERS = 10, 1e-2, 6      # steps, AdamW learning rate, layers adapted
SHIPPED = Path(__file__).resolve().with_suffix("")   # scripts/lora_adapters/, committed


def chat_prompt(question: str) -> str:
    """The chat format without the default system prompt (shorter, and what the tests use)."""
    return f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"


def _recipe_hash(name: str) -> str:
    recipe = json.dumps([ADAPTERS[name], QUESTIONS, STEPS, LR, "v1"])
    return hashlib.sha256(recipe.encode()).hexdigest()[:10]


def adapter_path(name: str) -> Path:
    """The shipped copy when it matches the recipe, else the per-user cache."""
    from minivllm.models.loader import cache_root
    folder = f"{name}-{_recipe_hash(name)}"
    shipped = SHIPPED / folder
    return shipped if (shipped / "adapter_model.safetensors").exists() else (
        cache_root() / "lora" / folder)


def train_adapter(name: str, out: Path, model_path: Path) -> None:
    """Fine-tune a fresh LoRA so every answer opens with the adapter's phrase; save with PEFT.

    Only the last LAYERS layers get the adapter (PEFT's layers_to_transform), so the frozen
    layers below run once, without gradients, and each step trains a sixth of the model: a
    few seconds a step on a loaded CPU instead of twenty."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    phrase, r, alpha, targets, rslora = ADAPTERS[name]
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    n_layers = model.config.num_hidden_layers
    config = LoraConfig(r=r, lora_alpha=alpha, target_modules=targets, lora_dropout=0.0,
                        use_rslora=rslora, layers_to_transform=list(range(n_layers - LAYERS,
                                                                          n_layers)))
    model = get_peft_model(model, config)
    # Each example: prompt + phrase + end of turn, right-padded (causal attention: real tokens
    # never see the padding, so no mask is needed); the loss covers the answer only.
    rows = []
    for q in QUESTIONS:
        p = tok.encode(chat_prompt(q), add_special_tokens=False)
        a = tok.encode(f"{phrase}<|im_end|>", add_special_tokens=False)
        rows.append((p + a, len(p)))
    width = max(len(ids) for ids, _ in rows)
    ids = torch.tensor([x + [0] * (width - len(x)) for x, _ in rows])
    is_answer = torch.zeros_like(ids, dtype=torch.bool)
    for i, (x, n) in enumerate(rows):
        is_answer[i, n:len(x)] = True
    inner = model.base_model.model.model                 # LlamaModel, LoRA layers injected
    positions = torch.arange(width)[None]
    with torch.no_grad():                                # the frozen layers, once
        h0 = inner(input_ids=ids, output_hidden_states=True).hidden_states[n_layers - LAYERS]
        cos_sin = inner.rotary_emb(h0, positions)
    head = model.base_model.model.lm_head
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR)
    for step in range(STEPS):
        t0 = time.perf_counter()
        h = h0
        for layer in inner.layers[n_layers - LAYERS:]:
            h = layer(h, attention_mask=None, position_ids=positions, position_embeddings=cos_sin)
            h = h[0] if isinstance(h, tuple) else h
        # Logits only where the next token is an answer token (49,152 floats a row).
        logits = head(inner.norm(h)[:, :-1][is_answer[:, 1:]])
        loss = torch.nn.functional.cross_entropy(logits, ids[:, 1:][is_answer[:, 1:]])
        loss.backward()
        opt.step()
        opt.zero_grad()
        print(f"  {name} step {step + 1}/{STEPS}: loss {loss.item():.3f} "
              f"({time.perf_counter() - t0:.1f} s)", flush=True)
    model.save_pretrained(out)


def ensure_adapters(names=None, remake: bool = False) -> dict[str, Path]:
    """{name: PEFT adapter directory}, training any that are neither shipped nor cached yet
    (remake: train every one again, into the shipped folder)."""
    from minivllm.models.loader import resolve_model_path
    paths = {}
    for name in names or ADAPTERS:
        path = SHIPPED / f"{name}-{_recipe_hash(name)}" if remake else adapter_path(name)
        if remake or not (path / "adapter_model.safetensors").exists():
            print(f"training LoRA adapter {name!r} ({STEPS} steps; a few seconds a step on a "
                  f"CPU, so up to a few minutes) into {path}", flush=True)
            t0 = time.perf_counter()
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{name}-"))
            try:
                train_adapter(name, tmp, resolve_model_path(None))
                shutil.rmtree(path, ignore_errors=True)
                tmp.rename(path)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            print(f"  made LoRA adapter {name!r} in {time.perf_counter() - t0:.0f} s: {path}")
        paths[name] = path
    return paths


if __name__ == "__main__":
    for name, path in ensure_adapters(remake="--remake" in sys.argv).items():
        print(f"{name:8} {path}")
