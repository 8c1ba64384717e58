"""EngineCore: the inner loop, with no tokenizer and no text (vLLM twin: vllm/v1/engine/core.py).

    add_request(request)      queue an EngineCoreRequest (the front end tokenized and checked it)
    abort_requests(ids)       finish requests now; their blocks go back
    step() -> EngineCoreOutputs
        1. schedule   which requests run, how many tokens each, which blocks move
        2. execute    the executor's execute_model: block copies, one forward pass, sampling,
                      and (speculative decoding) the runner's drafts for the next step
        3. update     the scheduler applies the tokens: append, accept drafts, stop on tokens
                      and lengths, free blocks; one EngineCoreOutput per request that moved
        4. drafts     the runner's drafts go to the scheduler (update_draft_token_ids), which
                      fits them into the next step

The core holds no proposer: as in vLLM V1, the model runner drafts after sampling, from its own
state of each sample (minivllm/spec_decode/), and its ModelRunnerOutput carries the drafts.

The core owns the Scheduler (and its block managers) and the executor that runs a step on the
devices (minivllm/executor/: Executor -> Worker -> ModelRunner, on every rank alike). The
front end (LLMEngine, minivllm/engine/llm_engine.py) reaches it through a client
(core_client.py) and never holds a core object: it gets plain EngineCoreOutputs, detokenizes
them, finds stop strings, and finishes a stopped request here with `finish_requests`.

Anything that executes a SchedulerOutput can be the executor: a real one over the weights, or
the simulator's SimulatedExecutor on a virtual clock (minivllm/simulator/simulator.py), which
thereby runs this very step (it proposes no drafts); tests/test_scheduler.py drives it over an
executor with no model.

The scheduler's class is the config's `scheduler_cls` (vLLM's name): V1's Scheduler, or V0's
(core/v0/), which also takes an EngineCoreRequest with n > 1 (its samples fork in the core
after one prefill, sharing blocks by copy-on-write: lesson 02) or with `beam_search` set (its
beams fork in the core, and the finished ones come out together at the end). From LLMEngine,
n > 1 arrives fanned out into n requests of one sample (vLLM V1, engine/parallel_sampling.py).

The core's unit is vLLM V1's Request (core/request.py), made from each EngineCoreRequest; its
request id is the one key of every message. Finished requests' ids reach the workers in the
next step's SchedulerOutput (`finished_req_ids`), as in V1: no message of their own.

Pipeline parallelism: the executor's stages can work on up to `max_concurrent_batches`
batches at once, so `step` becomes `step_with_batch_queue` (vLLM V1's): schedule and start a
batch while there is room in the queue, else wait for the oldest and apply it. A request in a
batch in flight is not scheduled again until that batch is back (Scheduler.in_flight), so the
batches in flight are different requests: micro-batches.

Async scheduling (core/async_scheduler.py) runs on the same queue, two batches deep: the
executor runs a step on a thread of its own while the core schedules the next one.

Left out, compared with vLLM: splitting the running requests into pp micro-batches when they
would all fit in one (V0's virtual engines did; here, as in V1, micro-batches form when the
token budget or arrivals split the work, and a decode-only batch of everything waits alone).
"""

from __future__ import annotations

import functools
import importlib
import logging
import time
from collections import deque
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field

from minivllm.config import VllmConfig
from minivllm.core.scheduler import Scheduler, SchedulerOutput
from minivllm.core.request import Request, RequestStatus
from minivllm.engine.stats import EngineStats, StepRecord
from minivllm.outputs import EngineCoreOutput, EngineCoreOutputs
from minivllm.sampling_params import SamplingParams

logger = logging.getLogger("minivllm")


@dataclass(slots=True)
class EngineCoreInfo:
    """What the front end knows of its core without reaching into it: the KV pool's size (to
    refuse a request that could never fit), the end-of-sequence tokens, and the repr's facts."""

    num_blocks: int
    block_size: int
    kv_layout: str
    attention_backend: str
    eos_token_ids: set[int] = field(default_factory=set)


@dataclass(slots=True)
class EngineCoreRequest:
    """A request as the front end hands it to the core: token ids, no text (vLLM twin:
    vllm/v1/engine/__init__.py)."""

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams         # n > 1 only for V0's fork (core/v0/)
    lora_request: object | None = None      # minivllm.LoRARequest, or None: the base model
    grammar: object | None = None           # the compiled guided-decoding constraint, if any
    arrival_time: float = field(default_factory=time.perf_counter)
    kv_transfer_params: dict | None = None  # disaggregation (kv_transfer/kv_connector.py)
    beam_search: object | None = None       # BeamSearchParams: beams forked in the core (V0)


def make_kv_connector(vllm_config: VllmConfig, kv_cache_config, block_manager):
    """The KV connector's scheduler side, if the config asks for one (vLLM's
    KVConnectorFactory): disaggregation's, or the CPU tier's (kv_offload/)."""
    if vllm_config.kv_transfer_config is not None:
        from minivllm.distributed.kv_transfer.kv_connector import KVConnectorScheduler
        return KVConnectorScheduler(vllm_config.kv_transfer_config.kv_role,
                                    block_manager.num_cached_tokens)
    if vllm_config.cache_config.kv_offloading_size is not None:
        from minivllm.kv_offload.connector import OffloadingConnectorScheduler
        return OffloadingConnectorScheduler(kv_cache_config, block_manager)
    return None


class EngineCore:
    def __init__(self, vllm_config: VllmConfig, model_executor, eos_token_ids: set[int],
                 clock: Callable[[], float] = time.perf_counter, exact_stats: bool = True):
        """model_executor: executes a SchedulerOutput and says how big its KV pools are
        (kv_cache_config). clock: the time steps are
        recorded in (the simulator's is virtual).
        exact_stats: count the tokens the KV pool holds block by block (shared blocks once);
        False counts them per sequence, cheap enough for a simulation's every step."""
        self.model_executor = model_executor
        self.eos_token_ids = set(eos_token_ids)
        self.clock = clock
        self.exact_stats = exact_stats
        self._traces: list[list[StepRecord]] = []
        self.schedule_callbacks: list[Callable[[], None]] = []
        self.structured_output = None        # guided decoding's manager (from_model sets it)
        self.init_state(vllm_config)

    @classmethod
    def from_model(cls, vllm_config: VllmConfig, tokenizer) -> EngineCore:
        """The core of a real engine: the executor's workers load the weights (tensor
        parallelism: a worker per rank), the sampler knows the end-of-sequence tokens and
        guided decoding's matchers (the tokenizer is read for those alone)."""
        from minivllm.executor import executor_class
        from minivllm.sample.sampler import Sampler
        from minivllm.structured_output.manager import StructuredOutputManager
        model_config = vllm_config.model_config
        eos_token_ids = set(model_config.hf_config.eos_token_id)
        if tokenizer.eos_token_id is not None:
            eos_token_ids.add(tokenizer.eos_token_id)
        sampler = Sampler(model_config.device, eos_token_ids)
        executor = executor_class(vllm_config.parallel_config)(vllm_config, sampler=sampler)
        core = cls(vllm_config, executor, eos_token_ids)
        core.structured_output = StructuredOutputManager(   # the grammars' matchers
            tokenizer, model_config.hf_config.vocab_size, eos_token_ids)
        return core

    def init_state(self, vllm_config: VllmConfig) -> None:
        """A fresh scheduler for `vllm_config`, over the executor's pools (sized for it
        already, drafter included: LLMEngine.reconfigure rebuilds them first)."""
        self.vllm_config = vllm_config
        module, name = vllm_config.scheduler_config.scheduler_cls.rsplit(".", 1)
        kv_cache_config = self.model_executor.kv_cache_config
        self.scheduler: Scheduler = getattr(importlib.import_module(module), name)(
            vllm_config, kv_cache_config, self.eos_token_ids,
            functools.partial(make_kv_connector, vllm_config, kv_cache_config))
        self.num_steps = 0
        self.last_scheduler_output: SchedulerOutput | None = None
        depth = getattr(self.model_executor, "max_concurrent_batches", 1)
        # (pending output, SchedulerOutput, start time) of each batch in flight (pp > 1)
        self.batch_queue = deque(maxlen=depth) if depth > 1 else None

    @property
    def requests(self) -> dict[str, Request]:
        """The unfinished requests, by id (the scheduler's table, as in vLLM V1)."""
        return self.scheduler.requests

    # ---------------------------------------------------------------- requests in and out
    def add_request(self, request: EngineCoreRequest) -> None:
        self.scheduler.add(Request.from_engine_core_request(request))

    def add_prefilled_request(self, request: EngineCoreRequest, first_token
                              ) -> EngineCoreOutputs | None:
        """A request another engine prefilled (minivllm/distributed/kv_transfer/): admitted with
        the scheduler's normal checks, the KV connector's worker side writes its prompt's K/V
        before the next forward, and it runs from its first token on, which is returned. None,
        with nothing changed, when there is no room for it now."""
        if request.request_id in self.requests:
            raise ValueError(f"request_id {request.request_id!r} is already in use")
        core_request = Request.from_engine_core_request(request)
        if not self.scheduler.add_prefilled(core_request, first_token):
            return None
        return EngineCoreOutputs([core_request.output_since(core_request.num_prompt_tokens)],
                                 timestamp=core_request.metrics.first_token_time)

    def abort_requests(self, request_ids, errors: dict[str, str] | None = None
                       ) -> list[EngineCoreOutput]:
        """Finish these requests now with finish_reason "abort" (and the error, if one is
        given for it); their blocks and sampling state go."""
        return self.finish_requests(request_ids, RequestStatus.FINISHED_ABORTED, errors)

    def finish_requests(self, request_ids, status: RequestStatus,
                        errors: dict[str, str] | None = None) -> list[EngineCoreOutput]:
        """Finish requests with `status`: the front end's stop strings and aborts. Called
        right after a step, they count in that step's record."""
        outputs = self.scheduler.finish_requests(list(request_ids), status, errors)
        if self._traces and self.last_record is not None:
            done = [o.request_id for o in outputs if o.request_id not in self.requests]
            self.last_record.finished += [r for r in dict.fromkeys(done)
                                          if r not in self.last_record.finished]
            self.last_record.errors.update(errors or {})
            self.last_record.stats = self.stats()
        return outputs

    def has_unfinished_requests(self) -> bool:
        """Requests, or a batch in flight (async scheduling: one may follow a stop)."""
        return self.scheduler.has_unfinished() or bool(self.batch_queue)

    # ---------------------------------------------------------------- one iteration
    # --8<-- [start:step]
    def step(self) -> EngineCoreOutputs:
        self.last_record = None
        if self.batch_queue is not None:
            return self.step_with_batch_queue()
        t0 = self.clock()
        # 1. Schedule: which requests run, how many tokens each, which blocks move.
        scheduler_output = self._schedule()
        # 2. Execute: block copies, one forward pass, the sampled tokens (and drafts).
        runner_output = self.model_executor.execute_model(scheduler_output)
        if not scheduler_output.scheduled:
            return self._nothing_to_run()
        # 3. and 4.: update the requests from the output, fit the drafts.
        return self._update(scheduler_output, runner_output, t0)

    def _update(self, scheduler_output: SchedulerOutput, runner_output, t0: float
                ) -> EngineCoreOutputs:
        t_update = self.clock()
        # 3. Update: append, accept drafts, stop on tokens and length, free blocks.
        runner_output.errors.update(scheduler_output.grammar_errors)
        outputs = self.scheduler.update_from_output(scheduler_output, runner_output)
        # 4. The drafts the runner proposed, for the next schedule to fit (vLLM V1's order).
        self.scheduler.update_draft_token_ids(runner_output.draft_token_ids)
        self.num_steps += 1
        if self._traces:
            phases = {"schedule": scheduler_output.schedule_time, **runner_output.timings,
                      "update": self.clock() - t_update}
            self._record(scheduler_output, outputs, runner_output.errors, t0, phases)
        return EngineCoreOutputs(outputs, timestamp=self.clock())
    # --8<-- [end:step]

    def step_with_batch_queue(self) -> EngineCoreOutputs:
        """Pipeline parallelism (vLLM V1's twin of the same name): while fewer batches than
        the executor's stages are in flight and the scheduler finds work, start a batch and
        return no outputs; else wait for the oldest batch and apply it."""
        queue = self.batch_queue
        if len(queue) < queue.maxlen:
            t0 = self.clock()
            scheduler_output = self._schedule()
            if scheduler_output.scheduled:
                pending = self.model_executor.execute_model(scheduler_output, non_block=True)
                queue.append((pending, scheduler_output, t0))
                return EngineCoreOutputs(timestamp=self.clock())
            if queue:                        # the finished ids ride with the next batch
                self.scheduler.finished_req_ids |= scheduler_output.finished_req_ids
            else:                            # idle: the workers forget the finished now
                self.model_executor.execute_model(scheduler_output)
        if not queue:
            return self._nothing_to_run()
        pending, scheduler_output, t0 = queue.popleft()
        outputs = self._update(scheduler_output, pending.result(), t0)
        while queue and not self.scheduler.has_unfinished():   # async: a step after the last
            pending, scheduler_output, t0 = queue.popleft()     # stop, for nothing: drained
            self._update(scheduler_output, pending.result(), t0)
        return outputs

    def _schedule(self) -> SchedulerOutput:
        t0 = self.clock()
        scheduler_output = self.scheduler.schedule()
        if self.structured_output is not None:      # the guided rows' allowed tokens
            self.structured_output.grammar_bitmask(scheduler_output, self.requests)
        scheduler_output.schedule_time = self.clock() - t0
        self.last_scheduler_output = scheduler_output
        for callback in self.schedule_callbacks:    # a long prefill shows as running meanwhile
            callback()
        return scheduler_output

    def _nothing_to_run(self) -> EngineCoreOutputs:
        if self.scheduler.has_unfinished():          # admission checks make this unreachable
            raise RuntimeError(f"the scheduler found nothing to run: {self.stats()}")
        return EngineCoreOutputs(timestamp=self.clock())

    # ---------------------------------------------------------------- what it reports
    def stats(self) -> EngineStats:
        return self.scheduler.make_stats(self.exact_stats)

    def reset_prefix_cache(self) -> bool:
        return self.scheduler.reset_prefix_cache()

    def take_kv_events(self) -> list:
        """The prefix cache's events since the last call (core/kv_events.py; [] when off)."""
        cache = getattr(self.scheduler.block_manager, "prefix_cache", None)
        return cache.take_events() if cache is not None else []

    def info(self) -> EngineCoreInfo:
        """What the front end knows of the core without reaching into it."""
        bm, runner = self.scheduler.block_manager, self.model_executor.driver_worker.model_runner
        return EngineCoreInfo(bm.num_blocks, bm.block_size, runner.kv_layout,
                              runner.attention_backend, set(self.eos_token_ids))

    def add_lora(self, lora_request) -> None:
        """Load the adapter now (it fails alone, before its request is queued)."""
        self.model_executor.collective_rpc("add_lora", lora_request)

    def list_loras(self) -> set[int]:
        return self.model_executor.collective_rpc("list_loras")

    @contextmanager
    def trace(self):
        """Record every step taken inside the block: `with core.trace() as steps: ...` fills
        `steps` with one StepRecord per step."""
        steps: list[StepRecord] = []
        self._traces.append(steps)
        try:
            yield steps
        finally:
            self._traces.remove(steps)

    last_record: StepRecord | None = None

    def _record(self, batch: SchedulerOutput, outputs: list[EngineCoreOutput],
                errors: dict[str, str], t0: float, phases: dict[str, float]) -> None:
        finished = [o.request_id for o in outputs
                    if o.finish_reason is not None and o.request_id not in self.requests]
        record = StepRecord(
            step=self.num_steps - 1, scheduled=batch.scheduled, preempted=batch.preempted,
            swapped_out=batch.swapped_out, swapped_in=batch.swapped_in,
            num_blocks_copied=len(batch.blocks_to_copy),
            finished=list(dict.fromkeys(finished)), duration=self.clock() - t0,
            stats=self.stats(), start_time=t0, errors=dict(errors),
            num_accepted_tokens=self.scheduler.spec_decoding_stats.num_accepted_this_step,
            phases=phases)
        self.last_record = record
        for steps in self._traces:
            steps.append(record)

    # ---------------------------------------------------------------- scoring
    def prompt_logits(self, token_ids: list[int]):
        """Next-token logits at every position of `token_ids`, (len, vocab), float32."""
        request = Request("score", token_ids, SamplingParams())
        bm = self.scheduler.block_manager
        if not bm.can_allocate(request):
            raise RuntimeError(f"no free KV blocks to score {len(token_ids)} tokens right now")
        bm.allocate(request, use_prefix_cache=False)          # every position computed
        try:
            return self.model_executor.prompt_logits(token_ids, request.block_table)
        finally:
            bm.free(request)
