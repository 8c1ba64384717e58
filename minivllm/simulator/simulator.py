"""The engine's own Scheduler and BlockManager on a virtual clock: `simulate` serves a workload
the way `workloads.serve` does, with a SimulatedRunner in place of the model runner and a
StepTimer (cost_model.py) in place of the forward pass.

    res = simulate(requests, model="Llama-3-70B", profile="H100", tensor_parallel_size=8,
                   max_num_seqs=256, max_num_batched_tokens=8192)
    res.steps[3]              # a StepRecord, as engine.trace() records one
    res.ttft, res.e2e, res.itl, res.goodput(SLO(ttft=2.0, itl=0.1)), res.summary()

Nothing about scheduling is re-implemented here: every step is `Scheduler.schedule()`, the
runner's made-up ModelRunnerOutput, then `Scheduler.update_from_output`, exactly LLMEngine.step
without the weights (tests/test_scheduler.py drives it the same way). So the simulated schedule
is the engine's by construction, and tests/test_simulator.py checks it equals a real run's,
step for step. A request's output length is its max_tokens (make workloads with ignore_eos, or
draw max_tokens from a length distribution: `synthetic_requests`).

No vLLM twin. Vidur (MLSys 2024) simulates vLLM by re-implementing its scheduler; this one
imports it. Left out: speculative decoding, LoRA and n > 1 fan-out costs (they schedule, but the
cost model does not price drafts or adapters), multi-turn `follows`, and prefill/decode
disaggregation (two simulated engines and a KV link: not written yet).
"""

from __future__ import annotations

import itertools
import math
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from minivllm.benchmarks.workloads import Request, poisson_arrivals
from minivllm.config import EngineConfig
from minivllm.core.block_manager import BlockManager
from minivllm.core.scheduler import Scheduler, SchedulerOutput
from minivllm.engine.processor import validate_request
from minivllm.engine.stats import EngineStats, ScheduledSeq, StepRecord
from minivllm.outputs import ModelRunnerOutput
from minivllm.core.sequence import SequenceGroup
from minivllm.sampling_params import SamplingParams
from minivllm.simulator.cost_model import StepTimer, get_profile, model_config


class SimulatedRunner:
    """execute_model without a model: every sequence whose tokens reach its end this step
    samples one token (an id of its own, never EOS), and the step costs what the StepTimer says.
    With n > 1, a finished prompt also draws the other samples' first tokens, as the real
    runner does."""

    def __init__(self, timer: StepTimer):
        self.timer = timer

    # --8<-- [start:execute_model]
    def execute_model(self, so: SchedulerOutput) -> tuple[ModelRunnerOutput, float]:
        out = ModelRunnerOutput()
        contexts = []
        for seq, n in zip(so.seqs, so.num_new_tokens):
            contexts.append(seq.num_computed_tokens + n)
            if seq.num_computed_tokens + n >= len(seq):          # not a chunk short of the end
                token = seq.seq_id % 1000 + 3                    # any id but EOS (0..2)
                out.sampled[seq.seq_id] = [(token, None)]
                if seq.group.num_unforked:
                    out.forked[seq.seq_id] = [(token, None)] * seq.group.num_unforked
        sampled = len(out.sampled)
        seconds = self.timer.time(so.num_new_tokens, contexts, sampled) if so.seqs else 0.0
        return out, seconds
    # --8<-- [end:execute_model]


@dataclass(frozen=True)
class SLO:
    """A request meets it when its TTFT and its mean ITL (vLLM's TPOT) are within these, s."""
    ttft: float
    itl: float


@dataclass
class SimResult:
    """A simulated run: the StepRecords, and per request (in request order) arrival, TTFT, E2E
    latency and mean ITL in simulated seconds; `itl` holds every gap between two tokens."""

    steps: list[StepRecord]
    arrival: np.ndarray
    ttft: np.ndarray
    e2e: np.ndarray
    mean_itl: np.ndarray
    itl: np.ndarray
    num_output_tokens: int
    elapsed: float                 # simulated seconds, first arrival to last token
    label: str                     # model, deployment and profile, for every printed number
    num_kv_blocks: int
    wall: float = 0.0              # real seconds the simulation took
    blocks_used: list[int] = field(default_factory=list)     # per step, after it
    batch_size: list[int] = field(default_factory=list)      # sequences per step
    step_end: list[float] = field(default_factory=list)      # simulated clock after each step

    def goodput(self, slo: SLO) -> float:
        """Share of the requests that met the SLO (DistServe's goodput, as a share)."""
        return float(np.mean((self.ttft <= slo.ttft) & (self.mean_itl <= slo.itl)))

    @property
    def num_preemptions(self) -> int:
        return self.steps[-1].stats.num_preemptions if self.steps else 0

    def summary(self, slo: SLO | None = None) -> str:
        """A table of the run (every number simulated, on the profile named in its title)."""
        p = lambda a, q: f"{np.percentile(a, q):8.3f}"  # noqa: E731
        lines = [f"simulated: {self.label}",
                 f"  requests {len(self.ttft)}, steps {len(self.steps)}, simulated time "
                 f"{self.elapsed:.1f} s, {len(self.ttft) / self.elapsed:.2f} req/s, "
                 f"{self.num_output_tokens / self.elapsed:,.0f} output tok/s",
                 f"  KV blocks {self.num_kv_blocks}, peak in use {max(self.blocks_used)}, "
                 f"preemptions {self.num_preemptions}",
                 f"  {'seconds':<10}{'p50':>8} {'p90':>8} {'p99':>8}"]
        for name, a in (("TTFT", self.ttft), ("ITL", self.itl), ("E2E", self.e2e)):
            lines.append(f"  {name:<10}{p(a, 50)} {p(a, 90)} {p(a, 99)}")
        if slo is not None:
            lines.append(f"  goodput {self.goodput(slo):.1%} of requests within TTFT <= "
                         f"{slo.ttft} s and ITL <= {slo.itl} s")
        lines.append(f"  (simulated in {self.wall:.1f} s of wall time, "
                     f"{len(self.steps) / max(self.wall, 1e-9):,.0f} steps/s)")
        return "\n".join(lines)


def synthetic_requests(num_requests: int, prompt=(6.0, 0.8, 16, 4000), output=(5.0, 0.8, 4,
                       1000), vocab_size: int = 32000, shared_prefix: int = 0, seed: int = 0
                       ) -> list[Request]:
    """Requests made of lengths only, for models not on this machine: prompt and output are
    (mu, sigma, min, max) of a clipped log-normal, as workloads.lognormal_requests; prompt
    tokens are random ids (no two prompts share a block) behind `shared_prefix` tokens that
    every request shares (a system prompt: prefix caching's case). Greedy, EOS ignored."""
    rng = np.random.default_rng(seed)
    prompt_lens = np.clip(rng.lognormal(*prompt[:2], num_requests), *prompt[2:]).astype(int)
    output_lens = np.clip(rng.lognormal(*output[:2], num_requests), *output[2:]).astype(int)
    prefix = rng.integers(3, vocab_size, shared_prefix).tolist()
    return [Request(prefix + rng.integers(3, vocab_size, int(p)).tolist(),
                    SamplingParams(temperature=0, max_tokens=int(o), ignore_eos=True))
            for p, o in zip(prompt_lens, output_lens)]


def _stats(sched: Scheduler, bm: BlockManager) -> EngineStats:
    """EngineStats without LLMEngine.stats()'s per-block walk (slots held are counted per
    sequence: shared blocks twice), cheap enough to take every simulated step."""
    used = bm.num_blocks - bm.num_free_blocks
    cache = bm.prefix_cache
    return EngineStats(
        num_running=len(sched.running), num_waiting=len(sched.waiting),
        num_swapped=len(sched.swapped), num_blocks_used=used, num_blocks_total=bm.num_blocks,
        slots_reserved=used * bm.block_size,
        tokens_cached=sum(s.num_computed_tokens for s in sched.running),
        num_preemptions=sched.num_preemptions,
        prefix_cache_queried_tokens=cache.num_queried_tokens if cache else 0,
        prefix_cache_hit_tokens=cache.num_hit_tokens if cache else 0)


def simulate(requests: list[Request], model="Llama-3-8B", profile="H100",
             tensor_parallel_size: int = 1, progress: bool = False, tag: str = "req-",
             **engine_kwargs) -> SimResult:
    """Serve `requests` on a simulated deployment; engine_kwargs are EngineConfig fields
    (max_num_seqs, max_num_batched_tokens, block_size, num_kv_blocks, enable_chunked_prefill,
    enable_prefix_caching, preemption_mode, ...). num_kv_blocks defaults to what
    gpu_memory_utilization of one device's memory holds beside its share of the weights. A
    request joins when its arrival_step and arrival_time have come, as in workloads.serve."""
    wall0 = time.perf_counter()
    mc = model_config(model)
    prof = get_profile(profile)
    timer = StepTimer(mc, prof, tensor_parallel_size)
    engine_kwargs.setdefault("max_model_len", mc.max_position_embeddings)
    config = EngineConfig(**engine_kwargs)
    num_blocks = config.num_kv_blocks or timer.kv_pool_blocks(config.block_size,
                                                              config.gpu_memory_utilization)
    bm = BlockManager(num_blocks, config.block_size, config.enable_prefix_caching)
    cpu = None
    if config.preemption_mode == "swap":
        block_bytes = timer.kv_token_bytes * config.block_size
        cpu = BlockManager(max(1, int(config.swap_space // block_bytes)), config.block_size)
    sched = Scheduler(config, bm, cpu, eos_token_ids={2}, seq_ids=itertools.count())
    runner = SimulatedRunner(timer)
    if any(r.follows is not None for r in requests):
        raise ValueError("simulate does not follow multi-turn chats (Request.follows)")
    order = sorted(range(len(requests)),
                   key=lambda i: (requests[i].arrival_step, requests[i].arrival_time))
    pending = deque(order)
    n = len(requests)
    arrival = [0.0] * n               # lists, not arrays: a simulation touches them per token
    first = [math.nan] * n
    last = [0.0] * n
    tokens = [0] * n
    gaps: list[float] = []
    steps: list[StepRecord] = []
    blocks_used, batch_size, step_end = [], [], []
    index: dict[str, int] = {}
    clock = 0.0
    bar = _progress(n, progress)
    while pending or sched.has_unfinished():
        step = len(steps)
        if not sched.has_unfinished():            # idle: jump to the next arrival
            nxt = requests[pending[0]]
            clock = max(clock, nxt.arrival_time)
            step = max(step, nxt.arrival_step)
        while pending and (requests[pending[0]].arrival_step <= step
                           and requests[pending[0]].arrival_time <= clock):
            i = pending.popleft()
            r = requests[i]
            if isinstance(r.prompt, str):
                raise ValueError(f"request {i}: simulate takes token ids, not text")
            prompt = list(r.prompt)
            validate_request(prompt, r.params, config, mc, bm)
            index[f"{tag}{i}"] = i
            group = SequenceGroup(f"{tag}{i}", None, prompt, r.params, next(sched.seq_ids))
            sched.add(group.seqs[0])
            arrival[i] = r.arrival_time if r.arrival_time else clock
        # 1. schedule, 2. "execute" (the clock moves), 3. update: LLMEngine.step's phases.
        so = sched.schedule()
        if not so.seqs:                           # as LLMEngine.step: cannot happen
            raise RuntimeError(f"the scheduler found nothing to run: {_stats(sched, bm)}")
        out, seconds = runner.execute_model(so)
        updated = sched.update_from_output(so, out)
        clock += seconds
        for seq in updated:
            i = index[seq.request_id]
            if tokens[i]:
                gaps.append(clock - last[i])
            else:
                first[i] = clock
            tokens[i] += 1
            last[i] = clock
        finished = [s.request_id for s in sched.take_finished()]
        bar.update(len(finished))
        steps.append(StepRecord(
            step=len(steps),
            scheduled=[ScheduledSeq(s.request_id, s.index, k, p) for s, k, p in
                       zip(so.seqs, so.num_new_tokens, so.is_prefill)],
            preempted=[s.request_id for s in so.preempted],
            swapped_out=[s.request_id for s in so.swapped_out],
            swapped_in=[s.request_id for s in so.swapped_in],
            num_blocks_copied=len(so.blocks_to_copy), finished=finished, duration=seconds,
            stats=_stats(sched, bm), start_time=clock - seconds))
        blocks_used.append(steps[-1].stats.num_blocks_used)
        batch_size.append(len(so.seqs))
        step_end.append(clock)
    bar.close()
    arrival, first, last, tokens = map(np.asarray, (arrival, first, last, tokens))
    e2e = last - arrival
    ttft = first - arrival
    mean_itl = np.where(tokens > 1, (last - first) / np.maximum(tokens - 1, 1), 0.0)
    label = (f"{mc.architecture.removesuffix('ForCausalLM')} {mc.num_hidden_layers}L "
             f"h{mc.hidden_size} on {tensor_parallel_size} x {prof.label}")
    if isinstance(model, str):
        label = f"{model} on {tensor_parallel_size} x {prof.label}"
    return SimResult(steps, arrival, ttft, e2e, mean_itl, np.asarray(gaps),
                     int(tokens.sum()), clock, label,
                     num_blocks, time.perf_counter() - wall0, blocks_used, batch_size,
                     step_end)


# --8<-- [start:capacity]
def capacity(make_requests, slo: SLO, target: float = 0.9, lo: float = 0.5,
             iterations: int = 8, **sim_kwargs) -> tuple[float, SimResult]:
    """The highest Poisson rate (requests/s) whose goodput under `slo` is at least `target`:
    double the rate until it fails, then bisect `iterations` times. make_requests() returns a
    fresh workload; each try gives it arrivals at the rate (the same seed: only the rate
    changes). Returns the rate and its run."""
    def run(rate: float) -> SimResult:
        return simulate(poisson_arrivals(make_requests(), rate, seed=0), **sim_kwargs)

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


def _progress(total: int, show: bool):
    """A tqdm bar over finished requests, or a stand-in that does nothing."""
    if show:
        from tqdm import tqdm
        return tqdm(total=total, unit="req", desc="simulating", mininterval=0.5)

    class _Quiet:
        def update(self, _n):
            pass

        def close(self):
            pass
    return _Quiet()
