"""Scheduler: every step, decide which requests run and how many new tokens each computes
(`schedule`), then apply what the model produced (`update_from_output`). vLLM twin:
vllm/v1/core/sched/scheduler.py.

Two queues of Requests (core/request.py), as in vLLM: `waiting` (not yet admitted, or
preempted) and `running` (holding KV blocks). Each step has a token budget,
max_num_batched_tokens, and a cap, max_num_seqs. Running requests go first, oldest first: a
decode costs 1 token of budget, a prompt still being prefilled the rest of its prompt (or what
the budget has left: chunked prefill). Then waiting requests are admitted, first come first
served, while the budget, the cap and the free blocks allow. One forward pass can therefore
carry decodes and prefill chunks together. Under pipeline parallelism several batches are in
flight at once (engine/core.py): a request in one is not scheduled again until it is back.

With speculative decoding a decoding request may bring draft tokens (its spec_token_ids, from
the model runner via `update_draft_token_ids`): they are verified in the same forward, each
costing a token of budget and a lookahead slot. Drafts get only what the budget leaves once
every later running request has its one token, and only free blocks: speculation never preempts.

When a running request needs a block and none is free, the newest running request is
preempted (as in vLLM, so the oldest requests keep making progress): its blocks are freed and
it goes back to the front of `waiting`; its KV is computed again from its tokens (prompt +
output so far) when there is room.

`update_from_output` is the one place where a step's results change the requests: computed
tokens advance, sampled tokens are appended (with speculation: the accepted drafts and one
more, the rejected drafts' slots rolled back), stop tokens and lengths are checked, and
finished requests give their blocks back; their ids ride to the runner in the next
SchedulerOutput (`finished_req_ids`). It returns an EngineCoreOutput per request that moved
(minivllm/outputs.py): plain values. Stop *strings* need text, so the front end finds them and
finishes the request through `finish_requests`, as vLLM V1 does.

vLLM V0's mechanisms (parallel sampling forked in the core, beam search on forks, swap
preemption, the static baseline) live beside this class, in core/v0/: a subclass that
overrides the named steps of this one (`_schedule_waiting`, `_preempt`, `_append`, ...).

V1's async scheduling is a subclass too (core/async_scheduler.py): it schedules a request
whose batch is in flight (`_waits_for_batch`) and counts its tokens at schedule time
(`_update_after_step` then has nothing to add).

Left out, compared with vLLM: priority scheduling, V1's single token-level schedule (V1 treats
prefill and decode alike as "tokens to compute"), and V1's token-level budget for drafts.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable

from minivllm.config import VllmConfig
from minivllm.core.block_manager import BlockManager
from minivllm.core.kv_cache import ContiguousAllocator, KVCacheConfig
from minivllm.core.scheduler_output import (CachedRequestData, NewRequestData,  # noqa: F401
                                             ScheduledRequest, SchedulerOutput)
from minivllm.core.request import Request, RequestStatus, check_stop
from minivllm.core.spec_decode_stats import SpecDecodingStats
from minivllm.outputs import Draw, EngineCoreOutput, EngineStats, ModelRunnerOutput


class Scheduler:
    def __init__(self, vllm_config: VllmConfig, kv_cache_config: KVCacheConfig,
                 eos_token_ids: set[int] = frozenset(),
                 make_kv_connector: Callable[[object], object] | None = None):
        """kv_cache_config: the KV pools the executor allocated. eos_token_ids: the model's
        end-of-sequence tokens (stop unless ignore_eos). make_kv_connector(block_manager):
        the KV connector's scheduler side, if any (engine/core.py picks it: disaggregation's
        or the CPU tier's; core/ imports neither)."""
        self.scheduler_config = vllm_config.scheduler_config
        self.lora_config = vllm_config.lora_config      # max_loras: adapters one step mixes
        cache_config = vllm_config.cache_config
        if cache_config.kv_layout == "paged":
            events = vllm_config.kv_events_config                 # for a router (kv_events.py)
            self.block_manager = BlockManager(
                kv_cache_config.num_blocks, cache_config.block_size,
                cache_config.enable_prefix_caching, bool(events and events.enable_kv_cache_events))
        else:                                # one slab per request (lesson 01's baseline)
            self.block_manager = ContiguousAllocator(kv_cache_config.num_blocks,
                                                     vllm_config.model_config.max_model_len)
        self.kv_connector = make_kv_connector(self.block_manager) if make_kv_connector else None
        self.eos_token_ids = set(eos_token_ids)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}   # request id -> the request (unfinished)
        self.runner_holds: dict[str, int] = {}   # request id -> tokens the runner has of it
        self.in_flight: Counter[str] = Counter()   # request id -> its batches not back yet
        self.finished_req_ids: set[str] = set()  # since the last schedule: the runner forgets
        self.num_preemptions = 0
        self.spec_decoding_stats = SpecDecodingStats()

    def add(self, request: Request) -> None:
        if request.sampling_params.n > 1 or request.beam_search is not None:
            raise ValueError(f"{request.request_id!r}: V1 fans n > 1 out at the front end; "
                             "samples or beams fork in the core only with scheduler_cls="
                             "V0_SCHEDULER (minivllm/config/scheduler.py)")
        if request.request_id in self.requests:
            raise ValueError(f"request_id {request.request_id!r} is already in use")
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def _run(self, request: Request, out: SchedulerOutput, budget: int) -> int:
        """Schedule its next tokens (all, or what the budget allows) and its drafts (fitted
        to the budget by the caller); returns the budget left."""
        num_tokens = min(request.num_uncomputed_tokens, budget)     # of its own, drafts aside
        n = num_tokens + len(request.spec_token_ids)
        # Full blocks enter the prefix cache now (vLLM V1): later admissions this step reuse
        # them (their tokens known: an async placeholder's block is named when it is seen).
        self.block_manager.cache_computed_blocks(
            request, min(request.num_computed_tokens + num_tokens, len(request)))
        record = ScheduledRequest(request.request_id, n, request.is_prefill,
                                  len(request.spec_token_ids), request.lora_int_id,
                                  request.num_computed_tokens, request.samples_after(n))
        out.scheduled.append(record)
        # The runner's messages: the whole request if it does not hold it, else what changed.
        req_id = request.request_id
        out.sampling.append(record.samples)
        out.req_ids.append(req_id)
        out.num_scheduled_tokens[req_id] = n
        if request.spec_token_ids:
            out.scheduled_spec_decode_tokens[req_id] = list(request.spec_token_ids)
        held = self.runner_holds.get(req_id)
        if held is not None:
            cached = out.scheduled_cached_reqs
            cached.req_ids.append(req_id)
            cached.new_token_ids.append(request.token_ids[held:])
            cached.block_ids.append(list(request.block_table))
            cached.num_computed_tokens.append(request.num_computed_tokens)
        else:
            out.scheduled_new_reqs.append(NewRequestData.from_request(request))
        self.runner_holds[req_id] = len(request.token_ids)
        self.in_flight[req_id] += 1
        return budget - n

    # --8<-- [start:schedule]
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput(finished_req_ids=self.finished_req_ids)
        self.finished_req_ids = set()
        budget = self.scheduler_config.max_num_batched_tokens
        budget = self._schedule_running(out, budget)
        self._schedule_waiting(out, budget)
        if self.kv_connector is not None:    # disaggregation: which blocks' K/V move this step
            out.kv_connector_metadata = self.kv_connector.build_connector_meta(out, self.requests)
        return out

    def _schedule_running(self, out: SchedulerOutput, budget: int) -> int:
        """1. Running requests, oldest first: decodes and unfinished prefills. One that needs
        a block when none is free preempts the newest (itself, if it is the newest)."""
        bm = self.block_manager
        i = 0
        while i < len(self.running) and budget > 0:
            request = self.running[i]
            if self._waits_for_batch(request):
                i += 1
                continue
            if request.spec_token_ids:
                # Drafts: what the budget leaves once each later running request has one
                # token, and only if their lookahead slots are free (speculation never preempts).
                del request.spec_token_ids[max(0, budget - (len(self.running) - i)):]
                drafts = request.spec_token_ids
                if drafts and not bm.can_append_slots(request, len(drafts)):
                    drafts.clear()
            fits = self._can_append(request)
            while not fits and request.status is RequestStatus.RUNNING:
                victim = self._pop_victim()
                if victim is None:              # async: the others' batches are in flight
                    break
                self._preempt(victim, out)
                fits = self._can_append(request)
            if request.status is not RequestStatus.RUNNING:    # it was the newest
                continue
            if fits:                            # (else it waits for a batch to come back)
                out.blocks_to_copy += bm.append_slots(
                    request, len(request.spec_token_ids) + request.num_output_placeholders)
                budget = self._run(request, out, budget)
            i += 1
        return budget

    def _schedule_waiting(self, out: SchedulerOutput, budget: int) -> int:
        """2. Waiting requests, first come first served, while budget, cap and blocks allow."""
        bm = self.block_manager
        while self.waiting and budget > 0:
            request = self.waiting[0]
            if not self._has_seq_slots(request):
                break
            if (not self.scheduler_config.enable_chunked_prefill
                    and request.num_uncomputed_tokens > budget):
                break
            if not bm.can_allocate(request) or not self._lora_fits(request):
                break
            self.waiting.popleft()
            bm.allocate(request)                 # its prefix-cache hits count as computed
            if self.kv_connector is not None:    # and what another tier holds (KV offloading)
                self.kv_connector.update_state_after_alloc(request)
            request.status = RequestStatus.RUNNING
            if request.metrics.first_scheduled_time is None:
                request.metrics.first_scheduled_time = time.perf_counter()
                request.num_cached_tokens = request.num_computed_tokens   # vLLM's count
            self.running.append(request)
            budget = self._run(request, out, budget)
        return budget
    # --8<-- [end:schedule]

    # --8<-- [start:update_from_output]
    def update_from_output(self, scheduler_output: SchedulerOutput,
                           runner_output: ModelRunnerOutput) -> list[EngineCoreOutput]:
        """Apply one step's results; returns an EngineCoreOutput for every request that got
        new tokens or was failed, for the front end."""
        so = scheduler_output
        errors, sampled = runner_output.errors, runner_output.sampled
        self.in_flight -= Counter(so.req_ids)
        self.spec_decoding_stats.num_accepted_this_step = 0
        requests = [self.requests.get(s.request_id) for s in so.scheduled]  # None: finished since
        for request, record in zip(requests, so.scheduled):
            if request is not None:
                self._update_after_step(request, record)
        outputs = []
        for request in requests:
            if request is None or request.is_finished:
                continue
            draws = sampled.get(request.request_id)
            if draws is None or request.request_id in errors:
                continue
            if request.spec_token_ids:               # drafts: how many were accepted
                num_drafts, num_accepted = len(request.spec_token_ids), len(draws) - 1
                self.spec_decoding_stats.observe_draft(num_drafts, num_accepted)
                request.metrics.num_draft_tokens += num_drafts
                request.metrics.num_accepted_tokens += num_accepted
            outputs += self._append(request, draws)
        for request in requests:               # roll back the rejected drafts' slots
            if request is not None and request.spec_token_ids:
                if not request.is_finished:
                    request.num_computed_tokens = len(request) - 1  # the newest has no K/V yet
                    self.block_manager.free_lookahead_slots(request)
                request.spec_token_ids = []
        for request_id, error in errors.items():
            outputs += self.finish_requests([request_id], RequestStatus.FINISHED_ABORTED,
                                            {request_id: error})
        return outputs
    # --8<-- [end:update_from_output]

    def _update_after_step(self, request: Request, record: ScheduledRequest) -> None:
        """Its computed tokens advance by the step's (its drafts count once accepted)."""
        request.num_computed_tokens += record.num_tokens - record.num_draft_tokens

    def update_draft_token_ids(self, draft_token_ids: dict[str, list[int]]) -> None:
        """The drafts the runner proposed for the next step, by request id (vLLM V1's name);
        `schedule` fits them to the budget and the free slots. Only a running request takes
        any; one not named keeps its own: none if it ran (update_from_output dropped its
        verified drafts), those proposed when it last ran if the budget left it out."""
        for request_id, drafts in draft_token_ids.items():
            request = self.requests.get(request_id)        # None: it finished this step
            if request is not None and request.status == RequestStatus.RUNNING:
                request.spec_token_ids = list(drafts)

    def _append(self, request: Request, draws: list[Draw]) -> list[EngineCoreOutput]:
        """Append request's new tokens in order, up to the first that stops it; what it gained."""
        num_before = len(request)
        for token_id, logprobs in draws:
            request.append_token(token_id, logprobs)
            status = check_stop(request, self.eos_token_ids, self.scheduler_config.max_model_len)
            if status is not None:
                self.finish(request, status)
                break
        return [request.output_since(num_before)]

    def add_prefilled(self, request: Request, first_token: Draw) -> bool:
        """Admit a request whose prompt another engine prefilled (prefill/decode
        disaggregation): the admission checks of `schedule` (a request slot, free blocks, an
        adapter slot), blocks for its prompt (prefix-cache hits count as computed), the KV
        connector told which blocks the rest of the prompt's K/V goes into (the worker writes
        it before the next forward), then it runs from its first token on. False, with nothing
        changed, when there is no room for it now; the connector's ValueError, with its blocks
        given back, when it cannot be loaded here."""
        if (not self._has_seq_slots(request) or not self.block_manager.can_allocate(request)
                or not self._lora_fits(request)):
            return False
        self.block_manager.allocate(request)
        if self.kv_connector is not None:
            try:
                self.kv_connector.update_state_after_alloc(request)
            except ValueError:
                self.block_manager.free(request)
                raise
        request.num_computed_tokens = len(request)
        self.block_manager.cache_computed_blocks(request)
        request.status = RequestStatus.RUNNING
        request.metrics.first_scheduled_time = time.perf_counter()
        request.append_token(*first_token)       # the producer has checked its stop conditions
        self.running.append(request)
        self.requests[request.request_id] = request
        return True

    def _has_seq_slots(self, request: Request) -> bool:
        """Room under max_num_seqs for it (the GPU's decode buffers hold max_num_seqs rows)."""
        return len(self.running) < self.scheduler_config.max_num_seqs

    def _lora_fits(self, request: Request) -> bool:
        """At most max_loras distinct adapters run at once: each needs a slot in the model."""
        if not request.lora_int_id:              # the base model needs no slot
            return True
        active = {s.lora_int_id for s in self.running} - {0}
        return request.lora_int_id in active or len(active) < self.lora_config.max_loras

    def _waits_for_batch(self, request: Request) -> bool:
        """Pipeline parallelism: a request in a batch in flight waits for it to come back."""
        return request.request_id in self.in_flight

    def _can_append(self, request: Request) -> bool:
        """Room for its next tokens."""
        return self.block_manager.can_append_slots(request, request.num_output_placeholders)

    def _pop_victim(self) -> Request | None:
        """The newest running request with no batch in flight (one in flight has its blocks
        being written, or scheduled this step); None if there is none."""
        back = [i for i, r in enumerate(self.running) if r.request_id not in self.in_flight]
        return self.running.pop(back[-1]) if back else None

    def _preempt(self, request: Request, out: SchedulerOutput) -> None:
        """Recompute: drop its KV, keep its tokens, requeue it first."""
        request.spec_token_ids.clear()                   # drafts are proposed again when it runs
        self.block_manager.free(request)
        request.num_computed_tokens = 0
        self.runner_holds.pop(request.request_id, None)  # it comes back whole, as new
        request.status = RequestStatus.WAITING
        self.waiting.appendleft(request)
        out.preempted.append(request.request_id)
        self.num_preemptions += 1

    def make_stats(self, exact: bool = True) -> EngineStats:
        """A snapshot of the queues and the KV pool (vLLM's make_stats). exact: count the
        tokens the pool holds block by block (shared blocks once); False counts them per
        request, cheap enough for a simulation's every step."""
        bm = self.block_manager
        used = bm.num_blocks - bm.num_free_blocks
        cache = getattr(bm, "prefix_cache", None)
        if exact:
            filled: dict[int, int] = {}        # block -> tokens it holds (shared blocks once)
            for s in self.running:
                for i, block in enumerate(s.block_table):
                    held = max(0, min(bm.block_size, s.num_computed_tokens - i * bm.block_size))
                    filled[block] = max(filled.get(block, 0), held)
            tokens_cached = sum(filled.values())
        else:
            tokens_cached = sum(s.num_computed_tokens for s in self.running)
        spec = self.spec_decoding_stats
        return EngineStats(
            num_running=len(self.running), num_waiting=len(self.waiting), num_swapped=0,
            num_blocks_used=used, num_blocks_total=bm.num_blocks,
            slots_reserved=used * bm.block_size, tokens_cached=tokens_cached,
            num_preemptions=self.num_preemptions,
            prefix_cache_queried_tokens=cache.num_queried_tokens if cache else 0,
            prefix_cache_hit_tokens=cache.num_hit_tokens if cache else 0,
            spec_decode_num_drafts=spec.num_drafts,
            spec_decode_num_draft_tokens=spec.num_draft_tokens,
            spec_decode_num_accepted_tokens=spec.num_accepted_tokens,
            spec_decode_num_accepted_tokens_per_pos=tuple(spec.num_accepted_tokens_per_pos),
            spec_decode_num_judged_tokens_per_pos=tuple(spec.num_judged_tokens_per_pos),
            **(self.kv_connector.stats() if hasattr(self.kv_connector, "stats") else {}))

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix (BlockManager.reset_prefix_cache): False while requests
        hold blocks; the KV connector's tier too, if it has one."""
        reset = self.block_manager.reset_prefix_cache()
        if reset and hasattr(self.kv_connector, "reset"):
            self.kv_connector.reset()
        return reset

    def finish_requests(self, request_ids, status: RequestStatus,
                        errors: dict[str, str] | None = None) -> list[EngineCoreOutput]:
        """Finish these requests now (those not finished yet), with the error given for one,
        and return their blocks (vLLM V1's name). An EngineCoreOutput for each it finished."""
        outputs = []
        for request_id in request_ids:
            request = self.requests.get(request_id)
            if request is None:                  # finished already, or never known
                continue
            request.error = (errors or {}).get(request_id, request.error)
            self.finish(request, status)
            outputs.append(request.output_since(len(request)))
        return outputs

    def finish(self, request: Request, status: RequestStatus) -> None:
        """Take a request out of the engine for good and return its blocks; the runner
        forgets it at the next step (finished_req_ids)."""
        request.metrics.finished_time = time.perf_counter()
        self.finished_req_ids.add(request.request_id)
        self.runner_holds.pop(request.request_id, None)
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        self.block_manager.free(request)
        request.status = status
        self.requests.pop(request.request_id, None)
