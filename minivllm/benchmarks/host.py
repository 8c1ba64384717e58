"""`minivllm bench host`: the host's share of a decode step, synchronous scheduling against
async scheduling (issue 65). No vLLM twin (vLLM's `bench latency` reports the end-to-end time
alone).

    uv run minivllm bench host                       # tiny model, then the default, batch 1 and 32
    uv run minivllm bench host --models tiny --batch-sizes 1 --steps 16
    python -m minivllm.benchmarks.host --models tiny qwen3-0.6b --batch-sizes 1 64   # a GPU

Each engine decodes `--steps` tokens for a batch of short random prompts, greedy, EOS ignored,
traced (`engine.trace()`): every StepRecord has the seconds of the step's phases (schedule,
prepare, forward, sample, update; worker/phase_timer.py: on CUDA the forward's lap waits for
the device, on a CPU the cores run it). Per decode step it prints:

    ITL      seconds between one step's outputs and the next's (what a streaming client sees)
    forward  the forward pass, until the device is done with it
    host     ITL - forward: the time the device did not spend in the forward
    share    host / ITL
    and each other phase's own time (under async scheduling they overlap the forward)

"tiny" is a random model of SmolLM2-135M's depth (30 layers) and vocabulary, 64 wide: its
forward is cheap, so what the host adds per step shows even on a CPU. "default" is the
packaged SmolLM2-135M; a name of benchmarks/gpu.py's MODEL_SHAPES, random weights of that
shape (scripts/gpu_check.sh host: CUDA graphs on, as the engine runs by default). Under async scheduling the forward runs on a thread of its own while
the core schedules the next step: on CUDA the host's work then hides behind the device's; on
a CPU the forward needs the cores the host's work runs on, so the overlap can cost as much as
it saves (docs/benchmarks.md has both). Tokens are checked equal between the two modes.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import tempfile
from pathlib import Path

import torch

TINY = dict(model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=30,
            num_attention_heads=4, num_key_value_heads=2, vocab_size=49152,
            max_position_embeddings=2048, rms_norm_eps=1e-5, tie_word_embeddings=True)
PHASES = ("schedule", "prepare", "sample", "update")


def decode_steps(llm, batch: int, steps: int) -> tuple[list, list[list[int]]]:
    """The trace of `batch` sequences decoding `steps` tokens each, and their tokens."""
    from minivllm import SamplingParams
    g = torch.Generator().manual_seed(batch)
    prompts = torch.randint(3, 1000, (batch, 8), generator=g).tolist()
    params = SamplingParams(temperature=0, max_tokens=steps, ignore_eos=True)
    llm.generate(prompts[:1], SamplingParams(max_tokens=2), use_tqdm=False)     # warm-up
    with llm.engine.trace() as trace:
        outputs = llm.generate(prompts, params, use_tqdm=False)
    return list(trace), [o.outputs[0].token_ids for o in outputs]


def summarize(trace: list, batch: int) -> dict[str, float]:
    """Medians over the steps where every sequence decodes (ms)."""
    decode = [i for i, r in enumerate(trace) if i > 0 and len(r.scheduled) == batch
              and not any(s.is_prefill for s in r.scheduled)]
    ends = [r.start_time + r.duration for r in trace]
    itl = statistics.median(ends[i] - ends[i - 1] for i in decode)
    row = {p: 1e3 * statistics.median(trace[i].phases.get(p, 0.0) for i in decode)
           for p in (*PHASES, "forward")}
    row["itl"] = 1e3 * itl
    row["host"] = max(0.0, row["itl"] - row["forward"])
    return row


def measure(model: str, batch_sizes: list[int], steps: int) -> list[dict]:
    from minivllm import LLM
    rows = []
    for async_scheduling in (False, True):
        llm = LLM(model, max_model_len=256, max_num_seqs=max(batch_sizes),
                  async_scheduling=async_scheduling)
        for batch in batch_sizes:
            trace, tokens = decode_steps(llm, batch, steps)
            rows.append({"batch": batch, "mode": "async" if async_scheduling else "sync",
                         "tokens": tokens, **summarize(trace, batch)})
        llm.engine.shutdown()
    return rows


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", nargs="+", default=["tiny", "default"],
                        help="tiny (random, 30 layers, 64 wide), default (SmolLM2-135M), or a "
                             "checkpoint")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--steps", type=int, default=32, help="tokens decoded per sequence")


def run(args: argparse.Namespace) -> list[dict]:
    from minivllm.benchmarks.gpu import MODEL_SHAPES, random_checkpoint
    device = (torch.cuda.get_device_name() if torch.cuda.is_available()
              else f"CPU {platform.processor() or platform.machine()}, "
                   f"{torch.get_num_threads()} threads")
    print(f"host share of a decode step, sync vs async scheduling, on {device}")
    print(f"{'model':>8}{'batch':>6}{'mode':>6}{'ITL ms':>8}{'forward':>8}{'host':>7}"
          f"{'share':>7}" + "".join(f"{p:>9}" for p in PHASES) + "  same tokens")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            model = None if name == "default" else name
            if name == "tiny" or name in MODEL_SHAPES:
                model = str(Path(tmp) / name)
                random_checkpoint(TINY if name == "tiny" else name, Path(model),
                                  dtype=torch.float32 if name == "tiny" else torch.bfloat16,
                                  device="cpu")
            rows = measure(model, args.batch_sizes, args.steps)
            for row in rows:
                sync = next(r for r in rows if r["batch"] == row["batch"] and r["mode"] == "sync")
                row.update(model=name, same=row["tokens"] == sync["tokens"])
                print(f"{name:>8}{row['batch']:>6}{row['mode']:>6}{row['itl']:8.2f}"
                      f"{row['forward']:8.2f}{row['host']:7.2f}"
                      f"{100 * row['host'] / row['itl']:6.0f}%"
                      + "".join(f"{row[p]:9.2f}" for p in PHASES) + f"  {row['same']}")
            results += rows
    print("\nmedians over the steps where every sequence decodes, ms. host = ITL - forward; "
          "under async scheduling the other phases overlap the forward.")
    return results


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_cli_args(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    main()
