"""The engine's own Scheduler and BlockManager on a virtual clock: `simulate` serves a workload
the way `workloads.serve` does, with a SimulatedExecutor in place of the model's executor and a
StepTimer (cost_model.py) in place of the forward pass.

    res = simulate(requests, model="Llama-3-70B", profile="H100", tensor_parallel_size=8,
                   max_num_seqs=256, max_num_batched_tokens=8192)
    res.steps[3]              # a StepRecord, as engine.trace() records one
    res.ttft, res.e2e, res.itl, res.goodput(SLO(ttft=2.0, itl=0.1))
    benchmarks.simulate.summary(res)     # the table `minivllm simulate` prints

Nothing about scheduling is re-implemented here, nor the step: the simulated engine is the
engine's own EngineCore (minivllm/engine/core.py) over a SimulatedExecutor, so every step is
EngineCore.step: `Scheduler.schedule()`, the executor's made-up ModelRunnerOutput, then
`Scheduler.update_from_output` (tests/test_scheduler.py drives the core the same way). So the
simulated schedule is the engine's by construction, and tests/test_simulator.py checks it
equals a real run's, step for step. A request's output length is its max_tokens (make workloads with ignore_eos, or
draw max_tokens from a length distribution: `synthetic_requests`).

No vLLM twin. Vidur (MLSys 2024) simulates vLLM by re-implementing its scheduler; this one
imports it. Prefill/decode disaggregation is prefill and decode cores and a KV link:
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
from minivllm.config import HfConfig, VllmConfig
from minivllm.core.scheduler import SchedulerOutput
from minivllm.engine.arg_utils import LOAD_TIME_ARGS, EngineArgs
from minivllm.engine.core import EngineCore, EngineCoreRequest
from minivllm.engine.processor import validate_request
from minivllm.engine.stats import StepRecord
from minivllm.outputs import ModelRunnerOutput
from minivllm.sampling_params import SamplingParams
from minivllm.simulator.cost_model import StepTimer, get_profile, model_config


class SimulatedExecutor:
    """execute_model without a model: every sequence that samples this step (the scheduler's
    SchedulerOutput.sampling) draws one token (an id of its own, never EOS), and the step moves
    the virtual clock by what the StepTimer says. With n > 1, a finished prompt also draws the
    other samples' first tokens, as the real runner does. It has no drafter, so its
    ModelRunnerOutput carries no drafts and a simulation with speculative_config never
    speculates (were drafts scheduled, they would be verified as all rejected)."""

    def __init__(self, timer: StepTimer, num_blocks: int, num_cpu_blocks: int = 0):
        self.timer = timer
        self.num_blocks = num_blocks            # the pools the engine core's managers get
        self.num_cpu_blocks = num_cpu_blocks
        self.clock = 0.0                        # simulated seconds: when the last step ended

    # --8<-- [start:execute_model]
    def execute_model(self, so: SchedulerOutput) -> ModelRunnerOutput:
        out = ModelRunnerOutput()
        contexts = []
        for seq, n, samples in zip(so.scheduled_requests, so.num_new_tokens, so.sampling):
            contexts.append(seq.num_computed_tokens + n)
            if samples:
                token = seq.seq_id % 1000 + 3                    # any id but EOS (0..2)
                out.sampled[seq.seq_id] = [(token, None)]
                if seq.num_unforked:
                    out.forked[seq.seq_id] = [(token, None)] * seq.num_unforked
        if so.scheduled_requests:
            self.clock += self.timer.time(so.num_new_tokens, contexts, len(out.sampled))
        return out
    # --8<-- [end:execute_model]

    def free(self, seqs) -> None:
        """Finished samples: a simulated executor keeps no state of them."""


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


def engine_core(timer: StepTimer, config: VllmConfig, num_blocks: int) -> EngineCore:
    """One simulated engine: the engine's own EngineCore over a SimulatedExecutor, on the
    executor's virtual clock (vLLM twin: EngineCore with no model behind its executor). Its
    stats count cached tokens per sequence, cheap enough to take every simulated step."""
    num_cpu_blocks = 0
    if config.scheduler_config.preemption_mode == "swap":
        block_bytes = timer.kv_token_bytes * config.cache_config.block_size
        num_cpu_blocks = max(1, int(config.cache_config.swap_space // block_bytes))
    executor = SimulatedExecutor(timer, num_blocks, num_cpu_blocks)
    return EngineCore(config, executor, eos_token_ids={2}, clock=lambda: executor.clock,
                      exact_stats=False)


def core_request(core: EngineCore, request_id: str, prompt: list[int],
                 params: SamplingParams) -> EngineCoreRequest:
    """The request for `core`, checked as the engine's processor checks it."""
    validate_request(prompt, params, core.vllm_config, core.block_manager)
    return EngineCoreRequest(request_id, prompt, params)


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

    def result(self, engines: dict[str, EngineCore], steps: dict[str, list[StepRecord]],
               label: str, wall0: float) -> SimResult:
        """A SimResult; with several engines, their steps merged in order of start time."""
        merged = sorted((s for e in steps.values() for s in e), key=lambda s: s.start_time)
        arrival, first, last, tokens = map(np.asarray, (self.arrival, self.first, self.last,
                                                       self.tokens))
        mean_itl = np.where(tokens > 1, (last - first) / np.maximum(tokens - 1, 1), 0.0)
        return SimResult(merged, arrival, first - arrival, last - arrival,
                         mean_itl, np.asarray(self.gaps), int(tokens.sum()),
                         max(e.model_executor.clock for e in engines.values()), label,
                         sum(e.block_manager.num_blocks for e in engines.values()),
                         time.perf_counter() - wall0, steps)


def deployment(model, profile, tensor_parallel_size: int, engine_kwargs: dict
               ) -> tuple[HfConfig, StepTimer, VllmConfig, int, str]:
    """The model's shapes, its StepTimer, the VllmConfig, the KV pool's blocks (what
    gpu_memory_utilization of one device holds beside its share of the weights, unless
    num_kv_blocks is given) and a label naming model, deployment and profile."""
    mc = model_config(model)
    timer = StepTimer(mc, get_profile(profile), tensor_parallel_size)
    EngineArgs.check_names(engine_kwargs, fixed=LOAD_TIME_ARGS)
    config = EngineArgs(**engine_kwargs).create_engine_config(mc)
    cache = config.cache_config
    num_blocks = cache.num_kv_blocks or timer.kv_pool_blocks(cache.block_size,
                                                             cache.gpu_memory_utilization)
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
    """Serve `requests` on a simulated deployment; engine_kwargs are EngineArgs fields
    (max_num_seqs, max_num_batched_tokens, block_size, num_kv_blocks, enable_chunked_prefill,
    enable_prefix_caching, preemption_mode, ...). A request joins when its arrival_step and
    arrival_time have come, as in workloads.serve."""
    wall0 = time.perf_counter()
    mc, timer, config, num_blocks, label = deployment(model, profile, tensor_parallel_size,
                                                      engine_kwargs)
    core = engine_core(timer, config, num_blocks)
    executor = core.model_executor
    n = len(requests)
    times = RequestTimes(n)
    pending = deque(sorted(range(n), key=lambda i: (requests[i].arrival_step,
                                                    requests[i].arrival_time)))
    index: dict[str, int] = {}
    bar = tqdm(total=n, unit="req", desc="simulating", mininterval=0.5, disable=not progress)
    with core.trace() as steps:
        while pending or core.has_unfinished_requests():
            step = len(steps)
            if not core.has_unfinished_requests():        # idle: jump to the next arrival
                nxt = requests[pending[0]]
                executor.clock = max(executor.clock, nxt.arrival_time)
                step = max(step, nxt.arrival_step)
            while pending and (requests[pending[0]].arrival_step <= step
                               and requests[pending[0]].arrival_time <= executor.clock):
                i = pending.popleft()
                index[f"{tag}{i}"] = i
                core.add_request(core_request(core, f"{tag}{i}", prompt_of(requests[i], i),
                                              requests[i].params))
                times.arrival[i] = requests[i].arrival_time or executor.clock
            for out in core.step().outputs:                # schedule, "execute", update
                if out.new_token_ids:
                    times.token(index[out.request_id], executor.clock)
            bar.update(len(steps[-1].finished))
    bar.close()
    return times.result({"engine-0": core}, {"engine-0": steps}, label, wall0)
