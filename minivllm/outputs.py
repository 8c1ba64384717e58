"""What comes out, at the three borders a step crosses:

    ModelRunnerOutput    runner -> scheduler: the tokens one forward pass drew (vLLM twin:
                         vllm/v1/outputs.py)
    EngineCoreOutputs    engine core -> front end: per request, the tokens it gained this step
                         and why it finished, keyed by request id; plain values, no core object
                         (vLLM twin: vllm/v1/engine/__init__.py)
    EngineStats          engine core -> front end: a snapshot of the scheduler and the KV pool
                         (vLLM twin: SchedulerStats, vllm/v1/metrics/stats.py)
    RequestOutput        front end -> caller: text, token ids and metrics, one CompletionOutput
                         per sample (vLLM twin: vllm/outputs.py)

Left out, compared with vLLM: prompt logprobs, cumulative logprobs, and the delta / final-only
output kinds (outputs here are always cumulative).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class CompletionOutput:
    index: int                                  # which of the n samples
    text: str
    token_ids: list[int]
    logprobs: list[dict[int, float]] | None     # per token: {token_id: logprob}, top-k + chosen
    finish_reason: str | None                   # "stop", "length", "abort" or None (running)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(slots=True)
class RequestMetrics:
    arrival_time: float
    first_scheduled_time: float | None
    first_token_time: float | None
    finished_time: float | None
    num_draft_tokens: int = 0       # speculative decoding: draft tokens verified for the request
    num_accepted_tokens: int = 0    # ... and of those, accepted (each saved a target forward)

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted / proposed draft tokens (None: nothing was proposed)."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else None

    @property
    def ttft(self) -> float | None:
        """Time to first token, seconds."""
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def e2e_latency(self) -> float | None:
        """Arrival to last token, seconds (None until the request has finished)."""
        return None if self.finished_time is None else self.finished_time - self.arrival_time


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics | None = None
    inter_token_latencies: list[float] = field(default_factory=list)   # once finished
    error: str | None = None      # why the engine failed this request (finish_reason "abort")
    num_cached_tokens: int | None = None   # prompt tokens found cached (either KV tier)


# One drawn token: (token id, its logprobs entry {token_id: logprob}, or None if not asked for).
Draw = tuple[int, "dict[int, float] | None"]


@dataclass(slots=True)
class ModelRunnerOutput:
    """What one step's forward pass and sampling produced, for Scheduler.update_from_output.
    Every dict is keyed by request id, the one key of every message (vLLM V1's req_id).

    sampled[req_id]   the tokens that request appends this step, in order: one, or with
                      speculative decoding the drafts the target accepted and then one more
    errors[req_id]    why sampling failed for it (that request alone is aborted)
    draft_token_ids[req_id]   speculative decoding: the drafts the runner's drafter proposed
                      for its next step, from its tokens with this step's appended (vLLM's
                      DraftTokenIds); the core hands them to Scheduler.update_draft_token_ids
    timings           seconds in each of the runner's phases: prepare, forward (until the
                      device is done), sample (worker/phase_timer.py)

    A request that ran a prefill chunk short of its prompt's end samples nothing: it is in
    none of the dicts.
    """

    sampled: dict[str, list[Draw]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    draft_token_ids: dict[str, list[int]] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)


@dataclass(slots=True)
class EngineCoreOutput:
    """One request, after a step that gave it tokens or finished it."""

    request_id: str
    new_token_ids: list[int]                    # appended this step, in order (may be empty)
    new_logprobs: list[dict[int, float]] | None  # one entry per new token, if asked for
    finish_reason: str | None = None            # "stop", "length", "abort"; None: running
    error: str | None = None                    # why the core failed the request, if it did
    first_scheduled_time: float | None = None   # when the core first scheduled the request
    num_draft_tokens: int = 0                   # speculative decoding, so far: drafts verified
    num_accepted_tokens: int = 0                # ... and accepted
    num_cached_tokens: int = 0                  # prompt tokens it found cached, GPU or CPU tier


@dataclass(slots=True)
class EngineStats:
    """A snapshot of the engine between steps (Scheduler.make_stats; vLLM: SchedulerStats)."""

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
    # The CPU tier (kv_offload/), since the start: the prompt tokens looked up there (past the
    # GPU pool's hits) and found; its blocks in use and in all; blocks and bytes (one
    # device's) copied into it and back (vLLM: external_prefix_cache_*, kv_offload_*).
    external_prefix_cache_queried_tokens: int = 0
    external_prefix_cache_hit_tokens: int = 0
    kv_offload_num_blocks_used: int = 0
    kv_offload_num_blocks_total: int = 0
    kv_offload_stored_blocks: int = 0
    kv_offload_loaded_blocks: int = 0
    kv_offload_store_bytes: int = 0
    kv_offload_load_bytes: int = 0
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
    def kv_cache_usage(self) -> float:
        """Share of the KV pool's blocks in use (vLLM's SchedulerStats.kv_cache_usage)."""
        return self.num_blocks_used / self.num_blocks_total if self.num_blocks_total else 0.0

    @property
    def kv_offload_usage(self) -> float:
        """Share of the CPU tier's blocks in use (0 without a tier)."""
        used, total = self.kv_offload_num_blocks_used, self.kv_offload_num_blocks_total
        return used / total if total else 0.0

    @property
    def kv_utilization(self) -> float:
        """Share of reserved KV memory that holds real tokens."""
        return self.tokens_cached / self.slots_reserved if self.slots_reserved else 0.0


@dataclass(slots=True)
class EngineCoreOutputs:
    """What one EngineCore.step hands the front end."""

    outputs: list[EngineCoreOutput] = field(default_factory=list)
    timestamp: float = 0.0                      # time.perf_counter() when the tokens came
    # The core's EngineStats after the step, when it runs in its own process (vLLM's
    # SchedulerStats ride along the same way): the front end's stats() without a round trip.
    scheduler_stats: object | None = None
    # Its prefix cache's events since the last outputs (kv_events_config on; core/kv_events.py)
    # and, behind a data-parallel front end, which replica sent them (vLLM's engine_index).
    kv_events: list = field(default_factory=list)
    engine_index: int = 0
