"""This machine's profile, fitted from real engine steps.

    profile = calibrate(llm)                 # a few dozen steps of varied shape, a fit, stored

(The check that keeps the simulator honest, the same workload served for real and simulated,
schedule and seconds side by side, is benchmarks/simulate.py's run_both.)

A step's shape (sequences, linear FLOPs, attention FLOPs, bytes) is rebuilt from its
StepRecord: each request's context grows by the tokens it computed, and drops to zero when it
is preempted (recomputed). The fit (cost_model.fit_profile) is least squares of the steps'
measured seconds on those features. The calibration workloads (prompt lengths 16 to 400, one
to 16 sequences at once) are seeded apart from any workload a test or lesson validates on.

No vLLM twin (Vidur profiles each operator on the GPU instead, then fits random forests).
"""

from __future__ import annotations

import os

import numpy as np

from minivllm.benchmarks.roofline import measure_peaks
from minivllm.benchmarks.workloads import lognormal_requests, poisson_arrivals, serve
from minivllm.engine.stats import StepRecord
from minivllm.simulator.cost_model import HardwareProfile, StepTimer, fit_profile, save_profile


def step_features(steps: list[StepRecord], prompt_lens: dict[str, int], timer: StepTimer
                  ) -> list[tuple[float, ...]]:
    """StepTimer.features of each recorded step, from what it scheduled: prompt_lens maps a
    request id to its prompt length (to tell which sequences reached their end and sampled)."""
    context: dict[str, int] = {}
    emitted: dict[str, int] = {}
    rows = []
    for st in steps:
        for rid in st.preempted:                      # recomputed from the start
            context[rid] = 0
        new, ctx = [], []
        sampled = 0
        for s in st.scheduled:
            context[s.request_id] = context.get(s.request_id, 0) + s.num_tokens
            new.append(s.num_tokens)
            ctx.append(context[s.request_id])
            if context[s.request_id] >= prompt_lens[s.request_id] + emitted.get(s.request_id, 0):
                emitted[s.request_id] = emitted.get(s.request_id, 0) + 1
                sampled += 1
        rows.append(timer.features(new, ctx, sampled))
    return rows


def step_seconds(steps: list[StepRecord]) -> list[float]:
    """Each step's seconds from its start to the next step's start: the serving loop's own
    work between steps (adding requests, outputs) is time a request waits too. The calibration
    workloads arrive at once, so no idle wait for an arrival is counted."""
    return [b.start_time - a.start_time for a, b in zip(steps, steps[1:])] + [steps[-1].duration]


def calibration_workloads(tokenizer) -> list[list]:
    """Varied shapes: long prompts alone, a crowd of short ones decoding together, a mix, and
    prompts arriving one every two steps or so: steps of one short prefill beside a few
    decodes, the shape of open-loop serving, where a fit to whole-batch prefills alone
    under-predicts (a small matmul runs further from the peak than a large one)."""
    return [lognormal_requests(tokenizer, 3, prompt=(5.5, 0.5, 100, 400), output=(1.5, 0.3, 3, 5),
                               seed=101),
            lognormal_requests(tokenizer, 16, prompt=(3.5, 0.5, 16, 80), output=(2.5, 0.4, 6, 20),
                               seed=102),
            lognormal_requests(tokenizer, 10, prompt=(4.5, 0.8, 16, 300), output=(2.5, 0.6, 4, 20),
                               seed=103),
            poisson_arrivals(lognormal_requests(tokenizer, 12, prompt=(4.0, 0.7, 16, 300),
                                                output=(2.8, 0.5, 4, 30), seed=105),
                             rate=0.5, seed=105, unit="steps")]


# --8<-- [start:calibrate]
def calibrate(llm, save: bool = True, progress: bool = False) -> HardwareProfile:
    """Measure this machine's peaks (roofline.measure_peaks), serve the calibration workloads
    through `llm` (its engine settings as they are), and fit the profile to the steps' seconds.
    save=True stores it where get_profile("cpu") finds it (cost_model.profile_path)."""
    peaks = measure_peaks("cpu", llm.engine.dtype)
    base = HardwareProfile("this CPU", kind="measured fit", source="", dtype=str(
        llm.engine.dtype).removeprefix("torch."), peak_flops=peaks.flops, bandwidth=peaks.bandwidth,
        memory_bytes=os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), overlap=False)
    timer = StepTimer(llm.engine.model_config.hf_config, base)   # 1-device profile, nothing fitted
    rows, seconds = [], []
    serve(llm, lognormal_requests(llm.tokenizer, 2, output=(1.0, 0.1, 2, 4), seed=100))  # warm-up
    workloads = calibration_workloads(llm.tokenizer)
    for k, requests in enumerate(workloads):
        tag = f"cal{k}-"
        run = serve(llm, requests, tag=tag)
        lens = {f"{tag}{i}": len(r.prompt) for i, r in enumerate(requests)}
        rows += step_features(run.steps, lens, timer)
        seconds += step_seconds(run.steps)
        if progress:
            print(f"calibration workload {k + 1}/{len(workloads)}: {len(run.steps)} steps")
    fit = fit_profile(rows, seconds, peaks.flops, peaks.bandwidth, dtype=base.dtype,
                      memory_bytes=base.memory_bytes)
    if save:
        save_profile(fit)
    return fit
# --8<-- [end:calibrate]
