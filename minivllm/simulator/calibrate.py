"""This machine's profile, fitted from real engine steps, and the check that keeps the simulator
honest: the same workload served for real and simulated, schedule and seconds side by side.

    profile = calibrate(llm)                 # a few dozen steps of varied shape, a fit, stored
    real, sim = run_both(llm, requests, profile)
    same_schedule(real.steps, sim.steps)     # True: the scheduler is the engine's own
    real_latencies(real)["e2e"], sim.e2e     # measured vs predicted, seconds

A step's shape (sequences, linear FLOPs, attention FLOPs, bytes) is rebuilt from its
StepRecord: each request's context grows by the tokens it computed, and drops to zero when it
is preempted (recomputed). The fit (cost_model.fit_profile) is least squares of the steps'
measured seconds on those features. The calibration workloads (prompt lengths 16 to 400, one
to 16 sequences at once) are seeded apart from any workload a test or lesson validates on.

No vLLM twin (Vidur profiles each operator on the GPU instead, then fits random forests).
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from minivllm.benchmarks.roofline import measure_peaks
from minivllm.benchmarks.workloads import ServeResult, lognormal_requests, serve
from minivllm.engine.stats import StepRecord
from minivllm.simulator.cost_model import HardwareProfile, StepTimer, fit_profile, save_profile
from minivllm.simulator.simulator import SimResult, simulate


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
    """Varied shapes: long prompts alone, a crowd of short ones decoding together, a mix."""
    return [lognormal_requests(tokenizer, 3, prompt=(5.5, 0.5, 100, 400), output=(1.5, 0.3, 3, 5),
                               seed=101),
            lognormal_requests(tokenizer, 16, prompt=(3.5, 0.5, 16, 80), output=(2.5, 0.4, 6, 20),
                               seed=102),
            lognormal_requests(tokenizer, 10, prompt=(4.5, 0.8, 16, 300), output=(2.5, 0.6, 4, 20),
                               seed=103)]


def _cpu_profile(llm, peaks) -> HardwareProfile:
    """A 1-device profile with this CPU's measured peaks and nothing fitted yet."""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return HardwareProfile("this CPU", kind="measured fit", source="", dtype=str(
        llm.engine.dtype).removeprefix("torch."), peak_flops=peaks.flops,
        bandwidth=peaks.bandwidth, memory_bytes=memory, overlap=False)


# --8<-- [start:calibrate]
def calibrate(llm, save: bool = True, progress: bool = False) -> HardwareProfile:
    """Measure this machine's peaks (roofline.measure_peaks), serve the calibration workloads
    through `llm` (its engine settings as they are), and fit the profile to the steps' seconds.
    save=True stores it where get_profile("cpu") finds it (cost_model.profile_path)."""
    peaks = measure_peaks("cpu", llm.engine.dtype)
    base = _cpu_profile(llm, peaks)
    timer = StepTimer(llm.engine.model_config, base)
    rows, seconds = [], []
    serve(llm, lognormal_requests(llm.tokenizer, 2, output=(1.0, 0.1, 2, 4), seed=100))  # warm-up
    for k, requests in enumerate(calibration_workloads(llm.tokenizer)):
        tag = f"cal{k}-"
        run = serve(llm, requests, tag=tag)
        lens = {f"{tag}{i}": len(r.prompt) for i, r in enumerate(requests)}
        rows += step_features(run.steps, lens, timer)
        seconds += step_seconds(run.steps)
        if progress:
            print(f"calibration workload {k + 1}/3: {len(run.steps)} steps", flush=True)
    fit = fit_profile(rows, seconds, peaks.flops, peaks.bandwidth, dtype=base.dtype,
                      memory_bytes=base.memory_bytes)
    if save:
        save_profile(fit)
    return fit
# --8<-- [end:calibrate]


def engine_settings(llm) -> dict:
    """The EngineConfig fields the scheduler reads, and the pool size, of a real engine: what
    `simulate` needs to schedule exactly as it does."""
    c = llm.engine.config
    keep = ("max_model_len", "max_num_seqs", "max_num_batched_tokens", "block_size",
            "enable_chunked_prefill", "enable_prefix_caching", "preemption_mode", "scheduling",
            "swap_space")
    return {**{k: getattr(c, k) for k in keep},
            "num_kv_blocks": llm.engine.block_manager.num_blocks}


def run_both(llm, requests, profile) -> tuple[ServeResult, SimResult]:
    """The same requests served by the real engine and by the simulator set up like it."""
    real = serve(llm, requests)
    sim = simulate([dataclasses.replace(r) for r in requests], model=llm.engine.model_config,
                   profile=profile, **engine_settings(llm))
    return real, sim


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
