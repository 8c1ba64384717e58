"""V0Scheduler: V1's Scheduler (core/scheduler.py) with vLLM V0's mechanisms in the steps it
overrides. Each override names what it adds:

    add                  n > 1: the request's first sample ("0_{id}") is queued alone, its
                         other samples fork from it once its prompt is computed; a request
                         with beam_search starts a BeamGroup (beam_group.py)
    _append              a fork, when the first sample's prompt is done: sample i ("{i}_{id}",
                         seeded seed + i) shares every block of it and recomputes only the
                         prompt's last token, drawing its own first token; a beam's row waits
                         for its group's, then the round forks and finishes beams
    _preempt             swap: a preempted request's blocks go to a pool in host memory and it
                         waits in a third queue, `swapped`; a beam group restarts whole
    _schedule_waiting    swapped requests come back first, before any admission; static
                         batching admits only into an empty batch
    _has_seq_slots       a group holds slots for the samples it will fork

A fork is the scheduler's act alone: the child holds the parent's blocks (reference counts up,
nothing copied), the first of them to write into a shared block copies it (copy-on-write,
BlockManager.append_slots), and the runner meets the child as a new request.
"""

from __future__ import annotations

import dataclasses
from collections import deque

from minivllm.core.block_manager import BlockManager, cdiv
from minivllm.core.request import Request, RequestStatus
from minivllm.core.scheduler import Scheduler
from minivllm.core.scheduler_output import SchedulerOutput
from minivllm.core.v0.beam_group import BeamGroup
from minivllm.core.v0.group import SequenceGroup
from minivllm.outputs import Draw, EngineCoreOutput, EngineStats


def fork_blocks(block_manager: BlockManager, parent: Request, child: Request) -> None:
    """child holds every block of parent: reference counts up, nothing copied (V0's
    BlockSpaceManager.fork). Whichever writes into a shared block first copies it."""
    assert not child.block_table, f"{child} already holds blocks"
    child.block_table, child.num_cached_blocks = list(parent.block_table), parent.num_cached_blocks
    for block_id in child.block_table:
        block_manager.ref_counts[block_id] += 1


class V0Scheduler(Scheduler):
    def __init__(self, vllm_config, kv_cache_config, eos_token_ids: set[int] = frozenset(),
                 make_kv_connector=None):
        super().__init__(vllm_config, kv_cache_config, eos_token_ids, make_kv_connector)
        self.cpu_block_manager = None        # swap preemption's pool in host memory
        if self.scheduler_config.preemption_mode == "swap":
            self.cpu_block_manager = BlockManager(kv_cache_config.num_cpu_blocks,
                                                  self.block_manager.block_size)
        self.swapped: deque[Request] = deque()
        self.groups: dict[str, SequenceGroup] = {}    # the caller's request id -> its group
        self.group_of: dict[str, SequenceGroup] = {}  # a sample's (beam's) id -> its group
        self.num_swapped_out_blocks = 0

    def add(self, request: Request) -> None:
        params = request.sampling_params
        if request.beam_search is None and params.n == 1:
            return super().add(request)
        if request.request_id in self.groups:
            raise ValueError(f"request_id {request.request_id!r} is already in use")
        if request.beam_search is not None:
            group = BeamGroup(request, request.beam_search, self.eos_token_ids)
            request.beam_search = None
        else:
            group = SequenceGroup(request, params.n)
            request.request_id = group.child_id(0)
            request.sampling_params = dataclasses.replace(params, n=1)
        super().add(request)
        self.groups[group.request_id] = group
        self.group_of[request.request_id] = group

    def has_unfinished(self) -> bool:
        return super().has_unfinished() or bool(self.swapped)

    def make_stats(self, exact: bool = True) -> EngineStats:
        return dataclasses.replace(super().make_stats(exact), num_swapped=len(self.swapped))

    # ---------------------------------------------------------------- forks
    def fork(self, group: SequenceGroup, parent: Request, request_id: str,
             sampling_params=None) -> Request:
        """A new sample of `group`, as `parent` stands now, holding every block of parent.
        A beam runs right after its group's running beams, a sample last."""
        child = Request(request_id, parent.prompt_token_ids,
                        sampling_params or parent.sampling_params, parent.lora_request,
                        parent.metrics.arrival_time)
        child.token_ids = list(parent.token_ids)
        child.grammar, child.kv_transfer_params = parent.grammar, parent.kv_transfer_params
        child.num_computed_tokens = parent.num_computed_tokens
        child.block_hashes = list(parent.block_hashes)
        child.metrics.first_scheduled_time = parent.metrics.first_scheduled_time
        fork_blocks(self.block_manager, parent, child)
        child.status = RequestStatus.RUNNING
        at = len(self.running)
        if isinstance(group, BeamGroup):
            at = 1 + max(i for i, r in enumerate(self.running) if r in group.seqs)
        self.running.insert(at, child)
        self.requests[request_id] = child
        self.group_of[request_id] = group
        return child

    def _append(self, request: Request, draws: list[Draw]) -> list[EngineCoreOutput]:
        group = self.group_of.get(request.request_id)
        if isinstance(group, BeamGroup):        # a round at a time (beam_group.py)
            return group.advance(self) if group.add_row(request, draws[-1][1]) else []
        if group is not None and request is group.first and group.num_unforked:
            self._fork_samples(group)           # before the first sample may finish
        return super()._append(request, draws)

    def _fork_samples(self, group: SequenceGroup) -> None:
        """Samples 1..n-1 of a request whose prompt the first sample has just computed: each
        recomputes the prompt's last token (its logits row), and draws from it with its own
        generator, seeded as the front end seeds child i (engine/parallel_sampling.py)."""
        first = group.first
        seed = first.sampling_params.seed
        while group.num_unforked:
            index = group.num_made
            group.num_made += 1
            params = dataclasses.replace(first.sampling_params,
                                         seed=None if seed is None else seed + index)
            child = self.fork(group, first, group.child_id(index), params)
            child.num_computed_tokens = child.num_prompt_tokens - 1
            group.seqs.append(child)

    def _run(self, request: Request, out: SchedulerOutput, budget: int) -> int:
        if request.num_uncomputed_tokens == 0:  # a beam whose row waits for its group's
            return budget
        return super()._run(request, out, budget)

    def _has_seq_slots(self, request: Request) -> bool:
        held = sum(g.num_unforked for g in self.groups.values() if g.first in self.running)
        group = self.group_of.get(request.request_id)
        wanted = 1 + (group.num_unforked if group is not None else 0)
        return len(self.running) + held + wanted <= self.scheduler_config.max_num_seqs

    def _can_append(self, request: Request) -> bool:
        """A beam: room for its whole group's next tokens (a group is preempted whole, before
        any of its beams is scheduled, and its beams sit together in running)."""
        group = self.group_of.get(request.request_id)
        if not isinstance(group, BeamGroup):
            return super()._can_append(request)
        bm = self.block_manager
        return sum(map(bm.num_blocks_to_append, group.seqs)) <= bm.num_free_blocks

    # ---------------------------------------------------------------- preemption
    def _preempt(self, request: Request, out: SchedulerOutput) -> None:
        group = self.group_of.get(request.request_id)
        if isinstance(group, BeamGroup):        # the whole group, by recompute
            for beam in group.restart():
                self.finish(beam, RequestStatus.FINISHED_STOPPED)
            request = group.first
            if request in self.running:
                self.running.remove(request)
            return super()._preempt(request, out)
        cpu = self.cpu_block_manager
        if (self.scheduler_config.preemption_mode != "swap"
                or len(request.block_table) > cpu.num_free_blocks):
            return super()._preempt(request, out)  # recompute (or swap space is full)
        request.spec_token_ids.clear()
        pairs = self.swap_out(request)
        out.blocks_to_swap_out += pairs
        out.swapped_out.append(request.request_id)
        self.num_swapped_out_blocks += len(pairs)
        request.status = RequestStatus.SWAPPED
        self.swapped.append(request)
        out.preempted.append(request.request_id)
        self.num_preemptions += 1

    def _schedule_waiting(self, out: SchedulerOutput, budget: int) -> int:
        """Swapped-out requests come back first, oldest first, when their blocks fit; then
        admissions, unless some are still swapped out (or, static, the batch is not empty)."""
        config, bm = self.scheduler_config, self.block_manager
        while self.swapped and budget > 0 and len(self.running) < config.max_num_seqs:
            request = self.swapped[0]
            if (cdiv(len(request), bm.block_size) > bm.num_free_blocks or out.preempted
                    or not self._lora_fits(request)):
                break
            self.swapped.popleft()
            out.blocks_to_swap_in += self.swap_in(request)
            out.swapped_in.append(request.request_id)
            out.blocks_to_copy += bm.append_slots(request)
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            budget = self._run(request, out, budget)
        if self.swapped or (config.scheduling == "static" and self.running):
            return budget
        return super()._schedule_waiting(out, budget)

    def swap_out(self, request: Request) -> list[tuple[int, int]]:
        """Its blocks to the host pool: the (device block, host block) pairs to copy. Its
        table points into the host pool until it is swapped back in."""
        pairs = [(block_id, self.cpu_block_manager._take()) for block_id in request.block_table]
        self.block_manager.free(request)
        request.block_table = [cpu_block for _, cpu_block in pairs]
        return pairs

    def swap_in(self, request: Request) -> list[tuple[int, int]]:
        """Back into the device pool: the (host block, device block) pairs to copy (its
        blocks are named in the prefix cache again as they are computed anew)."""
        pairs = [(cpu_block, self.block_manager._take()) for cpu_block in request.block_table]
        self.cpu_block_manager.free(request)
        request.block_table = [block_id for _, block_id in pairs]
        return pairs

    # ---------------------------------------------------------------- finishing
    def finish_requests(self, request_ids, status: RequestStatus,
                        errors: dict[str, str] | None = None) -> list[EngineCoreOutput]:
        """A group's id stands for its every sample (beam) not finished yet."""
        ids, errors = [], dict(errors or {})
        for request_id in request_ids:
            group = self.groups.get(request_id)
            samples = [s.request_id for s in group.seqs] if group else [request_id]
            ids += samples
            if request_id in errors:
                errors.update(dict.fromkeys(samples, errors[request_id]))
        return super().finish_requests(ids, status, errors)

    def finish(self, request: Request, status: RequestStatus) -> None:
        if request.status is RequestStatus.SWAPPED:   # its table points into the host pool
            self.swapped.remove(request)
            self.cpu_block_manager.free(request)
        super().finish(request, status)
        group = self.group_of.pop(request.request_id, None)
        if group is None:
            return
        if request is group.first:              # finished before its prompt was: no forks
            group.num_made = max(group.num_made, group.width)
        if not any(s.request_id in self.group_of for s in group.seqs):
            del self.groups[group.request_id]
