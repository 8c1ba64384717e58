"""Scheduler: every step, decide which sequences run and how many new tokens each computes
(`schedule`), then apply what the model produced (`update_from_output`). vLLM twin:
vllm/v1/core/sched/scheduler.py.

Two queues, as in vLLM: `waiting` (not yet admitted, or preempted) and `running` (holding KV
blocks). Each step has a token budget, max_num_batched_tokens, and a sequence cap,
max_num_seqs. Running sequences go first, oldest first: a decode costs 1 token of budget, a
prompt that is still being prefilled costs the rest of its prompt (or what the budget has left:
chunked prefill). Then waiting sequences are admitted, first come first served, while the
budget, the cap and the free blocks allow. One forward pass can therefore carry decodes and
prefill chunks together.

With speculative decoding a decoding sequence may bring draft tokens (seq.spec_token_ids: the
model runner proposed them after the sequence's last step, and the engine core handed them to
`update_draft_token_ids`): they are verified in the same forward, so each one costs a token of
budget and a lookahead slot. Drafts get only what the budget leaves once every later running
sequence has its one token, and only free blocks: speculation never preempts.

When a running sequence needs a block and none is free, the newest running sequence is
preempted (as in vLLM, so the oldest requests keep making progress), by one of two policies:

    recompute  free its blocks and put it back at the front of `waiting`; its KV is computed
               again from its tokens (prompt + output so far) when there is room
    swap       copy its blocks to a pool in host memory and park it in `swapped`; it comes back
               with a copy the other way, before any new request is admitted

`scheduling="static"` turns continuous batching off: a batch is admitted only when the last
one has finished (lesson 04's baseline). The settings are SchedulerConfig's (config/).

After the forward pass, `update_from_output` is the one place where a step's results change
the sequences: computed tokens advance, the samples of a V0-style n > 1 request are forked
(the front end fans n out instead, as vLLM V1 does), sampled tokens are appended (with
speculation: the accepted drafts and one more, the rejected drafts' slots rolled back), stop
tokens and lengths are checked, and finished sequences give their blocks back. It returns an
EngineCoreOutput per sample that moved (minivllm/outputs.py): plain values, what the front end
needs and nothing it could mutate. Stop *strings* need text, so the front end finds them
(engine/output_processor.py) and finishes the sample through EngineCore, which calls
`finish_requests` here, as vLLM V1 does.

Left out, compared with vLLM: priority scheduling, V1's single token-level schedule (V1 treats
prefill and decode alike as "tokens to compute"; minivllm keeps V0's running / swapped /
waiting, easier to watch), async scheduling that overlaps the next schedule with the current
forward pass, and V1's token-level budget for drafts.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from dataclasses import dataclass, field

from minivllm.config import LoRAConfig, SchedulerConfig
from minivllm.core.scheduler_output import (CachedRequestData, NewRequestData,  # noqa: F401
                                             SchedulerOutput)
from minivllm.core.sequence import Sequence, SequenceGroup, SequenceStatus
from minivllm.outputs import Draw, EngineCoreOutput, ModelRunnerOutput


@dataclass(slots=True)
class SpecDecodingStats:
    """Speculative decoding's counters, kept by update_from_output (vLLM's SpecDecodingStats)."""

    num_drafts: int = 0             # verifications: sequences that proposed, summed over steps
    num_draft_tokens: int = 0       # draft tokens verified
    num_accepted_tokens: int = 0    # ... and accepted
    num_accepted_this_step: int = 0
    # [i]: verifications that accepted draft i (0-based; so i + 1 leading drafts, as vLLM's) and
    # that judged it (proposed, 0..i-1 accepted); alpha_i = accepted[i] / judged[i].
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)
    num_judged_tokens_per_pos: list[int] = field(default_factory=list)


def check_stop(seq: Sequence, eos_token_ids: set[int], max_model_len: int
               ) -> SequenceStatus | None:
    """After appending a token: a stop token ends seq, so do max_tokens and max_model_len
    (stop strings need the text: engine/output_processor.py checks them)."""
    params = seq.group.params
    token = seq.token_ids[-1]
    if token in params.stop_token_ids or (not params.ignore_eos and token in eos_token_ids):
        return SequenceStatus.FINISHED_STOPPED
    num_tokens = len(seq.token_ids)
    if num_tokens - seq.num_prompt_tokens >= params.max_tokens or num_tokens >= max_model_len:
        return SequenceStatus.FINISHED_LENGTH
    return None


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
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.swapped: deque[Sequence] = deque()
        self.requests: dict[str, SequenceGroup] = {}     # request id -> its samples (unfinished)
        self.runner_holds: dict[int, int] = {}   # seq id -> tokens the runner has of it
        self.finished_seqs: list[Sequence] = []          # since the last take_finished()
        self.num_preemptions = 0
        self.num_swapped_out_blocks = 0
        self.spec_decoding_stats = SpecDecodingStats()
        self.kv_connector = kv_connector

    def add(self, seq: Sequence) -> None:
        """Queue a request's first sample (any others fork from it after its prompt)."""
        if seq.request_id in self.requests:
            raise ValueError(f"request_id {seq.request_id!r} is already in use")
        self.requests[seq.request_id] = seq.group
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    def _run(self, seq: Sequence, out: SchedulerOutput, budget: int) -> int:
        """Schedule seq's next tokens (all it has left, or what the budget allows) and its
        drafts (the caller has fitted them to the budget); returns the budget left."""
        num_tokens = min(seq.num_uncomputed_tokens, budget)     # of its own, drafts aside
        n = num_tokens + len(seq.spec_token_ids)
        # Full blocks enter the prefix cache now (vLLM V1): later admissions this step reuse them.
        self.block_manager.cache_computed_blocks(seq, seq.num_computed_tokens + num_tokens)
        out.seqs.append(seq)
        out.num_new_tokens.append(n)
        out.is_prefill.append(seq.is_prefill)
        out.spec_token_ids.append(list(seq.spec_token_ids))
        out.sampling.append(seq.samples_after(n))
        # The runner's messages: the whole sample if it does not hold it, else what changed.
        seq_id = seq.seq_id
        out.seq_ids.append(seq_id)
        out.num_scheduled_tokens[seq_id] = n
        if seq.spec_token_ids:
            out.scheduled_spec_decode_tokens[seq_id] = list(seq.spec_token_ids)
        held = self.runner_holds.get(seq_id)
        if held is not None:
            cached = out.scheduled_cached_reqs
            cached.seq_ids.append(seq_id)
            cached.new_token_ids.append(seq.token_ids[held:])
            cached.block_ids.append(list(seq.block_table))
            cached.num_computed_tokens.append(seq.num_computed_tokens)
        else:
            out.scheduled_new_reqs.append(NewRequestData.from_sequence(seq))
        self.runner_holds[seq_id] = len(seq.token_ids)
        return budget - n

    # --8<-- [start:schedule]
    def schedule(self) -> SchedulerOutput:
        out, config = SchedulerOutput(), self.scheduler_config
        budget = config.max_num_batched_tokens
        bm = self.block_manager

        # 1. Running sequences, oldest first: decodes and unfinished prefills.
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            if seq.spec_token_ids:
                # Drafts: what the budget leaves once each later running sequence has one
                # token, and only if their lookahead slots are free (speculation never preempts).
                del seq.spec_token_ids[max(0, budget - (len(self.running) - i)):]
                if seq.spec_token_ids and not bm.can_append_slots(seq, len(seq.spec_token_ids)):
                    seq.spec_token_ids.clear()
            while not bm.can_append_slots(seq):
                victim = self.running.pop()          # the newest running sequence
                self._preempt(victim, out)
                if victim is seq:
                    break
            else:
                out.blocks_to_copy += bm.append_slots(seq, len(seq.spec_token_ids))
                budget = self._run(seq, out, budget)
                i += 1

        # 2. Swapped-out sequences come back first, oldest first, when their blocks fit.
        while self.swapped and budget > 0 and len(self.running) < config.max_num_seqs:
            seq = self.swapped[0]
            if not bm.can_swap_in(seq) or out.preempted or not self._lora_fits(seq):
                break
            self.swapped.popleft()
            out.blocks_to_swap_in += bm.swap_in(seq, self.cpu_block_manager)
            out.swapped_in.append(seq)
            out.blocks_to_copy += bm.append_slots(seq)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            budget = self._run(seq, out, budget)

        # 3. Waiting sequences, first come first served, while budget, cap and blocks allow
        #    (static batching: only into an empty batch; never while some are swapped out).
        admit = not self.swapped and not (config.scheduling == "static" and self.running)
        while admit and self.waiting and budget > 0:
            seq = self.waiting[0]
            # A request with n samples is admitted with room for all n (forked after prefill).
            if not self._has_seq_slots(seq):
                break
            if not config.enable_chunked_prefill and seq.num_uncomputed_tokens > budget:
                break
            if not bm.can_allocate(seq) or not self._lora_fits(seq):
                break
            self.waiting.popleft()
            bm.allocate(seq)
            seq.status = SequenceStatus.RUNNING
            if seq.metrics.first_scheduled_time is None:
                seq.metrics.first_scheduled_time = time.perf_counter()
            self.running.append(seq)
            budget = self._run(seq, out, budget)
        if self.kv_connector is not None:    # disaggregation: which blocks' K/V move this step
            out.kv_connector_metadata = self.kv_connector.build_connector_meta(out)
        return out
    # --8<-- [end:schedule]

    # --8<-- [start:update_from_output]
    def update_from_output(self, scheduler_output: SchedulerOutput,
                           runner_output: ModelRunnerOutput) -> list[EngineCoreOutput]:
        """Apply one step's results; returns an EngineCoreOutput for every sample that got
        new tokens (forked samples included) or was failed, for the front end."""
        so = scheduler_output
        bm = self.block_manager
        # (Each loop runs once per scheduled sequence per step: the dicts are looked up once.)
        errors, sampled, forked = runner_output.errors, runner_output.sampled, runner_output.forked
        self.spec_decoding_stats.num_accepted_this_step = 0
        for seq, n in zip(so.seqs, so.num_new_tokens):
            seq.num_computed_tokens += n - len(seq.spec_token_ids)   # drafts: once accepted
        outputs = []
        for seq in so.seqs:
            if seq.status.finished or (errors and seq.request_id in errors):
                continue
            draws = sampled.get(seq.seq_id)
            fork_draws = forked.get(seq.seq_id, ())
            children = seq.group.fork(self.seq_ids) if fork_draws else []
            if children:
                self._fork(seq, children)                # n > 1: the other samples start now
            if draws is not None:
                if seq.spec_token_ids:
                    self._count_accepted(seq, len(draws) - 1)
                outputs.append(self._append(seq, draws))
            for child, draw in zip(children, fork_draws):
                outputs.append(self._append(child, [draw]))
        for seq in so.seqs:                              # roll back the rejected drafts' slots
            if seq.spec_token_ids:
                if not seq.is_finished:
                    seq.num_computed_tokens = len(seq) - 1   # the newest token has no K/V yet
                    bm.free_lookahead_slots(seq)
                seq.spec_token_ids = []
        for request_id, error in errors.items():
            self.requests[request_id].error = error
            outputs += self.finish_requests([request_id], SequenceStatus.FINISHED_ABORTED)
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
            group = self.requests.get(request_id)          # None: it finished this step
            if group is not None and group.seqs[index].status == SequenceStatus.RUNNING:
                group.seqs[index].spec_token_ids = list(drafts)

    def _append(self, seq: Sequence, draws: list[Draw]) -> EngineCoreOutput:
        """Append seq's new tokens in order, up to the first that stops it; what it gained."""
        num_before = len(seq)
        for token_id, logprobs in draws:
            seq.append_token(token_id, logprobs)
            status = check_stop(seq, self.eos_token_ids, self.scheduler_config.max_model_len)
            if status is not None:
                self.finish(seq, status)
                break
        return seq.output_since(num_before)

    def _count_accepted(self, seq: Sequence, num_accepted: int) -> None:
        """Speculative decoding's counters, for a sequence that verified drafts this step."""
        stats = self.spec_decoding_stats
        stats.num_drafts += 1
        stats.num_draft_tokens += len(seq.spec_token_ids)
        stats.num_accepted_tokens += num_accepted
        stats.num_accepted_this_step += num_accepted
        accepted = stats.num_accepted_tokens_per_pos
        judged = stats.num_judged_tokens_per_pos
        for per_pos in (accepted, judged):
            per_pos.extend([0] * (len(seq.spec_token_ids) - len(per_pos)))
        for i in range(num_accepted):
            accepted[i] += 1
        for i in range(min(num_accepted + 1, len(seq.spec_token_ids))):
            judged[i] += 1
        seq.metrics.num_draft_tokens += len(seq.spec_token_ids)
        seq.metrics.num_accepted_tokens += num_accepted

    def add_prefilled(self, seq: Sequence, first_token: Draw) -> bool:
        """Admit a sequence whose prompt another engine prefilled (prefill/decode
        disaggregation): the admission checks of `schedule` (a sequence slot, free blocks, an
        adapter slot), blocks for its prompt (prefix-cache hits count as computed), the KV
        connector told which blocks the rest of the prompt's K/V goes into (the worker writes
        it before the next forward), then it runs from its first token on. False, with nothing
        changed, when there is no room for it now; the connector's ValueError, with its blocks
        given back, when it cannot be loaded here."""
        if (not self._has_seq_slots(seq) or not self.block_manager.can_allocate(seq)
                or not self._lora_fits(seq)):
            return False
        self.block_manager.allocate(seq)
        if self.kv_connector is not None:
            try:
                self.kv_connector.update_state_after_alloc(seq)
            except ValueError:
                self.block_manager.free(seq)
                raise
        seq.num_computed_tokens = len(seq)
        self.block_manager.cache_computed_blocks(seq)
        seq.status = SequenceStatus.RUNNING
        seq.metrics.first_scheduled_time = time.perf_counter()
        seq.append_token(*first_token)       # the producer has checked its stop conditions
        self.running.append(seq)
        self.requests[seq.request_id] = seq.group
        return True

    def _has_seq_slots(self, seq: Sequence) -> bool:
        """Room under max_num_seqs for seq and its samples to come, counting the samples that
        running requests will still fork (the GPU's decode buffers hold max_num_seqs rows)."""
        reserved = sum(1 + s.group.num_unforked for s in self.running)
        return reserved + 1 + seq.group.num_unforked <= self.scheduler_config.max_num_seqs

    def _lora_fits(self, seq: Sequence) -> bool:
        """At most max_loras distinct adapters run at once: each needs a slot in the model."""
        if not seq.lora_int_id:              # the base model needs no slot
            return True
        active = {s.lora_int_id for s in self.running} - {0}
        return seq.lora_int_id in active or len(active) < self.lora_config.max_loras

    def _fork(self, parent: Sequence, children: list[Sequence]) -> None:
        """Parallel sampling: `children` join running, sharing every block of `parent`."""
        for child in children:
            self.block_manager.fork(parent, child)
            child.status = SequenceStatus.RUNNING
            self.running.append(child)

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        bm = self.block_manager
        cpu = self.cpu_block_manager
        seq.spec_token_ids.clear()                   # drafts are proposed again when it runs
        if self.scheduler_config.preemption_mode == "swap" and bm.can_swap_out(seq, cpu):
            # Swap: keep the KV, in host memory.
            pairs = bm.swap_out(seq, cpu)
            out.blocks_to_swap_out += pairs
            out.swapped_out.append(seq)
            self.num_swapped_out_blocks += len(pairs)
            seq.status = SequenceStatus.SWAPPED
            self.swapped.append(seq)
        else:
            # Recompute (or swap space is full): drop the KV, keep the tokens, requeue first.
            bm.free(seq)
            seq.num_computed_tokens = 0
            self.runner_holds.pop(seq.seq_id, None)  # it comes back whole, as new
            seq.status = SequenceStatus.WAITING
            self.waiting.appendleft(seq)
        out.preempted.append(seq)
        self.num_preemptions += 1

    def take_finished(self) -> list[Sequence]:
        """The sequences finished since the last call (the runner forgets their state)."""
        finished, self.finished_seqs = self.finished_seqs, []
        return finished

    def finish_requests(self, request_ids, status: SequenceStatus,
                        index: int | None = None) -> list[EngineCoreOutput]:
        """Finish these requests now, every sample not finished yet (only sample `index`, if
        given: a stop string ends one sample), and return their blocks (vLLM V1's name).
        Returns an EngineCoreOutput for each sample it finished."""
        outputs = []
        for request_id in request_ids:
            group = self.requests.get(request_id)
            for seq in list(group.seqs) if group else ():
                if not seq.is_finished and index in (None, seq.index):
                    self.finish(seq, status)
                    outputs.append(seq.output_since(len(seq)))
        return outputs

    def finish(self, seq: Sequence, status: SequenceStatus) -> None:
        """Take a sequence out of the engine for good and return its blocks."""
        seq.metrics.finished_time = time.perf_counter()
        self.finished_seqs.append(seq)
        self.runner_holds.pop(seq.seq_id, None)
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        if seq.status is SequenceStatus.SWAPPED:
            self.swapped.remove(seq)
            self.cpu_block_manager.free(seq)
        else:
            self.block_manager.free(seq)
        seq.status = status
        if all(s.is_finished for s in seq.group.seqs):      # its last sample: it leaves
            self.requests.pop(seq.request_id, None)
