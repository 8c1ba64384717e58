"""What the scheduler may put in one step, and how it admits and preempts (vLLM twin:
vllm/config/scheduler.py).

scheduler_cls names the scheduler's class, as vLLM's does: V1's Scheduler (core/scheduler.py) by
default, or V0_SCHEDULER (core/v0/), which also forks n > 1 samples and beams in the core,
swaps preempted requests to host memory, and batches statically; asking for swap or static
batching picks it. async_scheduling picks V1's AsyncScheduler (core/async_scheduler.py)."""

from __future__ import annotations

from dataclasses import dataclass

from minivllm.config.utils import check_bools, check_choice, check_positive_ints

PREEMPTION_MODES = ("recompute", "swap")
SCHEDULING = ("continuous", "static")
V1_SCHEDULER = "minivllm.core.scheduler.Scheduler"
V0_SCHEDULER = "minivllm.core.v0.scheduler.V0Scheduler"
ASYNC_SCHEDULER = "minivllm.core.async_scheduler.AsyncScheduler"


@dataclass(slots=True)
class SchedulerConfig:
    max_num_seqs: int = 64                # sequences in one batch, at most
    max_num_batched_tokens: int = 2048    # tokens in one forward pass, at most (the token budget)
    max_model_len: int = 2048             # the model config's, repeated here as vLLM does
    enable_chunked_prefill: bool = True   # split long prompts to fit the token budget
    preemption_mode: str = "recompute"    # or "swap": park a preempted sequence's KV on host
    scheduling: str = "continuous"        # or "static": a new batch only when one finishes
    scheduler_cls: str = V1_SCHEDULER     # or V0_SCHEDULER (the module's doc)
    async_scheduling: bool = False        # schedule step N + 1 while step N runs

    def __post_init__(self):
        check_positive_ints(self, "max_num_seqs", "max_num_batched_tokens", "max_model_len")
        check_bools(self, "enable_chunked_prefill", "async_scheduling")
        check_choice(self, "preemption_mode", PREEMPTION_MODES)
        check_choice(self, "scheduling", SCHEDULING)
        check_choice(self, "scheduler_cls", (V1_SCHEDULER, V0_SCHEDULER, ASYNC_SCHEDULER))
        if self.preemption_mode == "swap" or self.scheduling == "static":
            self.scheduler_cls = V0_SCHEDULER          # V0's mechanisms (core/v0/)
        if self.async_scheduling or self.scheduler_cls == ASYNC_SCHEDULER:
            if self.scheduler_cls == V0_SCHEDULER:
                raise ValueError("async_scheduling is V1's: not with preemption_mode='swap', "
                                 "scheduling='static' or V0's scheduler_cls")
            self.scheduler_cls, self.async_scheduling = ASYNC_SCHEDULER, True
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(
                f"without chunked prefill a whole prompt must fit one step: "
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= "
                f"max_model_len ({self.max_model_len})")
