"""`minivllm simulate`: a deployment served in simulation (minivllm/simulator/), a summary
table, plots, and the highest request rate that meets an SLO. The command lives in the
simulator's package: it imports the benchmarks' workloads and serving driver, as the simulator
does, and nothing in benchmarks/ imports the simulator back.

    minivllm simulate --model Llama-3-70B --profile H100 -tp 8 --num-prompts 2000 \
        --request-rate 10 --slo-ttft 2 --slo-itl 0.1 --plot sim.png
    minivllm simulate --model path/to/config.json --profile L4 --capacity   # the highest rate
    minivllm simulate --model Llama-3-70B -tp 4 --disaggregated 1 1   # prefill + decode engines
    minivllm simulate --compare-routing -dp 8   # DP routing policies on multi-turn chats
    minivllm simulate --calibrate         # fit this CPU's profile from real engine steps

Every number printed is simulated, on the profile its first line names (data-sheet profiles
are peaks from the vendor's sheet and assumed efficiencies: cost_model.py says which).
The capacity search is a binary search over the Poisson rate, as Vidur-Search does. run_both
is the check that keeps the simulator honest: one workload served by the real engine and by
`simulate` set up like it, so schedules (same_schedule) and seconds (real_latencies against
the SimResult's) can be compared; tests/test_simulator.py and lesson 17 use it.

No vLLM twin: vLLM has no simulator (cf. Vidur, MLSys 2024).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import gc

import numpy as np

from minivllm.benchmarks.workloads import ServeResult, poisson_arrivals, serve
from minivllm.engine.arg_utils import add_cli_args as add_engine_args
from minivllm.engine.arg_utils import engine_kwargs
from minivllm.simulator.calibrate import step_features
from minivllm.simulator.cost_model import (MODEL_SHAPES, PROFILES, HardwareProfile, StepTimer,
                                           get_profile, model_config, profile_path)
from minivllm.simulator.disaggregated import simulate_disaggregated
from minivllm.engine.stats import StepRecord
from minivllm.simulator.simulator import SLO, SimResult, simulate, synthetic_requests


def summary(res: SimResult, slo: SLO | None = None) -> str:
    """A table of the run (every number simulated, on the profile named in its title)."""
    p = lambda a, q: f"{np.percentile(a, q):8.3f}"  # noqa: E731
    lines = [f"simulated: {res.label}",
             f"  requests {len(res.ttft)}, steps {len(res.steps)}, simulated time "
             f"{res.elapsed:.1f} s, {len(res.ttft) / res.elapsed:.2f} req/s, "
             f"{res.num_output_tokens / res.elapsed:,.0f} output tok/s",
             f"  KV blocks {res.num_kv_blocks}, peak in use "
             f"{max(s.stats.num_blocks_used for s in res.steps)}, "
             f"preemptions {res.num_preemptions}",
             f"  {'seconds':<10}{'p50':>8} {'p90':>8} {'p99':>8}"]
    for name, a in (("TTFT", res.ttft), ("ITL", res.itl), ("E2E", res.e2e)):
        lines.append(f"  {name:<10}{p(a, 50)} {p(a, 90)} {p(a, 99)}")
    if slo is not None:
        lines.append(f"  goodput {res.goodput(slo):.1%} of requests within TTFT <= "
                     f"{slo.ttft} s and ITL <= {slo.itl} s")
    lines.append(f"  (simulated in {res.wall:.1f} s of wall time, "
                 f"{len(res.steps) / max(res.wall, 1e-9):,.0f} steps/s)")
    return "\n".join(lines)


# --8<-- [start:capacity]
def capacity(make_requests, slo: SLO, target: float = 0.9, lo: float = 0.5,
             iterations: int = 8, sim=simulate, **sim_kwargs) -> tuple[float, SimResult]:
    """The highest Poisson rate (requests/s) whose goodput under `slo` is at least `target`:
    double the rate until it fails, then bisect `iterations` times. make_requests() returns a
    fresh workload; each try gives it arrivals at the rate (the same seed: only the rate
    changes) and serves it with sim (simulate, or simulate_disaggregated). Returns the rate
    and its run."""
    def run(rate: float) -> SimResult:
        return sim(poisson_arrivals(make_requests(), rate, seed=0), **sim_kwargs)

    best = run(lo)
    if best.goodput(slo) < target:
        raise ValueError(f"even {lo} requests/s misses the SLO (goodput "
                         f"{best.goodput(slo):.0%} < {target:.0%}): lower lo or loosen the SLO")
    hi = lo * 2
    while (res := run(hi)).goodput(slo) >= target:
        lo, best = hi, res
        hi *= 2
    for _ in range(iterations):
        mid = (lo + hi) / 2
        res = run(mid)
        if res.goodput(slo) >= target:
            lo, best = mid, res
        else:
            hi = mid
    return lo, best
# --8<-- [end:capacity]


# ------------------------------------------------ checked against the real engine
def engine_settings(llm) -> dict:
    """The settings (EngineArgs fields) the scheduler reads, and the pool size, of a real
    engine: what `simulate` needs to schedule exactly as it does."""
    c = llm.engine.engine_args
    keep = ("max_model_len", "max_num_seqs", "max_num_batched_tokens", "block_size",
            "enable_chunked_prefill", "enable_prefix_caching", "preemption_mode", "scheduling",
            "swap_space")
    return {**{k: getattr(c, k) for k in keep},
            "num_kv_blocks": llm.engine.block_manager.num_blocks}


def run_both(llm, requests, profile) -> tuple[ServeResult, SimResult]:
    """The same requests served by the real engine and by the simulator set up like it. The
    real engine starts as the simulated one does, its prefix cache empty (blocks an earlier
    run left cached would turn the real run's prefills into hits). Emptied, not rebuilt: a
    fresh pool's first steps would pay for touching its pages."""
    llm.reset_prefix_cache()
    return serve(llm, requests), simulate_like(llm, requests, profile)


def simulate_like(llm, requests, profile) -> SimResult:
    """`requests` (copies) simulated on `profile`, the scheduler set up as `llm`'s engine."""
    return simulate([dataclasses.replace(r) for r in requests],
                    model=llm.engine.model_config.hf_config, profile=profile,
                    **engine_settings(llm))


def machine_drift(llm, profile: HardwareProfile, requests) -> float:
    """How much slower the machine runs now than when `profile` was fitted: a workload the fit
    saw (one of calibration_workloads), its real seconds over its simulated ones. A shared
    VM's speed moves 20-50% from one minute to the next (issue 40: identical calibration steps
    took 5.0, 5.9 and 7.8 s a minute apart), which no cost model can know: `validate` and the
    seconds test read it around the real runs and judge the fit on a machine that much slower."""
    real, sim = run_both(llm, requests, profile)
    return real.elapsed / sim.elapsed


def slowed(profile: HardwareProfile, factor: float) -> HardwareProfile:
    """The same fit on a machine `factor` times slower: every term's seconds times factor."""
    return dataclasses.replace(
        profile, peak_flops=profile.peak_flops / factor, bandwidth=profile.bandwidth / factor,
        overhead=profile.overhead * factor, per_seq=profile.per_seq * factor,
        prefill_overhead=profile.prefill_overhead * factor)


def schedule(steps: list[StepRecord]) -> list[tuple]:
    """Per step: (request, tokens, prefill?) of each scheduled sequence, and who was
    preempted: what two runs must share to have made the same decisions."""
    return [(tuple((s.request_id, s.num_tokens, s.is_prefill) for s in st.scheduled),
             tuple(st.preempted)) for st in steps]


def same_schedule(a: list[StepRecord], b: list[StepRecord]) -> bool:
    return schedule(a) == schedule(b)


def real_latencies(run: ServeResult) -> dict[str, np.ndarray]:
    """TTFT and E2E latency of a real run, seconds from each request's arrival."""
    return {"ttft": np.array(run.ttfts, dtype=float),
            "e2e": np.array([o.metrics.finished_time - t
                             for o, t in zip(run.outputs, run.arrival_time)])}


def step_kind(step: StepRecord, hit: bool = False) -> str:
    """decode, decode (batch 1), prefill or mixed (prefill chunks beside decodes), and
    "with prefix hits" when `hit` (a prompt's first chunk starts past cached tokens)."""
    prefill = sum(s.num_tokens > 1 for s in step.scheduled)
    kind = ("mixed" if 0 < prefill < step.num_seqs else "prefill" if prefill
            else "decode (batch 1)" if step.num_seqs == 1 else "decode")
    return kind + (" with prefix hits" if hit else "")


def step_errors(steps: list[StepRecord], timer) -> dict[str, dict[str, float]]:
    """Per kind of step (step_kind): how many, measured and predicted seconds (a StepTimer's
    for each recorded step's shape), and the error, predicted / measured - 1: where a
    simulation's error comes from. Measured is the step's own duration: an idle wait for an
    arrival before the next step is not the step's."""
    table: dict[str, dict[str, float]] = {}
    started: set[str] = set()             # requests whose prompt has begun (a later chunk
    for st, row in zip(steps, step_features(steps, timer)):    # also starts past tokens)
        hit = any(s.is_prefill and s.num_computed_tokens and s.request_id not in started
                  for s in st.scheduled)
        started.update(s.request_id for s in st.scheduled)
        e = table.setdefault(step_kind(st, hit), {"steps": 0, "measured": 0.0,
                                                  "predicted": 0.0})
        e["steps"] += 1
        e["measured"] += st.duration
        e["predicted"] += timer.time_of(*row, st.num_batched_tokens)
    for e in table.values():
        e["error"] = e["predicted"] / e["measured"] - 1
    return dict(sorted(table.items()))


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
    end = [s.start_time + s.duration for s in res.steps]
    axes[1].plot(end, [s.stats.num_blocks_used for s in res.steps])
    axes[1].axhline(res.num_kv_blocks, ls=":", c="k", label="pool")
    axes[1].set(xlabel="seconds (simulated)", ylabel="KV blocks in use", title="KV blocks")
    axes[1].legend()
    axes[2].plot(end, [len(s.scheduled) for s in res.steps])
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
    p.add_argument("--disaggregated", type=int, nargs=2, metavar=("PREFILL", "DECODE"),
                   help="prefill/decode disaggregation: this many prefill and decode engines, "
                   "each -tp GPUs, the KV handed over the profile's link")
    p.add_argument("--validate", action="store_true",
                   help="serve held-out workloads for real and simulated (each after a fresh "
                   "calibration) and print the error per kind of step and of TTFT / E2E p50 "
                   "and p90")
    p.add_argument("--compare-routing", action="store_true",
                   help="round-robin vs load score vs prefix-aware routing on -dp simulated "
                   "H100 replicas of Llama-3-8B, 128 multi-turn chats (workloads.chat_turns)")
    p.add_argument("--calibrate", action="store_true",
                   help="fit this CPU's profile from real steps of the packaged model, store it")
    add_engine_args(p)


def fitted_terms(p: HardwareProfile) -> str:
    """A fitted profile's numbers in a line: what --calibrate, --validate and lesson 17 print.
    An efficiency is infinite where the fit dropped its term (a negative coefficient). One over
    100% says the machine ran faster during the steps than during the peak's few matmuls (a
    shared VM's speed moves by tens of percent from one minute to the next), and says so."""
    pct = lambda e: "too small to see" if e == float("inf") else f"at {e:.0%}"  # noqa: E731
    efficiencies = (p.compute_efficiency, p.attention_efficiency, p.decode_attention_efficiency)
    faster = any(1 < e < float("inf") for e in efficiencies)
    return (f"overhead {1e3 * p.overhead:.1f} ms a step, {1e3 * p.per_seq:.2f} ms a sequence, "
            f"{1e3 * p.prefill_overhead:.1f} ms more with a prompt chunk; linears "
            f"{pct(p.compute_efficiency)}, prefill attention {pct(p.attention_efficiency)}, "
            f"decode attention {pct(p.decode_attention_efficiency)} of the measured "
            f"{p.peak_flops / 1e9:.0f} GFLOP/s matmul peak"
            + (" (over 100%: the machine ran faster during the steps than while its peak was "
               "measured)" if faster else ""))


def validate(llm, profile, workloads: dict[str, list],
             reference: list | None = None) -> tuple[str, dict]:
    """Each workload served for real twice, and simulated on `profile`: the error per kind of
    step (step_errors, over both real runs' steps), and of TTFT and E2E latency's p50 and p90
    against the two runs' mean, beside the two runs' own spread (what the machine's noise
    alone moves). `profile` may also be a function that fits one, called before each workload:
    a fit taken just before the real runs it predicts (a shared VM's speed drifts 10-20% within
    minutes, and a fit from minutes before puts that drift into every number). With a
    `reference` workload the fit saw, the machine's drift is read before and after the real
    runs (machine_drift) and the total predicted again for a machine that much slower.
    Returns the printed report and the numbers."""
    refit = callable(profile)
    lines, numbers = [] if refit else [f"profile: {profile.label}, {profile.source}"], {}
    for name, requests in workloads.items():
        fit = profile() if refit else profile
        timer = StepTimer(llm.engine.model_config.hf_config, fit)
        drifts = [machine_drift(llm, fit, reference)] if reference else []
        real, sim = run_both(llm, requests, fit)
        llm.reset_prefix_cache()                          # the second run starts cold too
        again = serve(llm, requests)
        total = [real.elapsed, again.elapsed]
        if reference:
            drifts.append(machine_drift(llm, fit, reference))
            slow = simulate_like(llm, requests, slowed(fit, float(np.mean(drifts))))
        lines += [f"\n{name}: {len(requests)} requests, {len(real.steps)} / {len(again.steps)} "
                  f"steps real, {len(sim.steps)} simulated; total {sim.elapsed:.2f} s vs "
                  f"{total[0]:.2f} / {total[1]:.2f} s ({sim.elapsed / np.mean(total) - 1:+.1%})",
                  *([f"  fitted just before: {fit.source}: {fitted_terms(fit)}"]
                    if refit else []),
                  *([f"  machine drift since the fit: {drifts[0]:.2f} before, {drifts[1]:.2f} "
                     f"after (real / simulated seconds of a workload the fit saw); for a "
                     f"machine that much slower, total {slow.elapsed:.2f} s "
                     f"({slow.elapsed / np.mean(total) - 1:+.1%})"] if reference else []),
                  f"  {'step kind':<30}{'steps':>6}{'measured ms':>13}{'predicted':>11}"
                  f"{'error':>8}"]
        kinds = step_errors(real.steps + again.steps, timer)
        for kind, e in kinds.items():
            lines.append(f"  {kind:<30}{e['steps']:>6}{1e3 * e['measured'] / e['steps']:>13.1f}"
                         f"{1e3 * e['predicted'] / e['steps']:>11.1f}{e['error']:>+8.1%}")
        numbers[name] = {"steps": kinds, "total": sim.elapsed / np.mean(total) - 1}
        if reference:
            numbers[name] |= {"drift": drifts, "total, drift-corrected":
                              slow.elapsed / np.mean(total) - 1}
        for key in ("ttft", "e2e"):
            for q in (50, 90):
                m = [np.percentile(real_latencies(r)[key], q) for r in (real, again)]
                p = np.percentile(getattr(sim, key), q)
                numbers[name][f"{key} p{q}"] = (p / np.mean(m) - 1, abs(m[0] - m[1]) / np.mean(m))
                lines.append(f"  {key.upper()} p{q}: simulated {p:.2f} s, real {m[0]:.2f} / "
                             f"{m[1]:.2f} s: error {p / np.mean(m) - 1:+.1%}, real spread "
                             f"{abs(m[0] - m[1]) / np.mean(m):.1%}")
    return "\n".join(lines), numbers


def compare_routing(num_replicas: int) -> None:
    """Each policy on `num_replicas` simulated H100s (Llama-3-8B, data-sheet profile): the
    engine's own cores and router on a virtual clock (minivllm/simulator/)."""
    from minivllm.benchmarks.routing import POLICIES
    from minivllm.benchmarks.workloads import chat_turns
    print(f"\nsimulated: {num_replicas} x H100 (data sheet, assumed efficiencies), Llama-3-8B, "
          "128 chats x 4 turns (512-token system prompts, 128-token messages, 64-token "
          "answers, a chat every 0.25 s, a turn every 5 s)")
    print(f"{'policy':<12} {'prompt':>8} {'computed':>9} {'hit':>5} {'TTFT p50':>9} {'p90':>8}")
    for policy in POLICIES:
        requests = chat_turns(128, 4)
        res = simulate(requests, model="Llama-3-8B", profile="H100",
                       data_parallel_size=num_replicas, data_parallel_balance=policy,
                       kv_events_config={"enable_kv_cache_events": True})
        prompt = sum(len(r.prompt) for r in requests)
        computed = sum(s.num_prefill_tokens for s in res.steps)
        print(f"{policy:<12} {prompt:>8} {computed:>9} {1 - computed / prompt:>5.0%} "
              f"{1000 * np.median(res.ttft):>7.0f}ms {1000 * np.percentile(res.ttft, 90):>6.0f}ms")


def run(args: argparse.Namespace) -> None:
    if args.compare_routing:
        return compare_routing(args.data_parallel_size)
    if args.calibrate or args.validate:
        from minivllm import LLM
        from minivllm.simulator.calibrate import (calibrate, calibration_workloads,
                                                  validation_workloads)
        llm = LLM(max_model_len=512)
        if args.validate:
            fit = functools.partial(calibrate, llm, save=False, progress=True)
            print(validate(llm, fit, validation_workloads(llm.tokenizer),
                           reference=calibration_workloads(llm.tokenizer)[2])[0])
        else:
            fit = calibrate(llm, progress=True)
            print(f"stored {profile_path()}: {fit.source}\n{fitted_terms(fit)}")
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
    if args.disaggregated:
        run_one = functools.partial(simulate_disaggregated, num_prefill=args.disaggregated[0],
                                    num_decode=args.disaggregated[1])
    else:
        run_one = functools.partial(simulate, progress=not args.capacity)
    # A long run builds millions of small step records that hold no reference cycles: the
    # cyclic collector would only rescan them (a third of a 10,000-request run's time).
    gc.disable()
    if args.capacity:
        rate, res = capacity(make, slo, sim=run_one, **sim)
        print(f"capacity: {rate:.2f} requests/s with >= 90% of requests within the SLO")
    else:
        res = run_one(poisson_arrivals(make(), args.request_rate, seed=args.seed), **sim)
    print(summary(res, slo))
    if args.plot:
        plot(res, args.plot, slo)
        print(f"plots: {args.plot}")
