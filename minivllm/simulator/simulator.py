"""The engine's own Scheduler and BlockManager on a virtual clock: `simulate` serves a workload
the way `workloads.serve` does, with a SimulatedExecutor in place of the model's executor and a
StepTimer (cost_model.py) in place of the forward pass.

    res = simulate(requests, model="Llama-3-70B", profile="H100", tensor_parallel_size=8,
                   max_num_seqs=256, max_num_batched_tokens=8192)
    res.steps[3]              # a StepRecord, as engine.trace() records one
    res.ttft, res.e2e, res.itl, res.goodput(SLO(ttft=2.0, itl=0.1))
    simulator.cli.summary(res)     # the table `minivllm simulate` prints

Nothing about scheduling is re-implemented here, nor the step: the simulated engine is the
engine's own EngineCore (minivllm/engine/core.py) over a SimulatedExecutor, so every step is
EngineCore.step: `Scheduler.schedule()`, the executor's made-up ModelRunnerOutput, then
`Scheduler.update_from_output` (tests/test_scheduler.py drives the core the same way). So the
simulated schedule is the engine's by construction, and tests/test_simulator.py checks it
equals a real run's, step for step. A request's output length is its max_tokens (make
workloads with ignore_eos, or draw max_tokens from a length distribution: `synthetic_requests`).

Pipeline parallelism is the same core keeping one batch in flight per stage
(step_with_batch_queue), over an executor whose stages each have a clock; data parallelism is
several cores behind the front end's own router (minivllm/routing.py: the same policies, the
prefix-aware one fed by the cores' KV events), stepped in time order.
tests/test_simulator_parallel.py checks both against real pp=2 and dp=2 engines. With
kv_offloading_size the core's own CPU tier (kv_offload/) decides the loads and stores, and a
step pays their bytes over the profile's host link (HardwareProfile.host_bandwidth).

No vLLM twin. Vidur (MLSys 2024) simulates vLLM by re-implementing its scheduler; this one
imports it. Prefill/decode disaggregation is prefill and decode cores and a KV link:
disaggregated.py. Left out: speculative decoding, LoRA and n > 1 fan-out costs (they schedule,
but the cost model does not price drafts or adapters), and multi-turn `follows`.
"""

from __future__ import annotations

import math
import time
import zlib
from collections import deque
from contextlib import ExitStack
from dataclasses import dataclass, field

import numpy as np
from tqdm import tqdm

from minivllm.benchmarks.workloads import Request, synthetic_requests  # noqa: F401 (API)
from minivllm.config import HfConfig, VllmConfig
from minivllm.core.kv_cache import KVCacheConfig
from minivllm.core.scheduler import SchedulerOutput
from minivllm.engine.arg_utils import LOAD_TIME_ARGS, EngineArgs
from minivllm.engine.core import EngineCore, EngineCoreRequest
from minivllm.engine.processor import validate_request
from minivllm.engine.stats import StepRecord
from minivllm.kv_offload.connector import OffloadingConnectorMetadata
from minivllm.outputs import ModelRunnerOutput
from minivllm.routing import Router, load_score
from minivllm.sampling_params import SamplingParams
from minivllm.simulator.cost_model import StepTimer, get_profile, model_config


class SimulatedExecutor:
    """execute_model without a model: every sequence that samples this step (the scheduler's
    ScheduledRequest.samples) draws one token (an id of its own, never EOS), and the step moves
    the virtual clock by what the StepTimer says. It has no drafter, so its
    ModelRunnerOutput carries no drafts and a simulation with speculative_config never
    speculates (were drafts scheduled, they would be verified as all rejected).

    Pipeline parallelism: one StepTimer per stage, and max_concurrent_batches = stages, so the
    EngineCore keeps that many batches in flight (step_with_batch_queue, as with the real
    executor). A batch enters stage s when the batch before it has left that stage and its
    hidden states have crossed from stage s - 1 (tokens x hidden bytes over the link, plus its
    latency); the core's clock reaches a batch's end when the core waits for it."""

    def __init__(self, stages: list[StepTimer], kv_cache_config: KVCacheConfig,
                 block_size: int, link_bandwidth: float = 0.0, link_latency: float = 0.0):
        self.stages = stages                    # one StepTimer per pipeline stage
        self.max_concurrent_batches = len(self.stages)
        self.kv_cache_config = kv_cache_config  # the pools the engine core's managers get
        self.block_size = block_size
        self.link_bandwidth, self.link_latency = link_bandwidth, link_latency
        self.clock = 0.0                        # simulated seconds: the core's now
        self.free_at = [0.0] * len(self.stages)     # when each stage finishes its last batch
        self.busy = [0.0] * len(self.stages)        # seconds each stage computed
        self.num_sends = self.send_bytes = 0        # hidden states between stages

    # --8<-- [start:execute_model]
    def execute_model(self, so: SchedulerOutput, non_block: bool = False):
        out = ModelRunnerOutput()
        contexts = []
        for s in so.scheduled:
            contexts.append(s.num_computed_tokens + s.num_tokens)
            if s.samples:
                token = zlib.crc32(s.request_id.encode()) % 1000 + 3   # its own, never EOS
                out.sampled[s.request_id] = [(token, None)]
        done = self.clock
        meta = so.kv_connector_metadata          # the CPU tier's copies, before and after
        moved = len(meta.loads) + len(meta.stores) if isinstance(
            meta, OffloadingConnectorMetadata) else 0
        if so.scheduled:
            done = self._run_stages([s.num_tokens for s in so.scheduled], contexts,
                                    len(out.sampled), moved)
        pending = PendingBatch(self, out, done)
        return pending if non_block else pending.result()
    # --8<-- [end:execute_model]

    def _run_stages(self, new_tokens, contexts, sampled: int, moved: int = 0) -> float:
        """When the batch leaves the last stage, each stage starting when it is free (and
        copying its share of the `moved` blocks to or from the CPU tier, as the worker does:
        in the step, synchronously)."""
        t = self.clock
        for s, timer in enumerate(self.stages):
            if s:                                   # hidden states from the stage before
                message = sum(new_tokens) * timer.cost.hidden_bytes
                self.num_sends += 1
                self.send_bytes += message
                t += (message / self.link_bandwidth if self.link_bandwidth else 0.0)
                t += self.link_latency
            seconds = timer.time(new_tokens, contexts, sampled)
            seconds += timer.copy_time(moved, self.block_size) if moved else 0.0
            t = max(t, self.free_at[s]) + seconds
            self.free_at[s] = t
            self.busy[s] += seconds
        return t


class PendingBatch:
    """A batch in flight (the real executor's PendingStep): result() is its output, and the
    clock moves to when it left the last stage, if that is later."""

    def __init__(self, executor: SimulatedExecutor, out: ModelRunnerOutput, done: float):
        self.executor, self.out, self.done = executor, out, done

    def result(self) -> ModelRunnerOutput:
        self.executor.clock = max(self.executor.clock, self.done)
        return self.out


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
    # each engine's executor: its stages' busy seconds, the hidden states sent between them
    executors: dict[str, SimulatedExecutor] = field(default_factory=dict)
    choices: list = field(default_factory=list)    # the router's, request by request

    def goodput(self, slo: SLO) -> float:
        """Share of the requests that met the SLO (DistServe's goodput, as a share)."""
        return float(np.mean((self.ttft <= slo.ttft) & (self.mean_itl <= slo.itl)))

    @property
    def num_preemptions(self) -> int:
        return sum(s[-1].stats.num_preemptions for s in self.engine_steps.values() if s)


def engine_core(timers: list[StepTimer], config: VllmConfig, num_blocks: int,
                link_bandwidth: float = 0.0) -> EngineCore:
    """One simulated engine: the engine's own EngineCore over a SimulatedExecutor (a StepTimer
    per pipeline stage, hidden states crossing link_bandwidth between them), on the
    executor's virtual clock (vLLM twin: EngineCore with no model behind its executor). Its
    stats count cached tokens per sequence, cheap enough to take every simulated step."""
    timer, cache = timers[0], config.cache_config
    block_bytes = round(timer.kv_token_bytes * cache.block_size)   # one device's, as the worker's
    host_gib = (cache.swap_space if config.scheduler_config.preemption_mode == "swap"
                else cache.kv_offloading_size or 0)    # V0's swap pool, or the CPU tier
    kv_cache_config = KVCacheConfig(num_blocks, int(host_gib * 2**30 // block_bytes), block_bytes)
    executor = SimulatedExecutor(timers, kv_cache_config, cache.block_size, link_bandwidth,
                                 timer.profile.link_latency)
    return EngineCore(config, executor, eos_token_ids={2}, clock=lambda: executor.clock,
                      exact_stats=False)


def core_request(core: EngineCore, request_id: str, prompt: list[int],
                 params: SamplingParams) -> EngineCoreRequest:
    """The request for `core`, checked as the engine's processor checks it."""
    validate_request(prompt, params, core.vllm_config, core.scheduler.block_manager)
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
                         sum(e.scheduler.block_manager.num_blocks for e in engines.values()),
                         time.perf_counter() - wall0, steps,
                         {name: e.model_executor for name, e in engines.items()})


def deployment(model, profile, tensor_parallel_size: int, engine_kwargs: dict,
               pipeline_parallel_size: int = 1
               ) -> tuple[HfConfig, list[StepTimer], VllmConfig, int, str]:
    """The model's shapes, a StepTimer per pipeline stage, the VllmConfig, the KV pool's
    blocks (what gpu_memory_utilization of one device holds beside its share of the weights,
    on the stage with the least room, unless num_kv_blocks is given) and a label naming
    model, deployment and profile."""
    mc = model_config(model)
    pp = pipeline_parallel_size
    timers = [StepTimer(mc, get_profile(profile), tensor_parallel_size, pp, stage)
              for stage in range(pp)]
    EngineArgs.check_names(engine_kwargs, fixed=LOAD_TIME_ARGS)
    config = EngineArgs(**engine_kwargs).create_engine_config(mc)
    cache = config.cache_config
    num_blocks = cache.num_kv_blocks or min(
        t.kv_pool_blocks(cache.block_size, cache.gpu_memory_utilization) for t in timers)
    name = model if isinstance(model, str) else f"{mc.architecture} {mc.num_hidden_layers}L"
    shape = f"TP{tensor_parallel_size} x PP{pp}" if pp > 1 else str(tensor_parallel_size)
    label = f"{name} on {shape} x {timers[0].profile.label}"
    return mc, timers, config, num_blocks, label


def prompt_of(r: Request, i: int) -> list[int]:
    if r.follows is not None:
        raise ValueError("simulate does not follow multi-turn chats (Request.follows)")
    if isinstance(r.prompt, str):
        raise ValueError(f"request {i}: simulate takes token ids, not text")
    return list(r.prompt)


def simulate(requests: list[Request], model="Llama-3-8B", profile="H100",
             tensor_parallel_size: int = 1, pipeline_parallel_size: int = 1,
             data_parallel_size: int = 1, pipeline_link_bandwidth: float | None = None,
             progress: bool = False, tag: str = "req-", **engine_kwargs) -> SimResult:
    """Serve `requests` on a simulated deployment; engine_kwargs are EngineArgs fields
    (max_num_seqs, max_num_batched_tokens, block_size, num_kv_blocks, enable_chunked_prefill,
    enable_prefix_caching, preemption_mode, ...). A request joins when its arrival_step and
    arrival_time have come, as in workloads.serve (arrival_step counts every replica's steps).

    pipeline_parallel_size stages per engine, hidden states crossing pipeline_link_bandwidth
    (default: the profile's link; a slower one between nodes). data_parallel_size replicas,
    each the whole engine, behind the real front end's router (routing.Router, from
    each replica's stats after its last step and the requests sent since with no output yet);
    the replicas step in time order, each on its own clock."""
    wall0 = time.perf_counter()
    mc, timers, config, num_blocks, label = deployment(
        model, profile, tensor_parallel_size, engine_kwargs, pipeline_parallel_size)
    link = pipeline_link_bandwidth or timers[0].profile.link_bandwidth
    cores = {f"engine-{k}": engine_core(timers, config, num_blocks, link)
             for k in range(data_parallel_size)}
    if data_parallel_size > 1:
        label += f", DP{data_parallel_size}"
    times = RequestTimes(len(requests))
    bar = tqdm(total=len(requests), unit="req", desc="simulating", mininterval=0.5,
               disable=not progress)
    with ExitStack() as stack:
        steps = {name: stack.enter_context(c.trace()) for name, c in cores.items()}
        choices = _serve(requests, list(cores.values()), tag, times, bar)
    bar.close()
    result = times.result(cores, steps, label, wall0)
    result.choices = list(choices)
    return result


def _serve(requests: list[Request], cores: list[EngineCore], tag: str, times: RequestTimes,
           bar):
    """The next event, until none is left: a request arriving (to the replica the router
    picks; an idle one starts its clock at the arrival) or the earliest busy replica's step.
    Returns the router's choices."""
    clock = lambda c: c.model_executor.clock  # noqa: E731
    pending = deque(sorted(range(len(requests)), key=lambda i: (requests[i].arrival_step,
                                                                requests[i].arrival_time)))
    snapshot = {id(c): c.stats() for c in cores}       # each replica's, after its last step
    router = Router(len(cores), cores[0].vllm_config)
    unseen: dict[int, set[str]] = {id(c): set() for c in cores}
    owner: dict[str, int] = {}
    num_steps = 0
    while pending or any(c.has_unfinished_requests() for c in cores):
        busy = [c for c in cores if c.has_unfinished_requests()]
        core = min(busy, key=clock) if busy else None
        if pending and (core is None or requests[pending[0]].arrival_step <= num_steps):
            nxt = requests[pending[0]]
            if core is None:                 # all idle: the next arrival comes now
                num_steps = max(num_steps, nxt.arrival_step)
            if core is None or nxt.arrival_time <= clock(core):
                now = nxt.arrival_time if core is None else clock(core)
                while pending and (requests[pending[0]].arrival_step <= num_steps
                                   and requests[pending[0]].arrival_time <= now):
                    i = pending.popleft()
                    rid = f"{tag}{i}"
                    prompt = prompt_of(requests[i], i)
                    target = cores[router.choose(rid, prompt, [
                        load_score(snapshot[id(c)], len(unseen[id(c)])) for c in cores])]
                    target.model_executor.clock = max(clock(target), requests[i].arrival_time)
                    target.add_request(core_request(target, rid, prompt, requests[i].params))
                    times.arrival[i] = requests[i].arrival_time or clock(target)
                    unseen[id(target)].add(rid)
                    owner[rid] = i
                continue
        for out in core.step().outputs:                # schedule, "execute", update
            unseen[id(core)].discard(out.request_id)
            if out.new_token_ids:
                times.token(owner[out.request_id], clock(core))
            bar.update(out.finish_reason is not None)
        router.apply(cores.index(core), core.take_kv_events())
        if core.last_record is not None:             # a batch came back (pipeline: or not)
            num_steps += 1
            snapshot[id(core)] = core.last_record.stats
    return router.choices
