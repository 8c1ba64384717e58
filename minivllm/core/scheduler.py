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
preempted (as in vLLM, so the oldest requests keep making progress), by one of two policies:

    recompute  free its blocks and put it back at the front of `waiting`; its KV is computed
               again from its tokens (prompt + output so far) when there is room
    swap       copy its blocks to a pool in host memory and park it in `swapped`; it comes back
               with a copy the other way, before any new request is admitted

`scheduling="static"` turns continuous batching off: a batch is admitted only when the last
one has finished (lesson 04's baseline). The settings are SchedulerConfig's (config/).

`update_from_output` is the one place where a step's results change the requests: computed
tokens advance, a V0-style n > 1 request's samples fork, a beam group's round picks and forks
its beams (core/beam_group.py), sampled tokens are appended (with speculation: the accepted
drafts and one more, the rejected drafts' slots rolled back), stop tokens and lengths are
checked, and finished requests give their blocks back. It returns an EngineCoreOutput per
sample that moved (minivllm/outputs.py): plain values. Stop *strings* need text, so the front
end finds them and finishes the sample through `finish_requests`, as vLLM V1 does.

Left out, compared with vLLM: priority scheduling, V1's single token-level schedule (V1 treats
prefill and decode alike as "tokens to compute"; minivllm keeps V0's running / swapped /
waiting, easier to watch), async scheduling, and V1's token-level budget for drafts.
"""

from __future__ import annotations

import itertools
import time
from collections import deque

from minivllm.config import LoRAConfig, SchedulerConfig
from minivllm.core.scheduler_output import (CachedRequestData, NewRequestData,  # noqa: F401
                                             SchedulerOutput)
from minivllm.core.request import Request, RequestStatus, check_stop
from minivllm.core.spec_decode_stats import SpecDecodingStats
from minivllm.outputs import Draw, EngineCoreOutput, ModelRunnerOutput


class Scheduler:
    def __init__(self, scheduler_config: SchedulerConfig, block_manager, cpu_block_manager=None,
                 eos_token_ids: set[int] = frozenset(), seq_ids=None, kv_connector=None,
                 lora_config: LoRAConfig | None = None):
        """eos_token_ids: the model's end-of-sequence tokens (stop unless ignore_eos).
        seq_ids: the engine's id counter, so that forked samples get ids unique in it.
        kv_connector: the KV connector's scheduler side (disaggregation), or None.
        lora_config: its max_loras is how many adapters one step may mix (None: no LoRA)."""
        self.scheduler_config = scheduler_config
        self.lora_config = lora_config
        self.block_manager = block_manager
        self.cpu_block_manager = cpu_block_manager       # the swap pool, if swapping is on
        self.eos_token_ids = set(eos_token_ids)
        self.seq_ids = seq_ids if seq_ids is not None else itertools.count()
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.swapped: deque[Request] = deque()
        self.requests: dict[str, Request] = {}   # request id -> the request (unfinished)
        self.runner_holds: dict[int, int] = {}   # seq_id -> tokens the runner has of it
        self.in_flight: set[int] = set()   # seq_ids scheduled, their batch not back yet (PP)
        self.finished_requests: list[Request] = []          # since the last take_finished()
        self.num_preemptions = 0
        self.num_swapped_out_blocks = 0
        self.spec_decoding_stats = SpecDecodingStats()
        self.kv_connector = kv_connector

    def add(self, request: Request) -> None:
        """Queue a request's first sample (any others fork from it after its prompt)."""
        if request.request_id in self.requests:
            raise ValueError(f"request_id {request.request_id!r} is already in use")
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    def _run(self, request: Request, out: SchedulerOutput, budget: int) -> int:
        """Schedule its next tokens (all, or what the budget allows) and its drafts (fitted
        to the budget by the caller); returns the budget left."""
        num_tokens = min(request.num_uncomputed_tokens, budget)     # of its own, drafts aside
        if num_tokens == 0 and not request.spec_token_ids:    # a beam waiting for the others
            return budget
        n = num_tokens + len(request.spec_token_ids)
        # Full blocks enter the prefix cache now (vLLM V1): later admissions this step reuse them.
        self.block_manager.cache_computed_blocks(request, request.num_computed_tokens + num_tokens)
        out.scheduled_requests.append(request)
        out.num_new_tokens.append(n)
        out.is_prefill.append(request.is_prefill)
        out.spec_token_ids.append(list(request.spec_token_ids))
        out.sampling.append(request.samples_after(n))
        # The runner's messages: the whole sample if it does not hold it, else what changed.
        seq_id = request.seq_id
        out.seq_ids.append(seq_id)
        out.num_scheduled_tokens[seq_id] = n
        if request.spec_token_ids:
            out.scheduled_spec_decode_tokens[seq_id] = list(request.spec_token_ids)
        held = self.runner_holds.get(seq_id)
        if held is not None:
            cached = out.scheduled_cached_reqs
            cached.seq_ids.append(seq_id)
            cached.new_token_ids.append(request.token_ids[held:])
            cached.block_ids.append(list(request.block_table))
            cached.num_computed_tokens.append(request.num_computed_tokens)
        else:
            out.scheduled_new_reqs.append(NewRequestData.from_request(request))
        self.runner_holds[seq_id] = len(request.token_ids)
        return budget - n

    # --8<-- [start:schedule]
    def schedule(self) -> SchedulerOutput:
        out, config = SchedulerOutput(), self.scheduler_config
        budget = config.max_num_batched_tokens
        bm = self.block_manager

        # 1. Running requests, oldest first: decodes and unfinished prefills.
        i = 0
        while i < len(self.running) and budget > 0:
            request = self.running[i]
            if request.seq_id in self.in_flight:     # pipeline: its last batch is not back
                i += 1
                continue
            if request.spec_token_ids:
                # Drafts: what the budget leaves once each later running request has one
                # token, and only if their lookahead slots are free (speculation never preempts).
                del request.spec_token_ids[max(0, budget - (len(self.running) - i)):]
                drafts = request.spec_token_ids
                if drafts and not bm.can_append_slots(request, len(drafts)):
                    drafts.clear()
            while not self._can_append(request):
                victim = self._pop_victim()          # the newest running request
                self._preempt(victim, out)
                if victim is request or (victim.beam is not None
                                         and victim.beam is request.beam):
                    break
            else:
                out.blocks_to_copy += bm.append_slots(request, len(request.spec_token_ids))
                budget = self._run(request, out, budget)
                i += 1

        # 2. Swapped-out requests come back first, oldest first, when their blocks fit.
        while self.swapped and budget > 0 and len(self.running) < config.max_num_seqs:
            request = self.swapped[0]
            if not bm.can_swap_in(request) or out.preempted or not self._lora_fits(request):
                break
            self.swapped.popleft()
            out.blocks_to_swap_in += bm.swap_in(request, self.cpu_block_manager)
            out.swapped_in.append(request)
            out.blocks_to_copy += bm.append_slots(request)
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            budget = self._run(request, out, budget)

        # 3. Waiting requests, first come first served, while budget, cap and blocks allow
        #    (static batching: only into an empty batch; never while some are swapped out).
        admit = not self.swapped and not (config.scheduling == "static" and self.running)
        while admit and self.waiting and budget > 0:
            request = self.waiting[0]
            # A request with n samples is admitted with room for all n (forked after prefill).
            if not self._has_seq_slots(request):
                break
            if not config.enable_chunked_prefill and request.num_uncomputed_tokens > budget:
                break
            if not bm.can_allocate(request) or not self._lora_fits(request):
                break
            self.waiting.popleft()
            bm.allocate(request)
            request.status = RequestStatus.RUNNING
            if request.metrics.first_scheduled_time is None:
                request.metrics.first_scheduled_time = time.perf_counter()
            self.running.append(request)
            budget = self._run(request, out, budget)
        if self.kv_connector is not None:    # disaggregation: which blocks' K/V move this step
            out.kv_connector_metadata = self.kv_connector.build_connector_meta(out)
        self.in_flight.update(out.seq_ids)
        return out
    # --8<-- [end:schedule]

    # --8<-- [start:update_from_output]
    def update_from_output(self, scheduler_output: SchedulerOutput,
                           runner_output: ModelRunnerOutput) -> list[EngineCoreOutput]:
        """Apply one step's results; returns an EngineCoreOutput for every sample that got
        new tokens (forked samples included) or was failed, for the front end."""
        so = scheduler_output
        errors, sampled, forked = runner_output.errors, runner_output.sampled, runner_output.forked
        self.in_flight.difference_update(so.seq_ids)
        self.spec_decoding_stats.num_accepted_this_step = 0
        for request, n in zip(so.scheduled_requests, so.num_new_tokens):
            request.num_computed_tokens += n - len(request.spec_token_ids)  # drafts: if accepted
        outputs = []
        for request in so.scheduled_requests:
            if request.status.finished or (errors and request.request_id in errors):
                continue
            draws = sampled.get(request.seq_id)
            if request.beam is not None:         # beam search in the core: a round at a time
                if draws and request.beam.add_row(request, draws[-1][1]):
                    outputs += request.beam.advance(self, self.seq_ids)
                continue
            fork_draws = forked.get(request.seq_id, ())
            children = request.fork(self.seq_ids) if fork_draws else []
            if children:
                self.fork(request, children)             # n > 1: the other samples start now
            if draws is not None:
                if request.spec_token_ids:               # drafts: how many were accepted
                    num_drafts, num_accepted = len(request.spec_token_ids), len(draws) - 1
                    self.spec_decoding_stats.observe_draft(num_drafts, num_accepted)
                    request.metrics.num_draft_tokens += num_drafts
                    request.metrics.num_accepted_tokens += num_accepted
                outputs.append(self._append(request, draws))
            for child, draw in zip(children, fork_draws):
                outputs.append(self._append(child, [draw]))
        for request in so.scheduled_requests:  # roll back the rejected drafts' slots
            if request.spec_token_ids:
                if not request.is_finished:
                    request.num_computed_tokens = len(request) - 1  # the newest has no K/V yet
                    self.block_manager.free_lookahead_slots(request)
                request.spec_token_ids = []
        for request_id, error in errors.items():
            for sample in self.requests[request_id].samples:
                sample.error = error
            outputs += self.finish_requests([request_id], RequestStatus.FINISHED_ABORTED)
        return outputs
    # --8<-- [end:update_from_output]

    def update_draft_token_ids(self, draft_token_ids: dict[tuple[str, int], list[int]]
                               ) -> None:
        """The drafts the runner proposed for the next step, by (request id, sample index)
        (vLLM V1's name); `schedule` fits them to the budget and the free slots. Only a running
        sample takes any; one not named keeps its own: none if it ran (update_from_output
        dropped its verified drafts), those proposed when it last ran if the budget left it
        out."""
        for (request_id, index), drafts in draft_token_ids.items():
            request = self.requests.get(request_id)        # None: it finished this step
            if request is not None and request.samples[index].status == RequestStatus.RUNNING:
                request.samples[index].spec_token_ids = list(drafts)

    def _append(self, request: Request, draws: list[Draw]) -> EngineCoreOutput:
        """Append request's new tokens in order, up to the first that stops it; what it gained."""
        num_before = len(request)
        for token_id, logprobs in draws:
            request.append_token(token_id, logprobs)
            status = check_stop(request, self.eos_token_ids, self.scheduler_config.max_model_len)
            if status is not None:
                self.finish(request, status)
                break
        return request.output_since(num_before)

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
        """Room under max_num_seqs for it and the samples running requests will still fork
        (V0's n > 1; the GPU's decode buffers hold max_num_seqs rows)."""
        reserved = sum(s.num_seq_slots for s in self.running)
        return reserved + request.num_seq_slots <= self.scheduler_config.max_num_seqs

    def _lora_fits(self, request: Request) -> bool:
        """At most max_loras distinct adapters run at once: each needs a slot in the model."""
        if not request.lora_int_id:              # the base model needs no slot
            return True
        active = {s.lora_int_id for s in self.running} - {0}
        return request.lora_int_id in active or len(active) < self.lora_config.max_loras

    def _can_append(self, request: Request) -> bool:
        """Room for its next tokens; for a beam, for its whole group's (a group is preempted
        whole, before any of its beams is scheduled, and its beams sit together in running)."""
        if request.beam is None:
            return self.block_manager.can_append_slots(request)
        needed = sum(map(self.block_manager.num_blocks_to_append, request.beam.beams))
        return needed <= self.block_manager.num_free_blocks

    def fork(self, parent: Request, children: list[Request]) -> None:
        """Parallel sampling and beam search: `children` join running, sharing every block of
        `parent` (a beam's right after its group's others)."""
        at = len(self.running)
        if parent.beam is not None:
            at = 1 + max(i for i, r in enumerate(self.running) if r.beam is parent.beam)
        for child in children:
            self.block_manager.fork(parent, child)
            child.status = RequestStatus.RUNNING
            self.running.insert(at, child)
            at += 1

    def _pop_victim(self) -> Request:
        """The newest running request whose batch is back (pipeline parallelism: one in flight
        has its blocks being written); the one being scheduled always is."""
        return self.running.pop(max(i for i, r in enumerate(self.running)
                                    if r.seq_id not in self.in_flight))

    def _preempt(self, request: Request, out: SchedulerOutput) -> None:
        bm = self.block_manager
        cpu = self.cpu_block_manager
        request.spec_token_ids.clear()                   # drafts are proposed again when it runs
        if request.beam is not None:   # the whole group, by recompute (core/beam_group.py)
            for beam in request.beam.restart():
                self.finish(beam, RequestStatus.FINISHED_STOPPED)
            request = request.beam.first
            if request in self.running:
                self.running.remove(request)
        swap = self.scheduler_config.preemption_mode == "swap" and request.beam is None
        if swap and bm.can_swap_out(request, cpu):
            # Swap: keep the KV, in host memory.
            pairs = bm.swap_out(request, cpu)
            out.blocks_to_swap_out += pairs
            out.swapped_out.append(request)
            self.num_swapped_out_blocks += len(pairs)
            request.status = RequestStatus.SWAPPED
            self.swapped.append(request)
        else:
            # Recompute (or swap space is full): drop the KV, keep the tokens, requeue first.
            bm.free(request)
            request.num_computed_tokens = 0
            self.runner_holds.pop(request.seq_id, None)  # it comes back whole, as new
            request.status = RequestStatus.WAITING
            self.waiting.appendleft(request)
        out.preempted.append(request)
        self.num_preemptions += 1

    def take_finished(self) -> list[Request]:
        """The requests finished since the last call (the runner forgets their state)."""
        finished, self.finished_requests = self.finished_requests, []
        return finished

    def finish_requests(self, request_ids, status: RequestStatus,
                        index: int | None = None) -> list[EngineCoreOutput]:
        """Finish these requests now, every sample not finished yet (only sample `index`, if
        given: a stop string ends one sample), and return their blocks (vLLM V1's name).
        Returns an EngineCoreOutput for each sample it finished."""
        outputs = []
        for request_id in request_ids:
            first = self.requests.get(request_id)
            for sample in list(first.samples) if first else ():
                if not sample.is_finished and index in (None, sample.index):
                    self.finish(sample, status)
                    outputs.append(sample.output_since(len(sample)))
        return outputs

    def finish(self, request: Request, status: RequestStatus) -> None:
        """Take a request out of the engine for good and return its blocks."""
        request.metrics.finished_time = time.perf_counter()
        self.finished_requests.append(request)
        self.runner_holds.pop(request.seq_id, None)
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        if request.status is RequestStatus.SWAPPED:
            self.swapped.remove(request)
            self.cpu_block_manager.free(request)
        else:
            self.block_manager.free(request)
        request.status = status
        if request.all_samples_finished:                        # its last sample: it leaves
            self.requests.pop(request.request_id, None)
