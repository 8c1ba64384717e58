"""This machine's profile, fitted from real engine steps.

    profile = calibrate(llm)                 # a few dozen steps of varied shape, a fit, stored

(The check that keeps the simulator honest, the same workload served for real and simulated,
schedule and seconds side by side, is simulator/cli.py's run_both.)

First the linear layers alone are timed at each row count from 1 to 64 (linear_row_costs): a
CPU's GEMM is far from linear in its rows (a staircase in blocks of 8, which the engine's
`linear` pads to; below 128 rows a row costs more the fewer there are), which no cost per FLOP
can follow. Then a step's shape (sequences, linear FLOPs, prefill and decode attention FLOPs,
bytes) is rebuilt from its StepRecord: each sequence's new tokens, the tokens already in its
KV (prefix-cache hits included) and whether it sampled. The fit (cost_model.fit_profile) is
least squares of the steps' measured seconds on those features. The calibration workloads
(prompt lengths 16 to 400, one to 16 sequences at once) are seeded apart from any workload a
test or lesson validates on (validation_workloads: `minivllm simulate --validate`).

No vLLM twin. Vidur profiles every operator at every shape, then fits random forests; this
times one operator (the linears) at every row count and fits six numbers for the rest.
"""

from __future__ import annotations

import os

from minivllm.benchmarks.cpu import linears_alone
from minivllm.benchmarks.roofline import measure_peaks
from minivllm.benchmarks.workloads import (bimodal_requests, lognormal_requests, poisson_arrivals,
                                           serve)
from minivllm.engine.stats import StepRecord
from minivllm.simulator.cost_model import HardwareProfile, StepTimer, fit_profile, save_profile


def step_features(steps: list[StepRecord], timer: StepTimer) -> list[tuple[float, ...]]:
    """StepTimer.features of each recorded step, from what it scheduled: each sequence's new
    tokens, its context after them (prefix-cache hits included: their keys are read though
    never computed) and whether it sampled."""
    return [timer.features([s.num_tokens for s in st.scheduled],
                           [s.num_computed_tokens + s.num_tokens for s in st.scheduled],
                           sum(s.samples for s in st.scheduled)) for st in steps]


def step_seconds(steps: list[StepRecord]) -> list[float]:
    """Each step's seconds from its start to the next step's start: the serving loop's own
    work between steps (adding requests, outputs) is time a request waits too. The calibration
    workloads arrive at once, so no idle wait for an arrival is counted."""
    return [b.start_time - a.start_time for a, b in zip(steps, steps[1:])] + [steps[-1].duration]


def calibration_workloads(tokenizer) -> list[list]:
    """Varied shapes: long prompts alone, a crowd of short ones decoding together, a mix,
    prompts arriving one every two steps or so (steps of one short prefill beside a few
    decodes, the shape of open-loop serving, where a fit to whole-batch prefills alone
    under-predicts: a small matmul runs further from the peak than a large one), and long
    prompts decoding together (decode attention over long contexts: without them the decode
    attention term is read off contexts under 100 tokens, and long ones were under-predicted
    by 10-15%)."""
    return [lognormal_requests(tokenizer, 3, prompt=(5.5, 0.5, 100, 400), output=(1.5, 0.3, 3, 5),
                               seed=101),
            lognormal_requests(tokenizer, 16, prompt=(3.5, 0.5, 16, 80), output=(2.5, 0.4, 6, 20),
                               seed=102),
            lognormal_requests(tokenizer, 10, prompt=(4.5, 0.8, 16, 300), output=(2.5, 0.6, 4, 20),
                               seed=103),
            poisson_arrivals(lognormal_requests(tokenizer, 12, prompt=(4.0, 0.7, 16, 300),
                                                output=(2.8, 0.5, 4, 30), seed=105),
                             rate=0.5, seed=105, unit="steps"),
            lognormal_requests(tokenizer, 6, prompt=(5.7, 0.2, 200, 400), output=(3.0, 0.2, 12, 24),
                               seed=106)]


def validation_workloads(tokenizer, num_requests: int = 48) -> dict[str, list]:
    """Held-out workloads, seeded apart from the calibration's and unlike it: bimodal
    prompts (short questions, long documents), about half behind a shared system prompt,
    Poisson arrivals in seconds that queue; and log-normal prompts with no sharing. What
    `minivllm simulate --validate` and docs/benchmarks.md compare real and simulated runs on."""
    arrive = lambda reqs, rate, seed: poisson_arrivals(reqs, rate, seed=seed)  # noqa: E731
    return {
        "bimodal, 128-token shared prefix, 4/s": arrive(
            bimodal_requests(tokenizer, num_requests, seed=7), 4.0, 7),
        "bimodal, 128-token shared prefix, 6/s": arrive(
            bimodal_requests(tokenizer, num_requests, seed=11), 6.0, 11),
        "bimodal, 64-token shared prefix, 3/s": arrive(
            bimodal_requests(tokenizer, num_requests, seed=13, system_tokens=64), 3.0, 13),
        "log-normal, no sharing, 8/s": arrive(lognormal_requests(
            tokenizer, num_requests, prompt=(4.3, 0.6, 16, 300), output=(3.0, 0.5, 4, 48),
            seed=32), 8.0, 32)}


def linear_row_costs(model, max_rows: int = 128, stepped: int = 64) -> tuple[float, ...]:
    """The linear layers' seconds per row at 1 ... max_rows rows, relative to their seconds per
    row at max_rows: HardwareProfile.linear_row_cost. Every count up to `stepped` is timed
    (benchmarks/cpu.py linears_alone: each nn.Linear of the model in order, through its own
    `linear`), once each, since blocks of 8 rows differ by more than a timing's noise (`linear`
    pads to them: 9 to 15 rows cost what 16 do, 17 rows 1.4 times as much on a Zen 3); past
    it, one GEMM path, close to linear, read off a straight line to max_rows (best of two)."""
    linears_alone(model, stepped, stepped)                               # warm-up
    seconds = [linears_alone(model, r, r) for r in range(1, stepped + 1)]
    last = min(linears_alone(model, max_rows, max_rows) for _ in range(2))
    seconds += [seconds[-1] + (last - seconds[-1]) * (r - stepped) / (max_rows - stepped)
                for r in range(stepped + 1, max_rows + 1)]
    per_row = last / max_rows
    return tuple(round(t / r / per_row, 3) for r, t in enumerate(seconds, start=1))


# --8<-- [start:calibrate]
def calibrate(llm, save: bool = True, progress: bool = False) -> HardwareProfile:
    """Measure this machine's peaks (roofline.measure_peaks), time the model's linear layers at
    each row count (linear_row_costs: `llm`'s engine core must run in this process), serve the
    calibration workloads through `llm` (its engine settings as they are), and fit the profile
    to the steps' seconds. save=True stores it where get_profile("cpu") finds it."""
    peaks = measure_peaks("cpu", llm.engine.dtype)
    base = HardwareProfile("this CPU", kind="measured fit", source="", dtype=str(
        llm.engine.dtype).removeprefix("torch."), peak_flops=peaks.flops, bandwidth=peaks.bandwidth,
        memory_bytes=os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), overlap=False,
        linear_row_cost=linear_row_costs(llm.engine.runner.model))
    timer = StepTimer(llm.engine.model_config.hf_config, base)   # 1-device profile, nothing fitted
    rows, seconds = [], []
    serve(llm, lognormal_requests(llm.tokenizer, 2, output=(1.0, 0.1, 2, 4), seed=100))  # warm-up
    workloads = calibration_workloads(llm.tokenizer)
    for k, requests in enumerate(workloads):
        tag = f"cal{k}-"
        llm.reset_prefix_cache()              # no hits left over from an earlier workload
        run = serve(llm, requests, tag=tag)
        rows += step_features(run.steps, timer)
        seconds += step_seconds(run.steps)
        if progress:
            print(f"calibration workload {k + 1}/{len(workloads)}: {len(run.steps)} steps")
    fit = fit_profile(rows, seconds, peaks.flops, peaks.bandwidth, dtype=base.dtype,
                      memory_bytes=base.memory_bytes, linear_row_cost=base.linear_row_cost)
    if save:
        save_profile(fit)
    return fit
# --8<-- [end:calibrate]
