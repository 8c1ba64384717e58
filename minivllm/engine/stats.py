"""What the engine reports about itself: a snapshot between steps (EngineStats, which the
scheduler makes: minivllm/outputs.py, where it crosses to the front end) and the record of one
step (StepRecord), plain values only, so lessons, benchmarks and tests can keep
thousands of them and plot them without holding on to engine objects (vLLM twin:
vllm/v1/metrics/stats.py, SchedulerStats and IterationStats).

    with engine.trace() as steps:       # one StepRecord per step while the block runs
        ...
    engine.last_scheduler_output        # what the scheduler decided last, traced or not

Left out, compared with vLLM: Prometheus export (the server adds it), LoRA counters,
per-iteration histograms.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from minivllm.core.scheduler_output import ScheduledRequest
from minivllm.outputs import EngineStats


@dataclass(slots=True)
class StepRecord:
    """One engine step: what the scheduler decided, how long it took, and the engine after."""

    step: int                                   # 0, 1, 2, ... since the engine was configured
    scheduled: list[ScheduledRequest]            # the scheduler's records, as it wrote them
    preempted: list[str]                        # request ids, recomputed or swapped out
    swapped_out: list[str]
    swapped_in: list[str]
    num_blocks_copied: int                      # copy-on-write copies this step
    finished: list[str]                         # requests that finished this step
    duration: float                             # seconds, schedule to outputs (async
                                                # scheduling: the step before it runs between)
    stats: EngineStats
    start_time: float = 0.0                     # time.perf_counter() when the step began
    errors: dict[str, str] = field(default_factory=dict)   # request id -> why it failed
    num_accepted_tokens: int = 0                # draft tokens the target accepted this step
    # Seconds in each phase: the core's schedule and update, the runner's prepare, forward
    # (until the device is done with it) and sample (worker/phase_timer.py).
    phases: dict[str, float] = field(default_factory=dict)

    @property
    def host_time(self) -> float:
        """Seconds of the step outside the forward: the host's share."""
        return self.duration - self.phases.get("forward", 0.0)

    @property
    def num_seqs(self) -> int:
        return len(self.scheduled)

    @property
    def num_batched_tokens(self) -> int:
        return sum(s.num_tokens for s in self.scheduled)

    @property
    def num_prefill_tokens(self) -> int:
        return sum(s.num_tokens for s in self.scheduled if s.is_prefill)

    @property
    def num_decode_tokens(self) -> int:
        return sum(s.num_tokens for s in self.scheduled if not s.is_prefill)

    @property
    def num_draft_tokens(self) -> int:
        return sum(s.num_draft_tokens for s in self.scheduled)
