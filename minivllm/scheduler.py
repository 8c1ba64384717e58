"""Scheduler: every step, decide which sequences run and how many new tokens each computes.

Two queues, as in vLLM: `waiting` (not yet admitted, or preempted) and `running` (holding KV
blocks). Each step has a token budget, max_num_batched_tokens, and a sequence cap,
max_num_seqs. Running sequences go first, oldest first: a decode costs 1 token of budget, a
prompt that is still being prefilled costs the rest of its prompt (or what the budget has left:
chunked prefill). Then waiting sequences are admitted, first come first served, while the
budget, the cap and the free blocks allow. One forward pass can therefore carry decodes and
prefill chunks together.

When a running sequence needs a block and none is free, the newest running sequence is
preempted: its blocks are freed and it goes back to the front of `waiting`, to be recomputed
from its tokens when there is room again (vLLM's recompute policy; newest first, so the oldest
requests keep making progress).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from minivllm.config import EngineConfig
from minivllm.sequence import Sequence, SequenceStatus


@dataclass(slots=True)
class SchedulerOutput:
    seqs: list[Sequence] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)
    blocks_to_copy: list[tuple[int, int]] = field(default_factory=list)   # copy-on-write
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_batched_tokens(self) -> int:
        return sum(self.num_new_tokens)


class Scheduler:
    def __init__(self, config: EngineConfig, block_manager):
        self.config = config
        self.block_manager = block_manager
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    # --8<-- [start:schedule]
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        bm = self.block_manager

        # 1. Running sequences, oldest first: decodes and unfinished prefills.
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            while not bm.can_append_slots(seq):
                victim = self.running.pop()          # the newest running sequence
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is seq:
                    break
            else:
                n = min(seq.num_uncomputed_tokens, budget)
                out.blocks_to_copy += bm.append_slots(seq)
                out.seqs.append(seq)
                out.num_new_tokens.append(n)
                budget -= n
                i += 1

        # 2. Waiting sequences, first come first served, while budget, cap and blocks allow.
        while self.waiting and budget > 0:
            seq = self.waiting[0]
            if len(self.running) + 1 + len(seq.pending_forks) > self.config.max_num_seqs:
                break
            if not self.config.enable_chunked_prefill and seq.num_uncomputed_tokens > budget:
                break
            if not bm.can_allocate(seq):
                break
            self.waiting.popleft()
            bm.allocate(seq)
            seq.status = SequenceStatus.RUNNING
            if seq.metrics.first_scheduled_time is None:
                seq.metrics.first_scheduled_time = time.perf_counter()
            self.running.append(seq)
            n = min(seq.num_uncomputed_tokens, budget)
            out.seqs.append(seq)
            out.num_new_tokens.append(n)
            budget -= n
        return out
    # --8<-- [end:schedule]

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """Parallel sampling: `child` joins running, sharing every block of `parent`."""
        parent.pending_forks.remove(child)
        self.block_manager.fork(parent, child)
        child.num_computed_tokens = parent.num_computed_tokens
        child.status = SequenceStatus.RUNNING
        child.metrics.first_scheduled_time = parent.metrics.first_scheduled_time
        self.running.append(child)

    def _preempt(self, seq: Sequence) -> None:
        """Recompute policy: drop the KV, keep the tokens, requeue at the front."""
        self.block_manager.free(seq)
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def finish(self, seq: Sequence, status: SequenceStatus) -> None:
        """Take a sequence out of the engine for good and return its blocks."""
        seq.status = status
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.block_manager.free(seq)

