"""What the engine reports about itself: a snapshot between steps (EngineStats) and the record
of one step (StepRecord), plain values only, so lessons, benchmarks and tests can keep
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


@dataclass(slots=True)
class EngineStats:
    """A snapshot of the engine between steps."""

    num_running: int
    num_waiting: int
    num_swapped: int
    num_blocks_used: int
    num_blocks_total: int
    slots_reserved: int        # KV slots owned by running sequences (used blocks x block_size)
    tokens_cached: int         # tokens whose K/V those slots actually hold
    num_preemptions: int       # since the engine was configured
    prefix_cache_queried_tokens: int = 0   # prompt tokens looked up at admission
    prefix_cache_hit_tokens: int = 0       # of those, found in the cache (not computed)
    # Speculative decoding, since the engine was configured (vLLM's spec_decode counters).
    spec_decode_num_drafts: int = 0            # verifications: sequences that proposed, x steps
    spec_decode_num_draft_tokens: int = 0      # draft tokens verified
    spec_decode_num_accepted_tokens: int = 0   # ... and accepted
    spec_decode_num_accepted_tokens_per_pos: tuple[int, ...] = ()  # [i]: drafts i accepted
    spec_decode_num_judged_tokens_per_pos: tuple[int, ...] = ()    # [i]: drafts i judged

    @property
    def spec_decode_acceptance_rate(self) -> float:
        n = self.spec_decode_num_draft_tokens
        return self.spec_decode_num_accepted_tokens / n if n else 0.0

    @property
    def spec_decode_mean_acceptance_length(self) -> float:
        """Tokens a sequence gains per verifying forward: the accepted drafts, plus the one
        token the target adds (vLLM's "mean acceptance length"; 1.0 without speculation)."""
        n = self.spec_decode_num_drafts
        return 1 + self.spec_decode_num_accepted_tokens / n if n else 1.0

    @property
    def spec_decode_acceptance_per_pos(self) -> list[float]:
        """alpha_i: of the verifications that judged draft i (proposed, drafts 0..i-1
        accepted), the share that accepted it. Leviathan et al.'s formula takes this, not
        accepted/drafted: at alpha = 0.8, k = 4, independent guesses, that is only 0.59."""
        return [n / j if j else 0.0 for n, j in zip(self.spec_decode_num_accepted_tokens_per_pos,
                                                    self.spec_decode_num_judged_tokens_per_pos)]

    @property
    def prefix_cache_hit_rate(self) -> float:
        q = self.prefix_cache_queried_tokens
        return self.prefix_cache_hit_tokens / q if q else 0.0

    @property
    def kv_utilization(self) -> float:
        """Share of reserved KV memory that holds real tokens."""
        return self.tokens_cached / self.slots_reserved if self.slots_reserved else 0.0


@dataclass(slots=True)           # not frozen: that makes __init__ ~5x slower, and a long
class ScheduledSeq:              # trace or a simulation builds one per sequence per step
    """One sequence's share of a step."""

    request_id: str
    index: int                 # which sample of the request
    num_tokens: int            # tokens computed for it this step
    is_prefill: bool           # a prefill chunk (or a recompute), not a one-token decode
    num_draft_tokens: int = 0  # of num_tokens, draft tokens verified (speculative decoding)
    lora_int_id: int = 0       # its LoRA adapter (minivllm/lora/models.py), 0 for the base model
    num_computed_tokens: int = 0   # tokens in its KV before the step (prefix-cache hits too)
    samples: bool = True       # its new tokens reach its end, so it samples (not a mid chunk)


@dataclass(slots=True)
class StepRecord:
    """One engine step: what the scheduler decided, how long it took, and the engine after."""

    step: int                                   # 0, 1, 2, ... since the engine was configured
    scheduled: list[ScheduledSeq]
    preempted: list[str]                        # request ids, recomputed or swapped out
    swapped_out: list[str]
    swapped_in: list[str]
    num_blocks_copied: int                      # copy-on-write copies this step
    finished: list[str]                         # requests that finished this step
    duration: float                             # seconds, schedule to outputs
    stats: EngineStats
    start_time: float = 0.0                     # time.perf_counter() when the step began
    errors: dict[str, str] = field(default_factory=dict)   # request id -> why it failed
    num_accepted_tokens: int = 0                # draft tokens the target accepted this step

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
