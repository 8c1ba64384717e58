"""The engine's own Scheduler and BlockManager on a virtual clock: `simulate` serves a workload
the way `workloads.serve` does, with a SimulatedRunner in place of the model runner and a
StepTimer (cost_model.py) in place of the forward pass.

    res = simulate(requests, model="Llama-3-70B", profile="H100", tensor_parallel_size=8,
                   max_num_seqs=256, max_num_batched_tokens=8192)
    res.steps[3]              # a StepRecord, as engine.trace() records one
    res.ttft, res.e2e, res.itl, res.goodput(SLO(ttft=2.0, itl=0.1))
    benchmarks.simulate.summary(res)     # the table `minivllm simulate` prints

Nothing about scheduling is re-implemented here: every step is `Scheduler.schedule()`, the
runner's made-up ModelRunnerOutput, then `Scheduler.update_from_output`, exactly LLMEngine.step
without the weights (tests/test_scheduler.py drives it the same way). So the simulated schedule
is the engine's by construction, and tests/test_simulator.py checks it equals a real run's,
step for step. A request's output length is its max_tokens (make workloads with ignore_eos, or
draw max_tokens from a length distribution: `synthetic_requests`).

No vLLM twin. Vidur (MLSys 2024) simulates vLLM by re-implementing its scheduler; this one
imports it. Prefill/decode disaggregation is two kinds of SimEngine and a KV link:
disaggregated.py. Left out: speculative decoding, LoRA and n > 1 fan-out costs (they schedule,
but the cost model does not price drafts or adapters), and multi-turn `follows`.
"""

from __future__ import annotations

import itertools
import math
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np
from tqdm import tqdm

from minivllm.benchmarks.workloads import Request, synthetic_requests  # noqa: F401 (API)
from minivllm.config import EngineConfig, ModelConfig
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
        return out, self.timer.time(so.num_new_tokens, contexts, len(out.sampled))
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
    engine_steps: dict[str, list[StepRecord]] = field(default_factory=dict)  # each engine's

    def goodput(self, slo: SLO) -> float:
        """Share of the requests that met the SLO (DistServe's goodput, as a share)."""
        return float(np.mean((self.ttft <= slo.ttft) & (self.mean_itl <= slo.itl)))

    @property
    def num_preemptions(self) -> int:
        return sum(s[-1].stats.num_preemptions for s in self.engine_steps.values() if s)


class SimEngine:
    """One simulated engine: LLMEngine.step without the weights. `step` is
    `Scheduler.schedule()`, the SimulatedRunner's made-up output and its seconds on the clock,
    then `Scheduler.update_from_output`; a StepRecord of each step, as engine.trace() keeps.
    vLLM twin: EngineCore.step (vllm/v1/engine/core.py) with no model executor behind it."""

    def __init__(self, mc, timer: StepTimer, config: EngineConfig, num_blocks: int):
        self.mc, self.timer, self.config = mc, timer, config
        self.bm = BlockManager(num_blocks, config.block_size, config.enable_prefix_caching)
        cpu = None
        if config.preemption_mode == "swap":
            block_bytes = timer.kv_token_bytes * config.block_size
            cpu = BlockManager(max(1, int(config.swap_space // block_bytes)), config.block_size)
        self.sched = Scheduler(config, self.bm, cpu, eos_token_ids={2}, seq_ids=itertools.count())
        self.runner = SimulatedRunner(timer)
        self.clock = 0.0                     # simulated seconds: when its last step ended
        self.steps: list[StepRecord] = []

    def sequence(self, request_id: str, prompt: list[int], params: SamplingParams):
        """The request's Sequence, checked as the engine's processor checks it."""
        validate_request(prompt, params, self.config, self.mc, self.bm)
        group = SequenceGroup(request_id, None, prompt, params, next(self.sched.seq_ids))
        return group.seqs[0]

    def step(self) -> list:
        """One step; returns the sequences that got a token (the clock is then their time)."""
        so = self.sched.schedule()
        if not so.seqs:                           # as LLMEngine.step: cannot happen
            raise RuntimeError(f"the scheduler found nothing to run: {self.stats()}")
        out, seconds = self.runner.execute_model(so)
        updated = self.sched.update_from_output(so, out)
        self.clock += seconds
        self.steps.append(StepRecord(
            step=len(self.steps),
            scheduled=[ScheduledSeq(s.request_id, s.index, k, p) for s, k, p in
                       zip(so.seqs, so.num_new_tokens, so.is_prefill)],
            preempted=[s.request_id for s in so.preempted],
            swapped_out=[s.request_id for s in so.swapped_out],
            swapped_in=[s.request_id for s in so.swapped_in],
            num_blocks_copied=len(so.blocks_to_copy),
            finished=[s.request_id for s in self.sched.take_finished()], duration=seconds,
            stats=self.stats(), start_time=self.clock - seconds))
        return updated

    def stats(self) -> EngineStats:
        """EngineStats without LLMEngine.stats()'s per-block walk (slots held are counted per
        sequence: shared blocks twice), cheap enough to take every simulated step."""
        sched, bm = self.sched, self.bm
        used = bm.num_blocks - bm.num_free_blocks
        cache = bm.prefix_cache
        return EngineStats(
            num_running=len(sched.running), num_waiting=len(sched.waiting),
            num_swapped=len(sched.swapped), num_blocks_used=used,
            num_blocks_total=bm.num_blocks, slots_reserved=used * bm.block_size,
            tokens_cached=sum(s.num_computed_tokens for s in sched.running),
            num_preemptions=sched.num_preemptions,
            prefix_cache_queried_tokens=cache.num_queried_tokens if cache else 0,
            prefix_cache_hit_tokens=cache.num_hit_tokens if cache else 0)


class RequestTimes:
    """Per request, in request order: arrival, first and last token times (simulated s),
    tokens, and every gap between two tokens: what SimResult reports."""

    def __init__(self, n: int):
        self.arrival = [0.0] * n      # lists, not arrays: a simulation touches them per token
        self.first = [math.nan] * n
        self.last = [0.0] * n
        self.tokens = [0] * n
        self.gaps: list[float] = []

    def token(self, i: int, t: float) -> None:
        if self.tokens[i]:
            self.gaps.append(t - self.last[i])
        else:
            self.first[i] = t
        self.tokens[i] += 1
        self.last[i] = t

    def result(self, engines: dict[str, SimEngine], label: str, wall0: float) -> SimResult:
        """A SimResult; with several engines, their steps merged in order of start time."""
        steps = sorted((s for e in engines.values() for s in e.steps),
                       key=lambda s: s.start_time)
        arrival, first, last, tokens = map(np.asarray, (self.arrival, self.first, self.last,
                                                       self.tokens))
        mean_itl = np.where(tokens > 1, (last - first) / np.maximum(tokens - 1, 1), 0.0)
        return SimResult(steps, arrival, first - arrival, last - arrival,
                         mean_itl, np.asarray(self.gaps), int(tokens.sum()),
                         max(e.clock for e in engines.values()), label,
                         sum(e.bm.num_blocks for e in engines.values()),
                         time.perf_counter() - wall0, {n: e.steps for n, e in engines.items()})


def deployment(model, profile, tensor_parallel_size: int, engine_kwargs: dict
               ) -> tuple[ModelConfig, StepTimer, EngineConfig, int, str]:
    """The model's shapes, its StepTimer, the EngineConfig, the KV pool's blocks (what
    gpu_memory_utilization of one device holds beside its share of the weights, unless
    num_kv_blocks is given) and a label naming model, deployment and profile."""
    mc = model_config(model)
    timer = StepTimer(mc, get_profile(profile), tensor_parallel_size)
    engine_kwargs.setdefault("max_model_len", mc.max_position_embeddings)
    config = EngineConfig(**engine_kwargs)
    num_blocks = config.num_kv_blocks or timer.kv_pool_blocks(config.block_size,
                                                              config.gpu_memory_utilization)
    name = model if isinstance(model, str) else f"{mc.architecture} {mc.num_hidden_layers}L"
    label = f"{name} on {tensor_parallel_size} x {timer.profile.label}"
    return mc, timer, config, num_blocks, label


def prompt_of(r: Request, i: int) -> list[int]:
    if r.follows is not None:
        raise ValueError("simulate does not follow multi-turn chats (Request.follows)")
    if isinstance(r.prompt, str):
        raise ValueError(f"request {i}: simulate takes token ids, not text")
    return list(r.prompt)


def simulate(requests: list[Request], model="Llama-3-8B", profile="H100",
             tensor_parallel_size: int = 1, progress: bool = False, tag: str = "req-",
             **engine_kwargs) -> SimResult:
    """Serve `requests` on a simulated deployment; engine_kwargs are EngineConfig fields
    (max_num_seqs, max_num_batched_tokens, block_size, num_kv_blocks, enable_chunked_prefill,
    enable_prefix_caching, preemption_mode, ...). A request joins when its arrival_step and
    arrival_time have come, as in workloads.serve."""
    wall0 = time.perf_counter()
    mc, timer, config, num_blocks, label = deployment(model, profile, tensor_parallel_size,
                                                      engine_kwargs)
    eng = SimEngine(mc, timer, config, num_blocks)
    n = len(requests)
    times = RequestTimes(n)
    pending = deque(sorted(range(n), key=lambda i: (requests[i].arrival_step,
                                                    requests[i].arrival_time)))
    index: dict[str, int] = {}
    bar = tqdm(total=n, unit="req", desc="simulating", mininterval=0.5, disable=not progress)
    while pending or eng.sched.has_unfinished():
        step = len(eng.steps)
        if not eng.sched.has_unfinished():            # idle: jump to the next arrival
            nxt = requests[pending[0]]
            eng.clock = max(eng.clock, nxt.arrival_time)
            step = max(step, nxt.arrival_step)
        while pending and (requests[pending[0]].arrival_step <= step
                           and requests[pending[0]].arrival_time <= eng.clock):
            i = pending.popleft()
            index[f"{tag}{i}"] = i
            eng.sched.add(eng.sequence(f"{tag}{i}", prompt_of(requests[i], i),
                                       requests[i].params))
            times.arrival[i] = requests[i].arrival_time or eng.clock
        for seq in eng.step():                        # schedule, "execute", update
            times.token(index[seq.request_id], eng.clock)
        bar.update(len(eng.steps[-1].finished))
    bar.close()
    return times.result({"engine-0": eng}, label, wall0)
