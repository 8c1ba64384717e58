"""`minivllm simulate`: a deployment served in simulation (minivllm/simulator/), a summary
table, plots, and the highest request rate that meets an SLO. The command's front end lives
here, beside the benchmarks, as a tool around the engine.

    minivllm simulate --model Llama-3-70B --profile H100 -tp 8 --num-prompts 2000 \
        --request-rate 10 --slo-ttft 2 --slo-itl 0.1 --plot sim.png
    minivllm simulate --model path/to/config.json --profile L4 --capacity   # the highest rate
    minivllm simulate --calibrate         # fit this CPU's profile from real engine steps

Every number printed is simulated, on the profile its first line names (data-sheet profiles
are peaks from the vendor's sheet and assumed efficiencies: cost_model.py says which).
The capacity search is a binary search over the Poisson rate, as Vidur-Search does.

No vLLM twin: vLLM has no simulator (cf. Vidur, MLSys 2024).
"""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np

from minivllm.benchmarks.workloads import poisson_arrivals
from minivllm.engine.arg_utils import add_cli_args as add_engine_args
from minivllm.engine.arg_utils import engine_kwargs
from minivllm.simulator.cost_model import (MODEL_SHAPES, PROFILES, get_profile, model_config,
                                           save_profile)
from minivllm.simulator.simulator import SLO, SimResult, capacity, simulate, \
    synthetic_requests




def plot(res: SimResult, path: str, slo: SLO | None = None) -> None:
    """Latency CDFs (TTFT, E2E), KV blocks in use and batch size over simulated time."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.6))
    for name, values in (("TTFT", res.ttft), ("E2E", res.e2e)):
        x = np.sort(values)
        axes[0].plot(x, np.arange(1, len(x) + 1) / len(x), label=name)
    if slo is not None:
        axes[0].axvline(slo.ttft, ls=":", c="k", label=f"TTFT SLO {slo.ttft} s")
    axes[0].set(xscale="log", xlabel="seconds (simulated)", ylabel="share of requests",
                title="latency CDF")
    axes[0].legend()
    axes[1].plot(res.step_end, res.blocks_used)
    axes[1].axhline(res.num_kv_blocks, ls=":", c="k", label="pool")
    axes[1].set(xlabel="seconds (simulated)", ylabel="KV blocks in use", title="KV blocks")
    axes[1].legend()
    axes[2].plot(res.step_end, res.batch_size)
    axes[2].set(xlabel="seconds (simulated)", ylabel="sequences", title="batch size per step")
    fig.suptitle(f"simulated: {res.label}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def add_cli_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="Llama-3-8B",
                   help=f"one of {', '.join(MODEL_SHAPES)}, or a config.json")
    p.add_argument("--profile", default="H100", help=f"one of {', '.join(PROFILES)}, 'cpu' "
                   "(this machine's fit) or a profile JSON file")
    p.add_argument("--link-bandwidth", type=float, default=None,
                   help="override the profile's all-reduce bandwidth, GB/s (e.g. 64: PCIe)")
    p.add_argument("--num-prompts", type=int, default=1000)
    p.add_argument("--request-rate", type=float, default=float("inf"),
                   help="Poisson arrivals, requests/s (inf: all at once)")
    p.add_argument("--input-len", type=float, default=512, help="mean prompt tokens")
    p.add_argument("--output-len", type=float, default=128, help="mean output tokens")
    p.add_argument("--shared-prefix", type=int, default=0, help="system prompt tokens shared")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction,
                   default=True)
    p.add_argument("--preemption-mode", choices=("recompute", "swap"), default="recompute")
    p.add_argument("--slo-ttft", type=float, default=2.0, help="seconds")
    p.add_argument("--slo-itl", type=float, default=0.1, help="seconds (mean per request)")
    p.add_argument("--capacity", action="store_true",
                   help="search the highest rate with 90%% of requests within the SLO")
    p.add_argument("--plot", default=None, help="write latency CDFs, blocks, batch to this PNG")
    p.add_argument("--calibrate", action="store_true",
                   help="fit this CPU's profile from real steps of the packaged model, store it")
    add_engine_args(p)


def run(args: argparse.Namespace) -> None:
    if args.calibrate:
        from minivllm import LLM
        from minivllm.simulator.calibrate import calibrate
        fit = calibrate(LLM(max_model_len=512, enable_prefix_caching=False), save=False,
                        progress=True)
        print(f"stored {save_profile(fit)}:\n{fit}")
        return
    profile = get_profile(args.profile)
    if args.link_bandwidth is not None:
        profile = dataclasses.replace(profile, link_bandwidth=args.link_bandwidth * 1e9,
                                      name=f"{profile.name}, link {args.link_bandwidth:g} GB/s")
    mc = model_config(args.model)
    kwargs = engine_kwargs(args)
    for name in ("dtype", "device", "enforce_eager"):
        kwargs.pop(name)
    if kwargs["max_model_len"] is None:
        kwargs["max_model_len"] = min(mc.max_position_embeddings, 8192)
    sigma = 0.8                                  # log-normal lengths with the asked means
    mean = lambda m: float(np.log(m) - sigma**2 / 2)  # noqa: E731
    make = lambda: synthetic_requests(  # noqa: E731
        args.num_prompts, prompt=(mean(args.input_len), sigma, 4, kwargs["max_model_len"] // 2),
        output=(mean(args.output_len), sigma, 1, kwargs["max_model_len"] // 2),
        vocab_size=mc.vocab_size, shared_prefix=args.shared_prefix, seed=args.seed)
    slo = SLO(args.slo_ttft, args.slo_itl)
    sim = dict(model=args.model, profile=profile,
               enable_chunked_prefill=args.enable_chunked_prefill,
               preemption_mode=args.preemption_mode, **kwargs)
    if args.capacity:
        rate, res = capacity(make, slo, **sim)
        print(f"capacity: {rate:.2f} requests/s with >= 90% of requests within the SLO")
    else:
        res = simulate(poisson_arrivals(make(), args.request_rate, seed=args.seed),
                       progress=True, **sim)
    print(res.summary(slo))
    if args.plot:
        plot(res, args.plot, slo)
        print(f"plots: {args.plot}")
