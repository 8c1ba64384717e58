"""`minivllm bench gpu`: the engine end to end on a CUDA GPU, random weights of real model
shapes, against transformers' generate on the same checkpoint. Needs CUDA; no download.
No vLLM twin (vLLM's `bench latency` / `throughput` load real weights).

    minivllm bench gpu --models qwen3-0.6b      # ~1.5 GB of weights: a few minutes
    minivllm bench gpu --models llama3-8b       # 16 GB of weights: its own step
    python -m minivllm.benchmarks.gpu ...       # the same, as scripts/gpu_check.sh runs it

What it measures: inter-token latency at batch 1 and output tokens/s at batch 64 (512-token
prompts, 256 new tokens, greedy, EOS ignored), minivllm (bf16, Triton backend) against
transformers. A word-level tokenizer stands in for the real one (the benchmark feeds token ids).
The checkpoint is written to /dev/shm when it has room (memory, not disk: the 8B checkpoint is
16 GB), else to the temp directory, and deleted afterwards.

    minivllm bench gpu --decode-modes           # decode step: eager / graphs / compile

Nothing here asserts: it prints what it measured, the machine, and a one-line summary per model
last. Leaves out multi-GPU. The kernels alone: `minivllm bench kernels` (`python -m
kernels.bench`).
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch

import minivllm.platforms  # noqa: F401  (first: Triton's interpreter switch, before kernels/)
from kernels.bench import machine

MODEL_SHAPES = {
    "qwen3-0.6b": dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", hidden_size=1024,
                       intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, vocab_size=151936,
                       max_position_embeddings=40960, rms_norm_eps=1e-6, rope_theta=1e6,
                       tie_word_embeddings=True),
    "llama3-8b": dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=4096,
                      intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=8, head_dim=128, vocab_size=128256,
                      max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=5e5,
                      tie_word_embeddings=False),
}



def random_checkpoint(shape: str | dict, path: Path, dtype=torch.bfloat16, device="cuda",
                      std: float | None = None):
    """A checkpoint directory with random weights of a shape (a MODEL_SHAPES name or a config
    dict like them), written by transformers, plus a word-level tokenizer (the benchmark feeds
    token ids; the engine wants a tokenizer). Returns the transformers model, on `device`.
    std: redraw every weight with this spread (norms around 1) for less degenerate outputs."""
    import transformers
    from tokenizers import Tokenizer, models
    cfg = dict(MODEL_SHAPES[shape] if isinstance(shape, str) else shape)
    cfg.pop("architectures", None)
    config = transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg,
                                               bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    with torch.device(device):
        try:
            model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
        except TypeError:                          # transformers < 4.56 spells it torch_dtype
            model = transformers.AutoModelForCausalLM.from_config(config, torch_dtype=dtype)
    model.eval()
    if std is not None:
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.normal_(1.0 if "norm" in name else 0.0, std)
    model.save_pretrained(path)
    vocab = {f"w{i}": i for i in range(1000)}
    Tokenizer(models.WordLevel(vocab, unk_token="w0")).save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"unk_token": "w0"}))
    return model


def _timed(fn) -> float:
    fn()                                               # warm-up: compile, allocate
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def run_e2e(name: str, batch: int = 64, prompt_len: int = 512, new_tokens: int = 256) -> dict:
    """Batch-1 inter-token latency and batch-`batch` throughput, transformers vs minivllm."""
    from minivllm import LLM, SamplingParams
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(3, 1000, (batch, prompt_len), generator=g).tolist()
    one = prompts[:1]
    res = {"model": name, "batch": batch, "prompt_len": prompt_len, "new_tokens": new_tokens}
    nbytes = 2 * approx_params(MODEL_SHAPES[name])           # bf16
    with tempfile.TemporaryDirectory(dir=checkpoint_dir(nbytes)) as tmp:
        path = Path(tmp)
        model = random_checkpoint(name, path)

        def hf(ids, n):
            x = torch.tensor(ids, device="cuda")
            return lambda: model.generate(x, attention_mask=torch.ones_like(x), do_sample=False,
                                          max_new_tokens=n, min_new_tokens=n, pad_token_id=0)
        hf_itl = (_timed(hf(one, 65)) - _timed(hf(one, 1))) / 64
        hf_tps = batch * new_tokens / _timed(hf(prompts, new_tokens))
        del model
        gc.collect()
        torch.cuda.empty_cache()

        llm = LLM(str(path), dtype="bfloat16", max_model_len=prompt_len + new_tokens + 64,
                  max_num_seqs=batch, max_num_batched_tokens=8192)
        print(f"  {llm}")

        def ours(ids, n):
            p = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
            return lambda: llm.generate(ids, p, use_tqdm=False)
        our_itl = (_timed(ours(one, 65)) - _timed(ours(one, 1))) / 64
        with llm.engine.trace() as steps:          # the core's own decode steps, for the gap
            ours(one, 65)()                          # between them and the latency seen above
        our_step = statistics.median(s.duration for s in steps
                                     if not any(x.is_prefill for x in s.scheduled))
        graphs = llm.engine.runner.cuda_graphs
        print(f"  decode graph replays so far: {graphs.replays if graphs else 'no graphs'}")
        our_tps = batch * new_tokens / _timed(ours(prompts, new_tokens))
        del llm
        gc.collect()
        torch.cuda.empty_cache()
    res.update(hf_itl_ms=1e3 * hf_itl, minivllm_itl_ms=1e3 * our_itl,
               minivllm_step_ms=1e3 * our_step, hf_tok_s=hf_tps, minivllm_tok_s=our_tps)
    print(f"  batch 1 inter-token latency: transformers {1e3 * hf_itl:.2f} ms, "
          f"minivllm {1e3 * our_itl:.2f} ms (its core's decode step: {1e3 * our_step:.2f} ms)")
    print(f"  batch {batch} x {prompt_len}+{new_tokens} tokens: transformers {hf_tps:.0f} "
          f"tok/s, minivllm {our_tps:.0f} tok/s ({our_tps / hf_tps:.2f}x)")
    return res



def run_decode_modes(name: str, batches=(1, 2, 4, 8, 16, 32, 64), steps: int = 16) -> dict:
    """Median decode step (ms) per batch size: eager, CUDA graphs, CUDA graphs + compile."""
    from minivllm import LLM
    from minivllm.benchmarks.compile import decode_step_seconds
    modes = {"eager": dict(enforce_eager=True), "graphs": {},
             "graphs+compile": dict(compilation_config=3)}
    res = {"model": name, "batches": list(batches)}
    nbytes = 2 * approx_params(MODEL_SHAPES[name])
    with tempfile.TemporaryDirectory(dir=checkpoint_dir(nbytes)) as tmp:
        random_checkpoint(name, Path(tmp))
        gc.collect()
        torch.cuda.empty_cache()
        llm = LLM(tmp, dtype="bfloat16", max_model_len=1024, max_num_seqs=max(batches),
                  num_kv_blocks=max(batches) * 8)
        for mode, settings in modes.items():
            t0 = time.perf_counter()
            llm.reconfigure(**{"enforce_eager": False, "compilation_config": 0, **settings})
            decode_step_seconds(llm, 1, 2)                     # compile / capture warm-up
            res[f"{mode}_setup_s"] = time.perf_counter() - t0
            res[mode] = [1e3 * decode_step_seconds(llm, b, steps) for b in batches]
            print(f"  {mode:>15}: " + " ".join(f"{ms:7.2f}" for ms in res[mode])
                  + f"   ms/step at batch {list(batches)} (setup {res[f'{mode}_setup_s']:.0f} s)")
        del llm
    return res


def approx_params(cfg: dict) -> int:
    """Parameter count of a Llama-family config: embeddings, attention, MLP (norms ignored)."""
    h = cfg["hidden_size"]
    layers = cfg["num_hidden_layers"]
    v = cfg["vocab_size"]
    d = cfg.get("head_dim") or h // cfg["num_attention_heads"]
    attn = h * d * (2 * cfg["num_attention_heads"] + 2 * cfg["num_key_value_heads"])
    mlp = 3 * h * cfg["intermediate_size"]
    return layers * (attn + mlp) + v * h * (1 if cfg.get("tie_word_embeddings") else 2)


def checkpoint_dir(nbytes: int) -> str | None:
    """/dev/shm (RAM) when it can hold the checkpoint with room to spare, else the default."""
    shm = Path("/dev/shm")
    if shm.is_dir() and shutil.disk_usage(shm).free > 1.5 * nbytes:
        return str(shm)
    return None


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", default="qwen3-0.6b",
                        help=f"comma-separated model shapes, from {sorted(MODEL_SHAPES)}")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--decode-modes", action="store_true", help="instead: decode step time, "
                        "eager vs CUDA graphs vs graphs + torch.compile, batch 1..64")


def run(args: argparse.Namespace) -> list[dict]:
    if not torch.cuda.is_available():
        raise SystemExit("minivllm bench gpu measures GPU speed and needs CUDA; on a CPU use "
                         "`minivllm bench cpu` (or decode, throughput, ...)")
    print(f"machine: {machine()}")
    if args.decode_modes:
        results = []
        for name in args.models.split(","):
            print(f"\ndecode step, {name} shapes, random weights, bf16")
            results.append(run_decode_modes(name))
            if args.json:
                args.json.parent.mkdir(parents=True, exist_ok=True)
                args.json.write_text(json.dumps({"machine": machine(), "decode_modes": results},
                                                indent=2))
        return results
    results = []
    for name in args.models.split(","):
        print(f"\nend to end, {name} shapes, random weights, bf16")
        results.append(run_e2e(name))
        if args.json:                            # after each model: a timeout keeps the first
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps({"machine": machine(), "e2e": results}, indent=2))
    print(f"\nsummary ({machine()})")
    print(f"{'model':<12}{'ITL ms hf':>10}{'ITL ms ours':>12}{'tok/s hf':>10}{'tok/s ours':>11}"
          f"{'ratio':>7}")
    for r in results:
        print(f"{r['model']:<12}{r['hf_itl_ms']:10.2f}{r['minivllm_itl_ms']:12.2f}"
              f"{r['hf_tok_s']:10.0f}{r['minivllm_tok_s']:11.0f}"
              f"{r['minivllm_tok_s'] / r['hf_tok_s']:7.2f}")
    return results


def main(argv: list[str] | None = None) -> list[dict]:
    """`python -m minivllm.benchmarks.gpu` (scripts/gpu_check.sh): `minivllm bench gpu`."""
    parser = argparse.ArgumentParser(prog="python -m minivllm.benchmarks.gpu", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_cli_args(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    main()
