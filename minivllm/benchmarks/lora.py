"""`minivllm bench lora`: one batch mixing N adapters vs serving them one at a time vs the base.

No vLLM twin as a command (vLLM's `bench throughput --enable-lora` runs one configuration;
benchmarks/kernels/benchmark_lora.py times the kernels alone). Leaves out adapter loading time.

    uv run minivllm bench lora                       # N = 1, 4, 16; 16 requests, rank 8
    uv run minivllm bench lora --num-adapters 4 --rank 16 --num-requests 32

The same requests (greedy, EOS ignored, short prompts) are served four ways:
    base            the base model, LoRA off
    base+lora-off   LoRA on (every projection wrapped), no request names an adapter
    mixed           request i uses adapter i mod N, all in one generate call, max_loras = N
    one-at-a-time   the requests of each adapter in their own call, one adapter after another
                    (what a server that swaps a merged model per adapter could do at best)
Adapters are random rank-r LoRAs on all seven projections, written in PEFT's format (their
outputs are meaningless; the cost is what is measured). Memory: one slot in every wrapped
layer, one adapter in host memory, and a merged copy of the model for comparison.
On a loaded machine the seconds move; the ratios within one run are what to read.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from minivllm.lora.models import TARGETS


def random_adapter(path: Path, shapes: dict, num_layers: int, rank: int, seed: int) -> Path:
    """A PEFT-format LoRA with small random A and B on every target (alpha = 2 r)."""
    from safetensors.torch import save_file
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for i in range(num_layers):
        for module, parent in TARGETS.items():
            n, k = shapes[module]
            key = f"base_model.model.model.layers.{i}.{parent}.{module}"
            tensors[f"{key}.lora_A.weight"] = torch.randn(rank, k, generator=g) * 0.02
            tensors[f"{key}.lora_B.weight"] = torch.randn(n, rank, generator=g) * 0.02
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, path / "adapter_model.safetensors")
    (path / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank,
         "target_modules": list(TARGETS), "bias": "none"}))
    return path


def run(args: argparse.Namespace) -> None:
    from minivllm import LLM, LoRARequest, SamplingParams
    llm = LLM(args.model, dtype=args.dtype, max_model_len=256, max_num_seqs=args.num_requests,
              enforce_eager=True)      # LoRA refuses CUDA graphs: the base runs eager too
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    prompts = [f"<|im_start|>user\nTell me fact number {i} about the ocean.<|im_end|>\n"
               "<|im_start|>assistant\n" for i in range(args.num_requests)]
    out_tokens = args.num_requests * args.max_tokens

    def timed(*calls) -> float:
        t0 = time.perf_counter()
        for batch, loras in calls:
            llm.generate(batch, params, lora_request=loras, use_tqdm=False)
        return out_tokens / (time.perf_counter() - t0)

    print(f"{llm!r}\nthreads={torch.get_num_threads()}  {args.num_requests} requests x "
          f"{args.max_tokens} output tokens, greedy; adapters rank {args.rank}, all 7 projections")
    llm.generate(prompts[:2], params, use_tqdm=False)                     # warm-up
    base = timed((prompts, None))
    print(f"{'run':<16} {'N':>3} {'tok/s':>8} {'vs base':>8}")
    print(f"{'base':<16} {'-':>3} {base:>8.1f} {'1.00x':>8}")
    tmp = Path(tempfile.mkdtemp(prefix="minivllm-bench-lora-"))
    for n in args.num_adapters:
        llm.reconfigure(enable_lora=True, max_loras=n, max_lora_rank=args.rank)
        manager = llm.engine.runner.lora_manager
        loras = [LoRARequest(f"a{j}", j + 1, str(random_adapter(
            tmp / f"a{j}", manager.shapes, len(manager.layers) // len(TARGETS), args.rank, j)))
            for j in range(n)]
        if n == args.num_adapters[0]:
            off = timed((prompts, None))
            print(f"{'base+lora-off':<16} {'-':>3} {off:>8.1f} {off / base:>7.2f}x")
        per_request = [loras[i % n] for i in range(len(prompts))]
        llm.generate([prompts[0]] * n, params, lora_request=loras, use_tqdm=False)  # load all
        mixed = timed((prompts, per_request))
        groups = [([p for p, r in zip(prompts, per_request) if r is lora], lora) for lora in loras]
        one = timed(*[g for g in groups if g[0]])
        print(f"{'mixed':<16} {n:>3} {mixed:>8.1f} {mixed / base:>7.2f}x")
        print(f"{'one-at-a-time':<16} {n:>3} {one:>8.1f} {one / base:>7.2f}x   "
              f"(mixed is {mixed / one:.2f}x faster)")
    slot = manager.slot_bytes
    host = next(iter(manager.cpu_cache.values())).nbytes
    model = sum(p.numel() * p.element_size() for p in llm.engine.runner.model.parameters())
    print(f"memory per adapter (rank {args.rank}): slot {slot / 2**20:.1f} MiB, host copy "
          f"{host / 2**20:.1f} MiB; a merged copy of the model instead: {model / 2**20:.0f} MiB "
          f"({model / slot:.0f}x a slot)")
    llm.reconfigure(enable_lora=False)


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--num-adapters", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--num-requests", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--rank", type=int, default=8)
