"""What comes out, at the three borders a step crosses:

    ModelRunnerOutput    runner -> scheduler: the tokens one forward pass drew (vLLM twin:
                         vllm/v1/outputs.py)
    EngineCoreOutputs    engine core -> front end: per sample, the tokens it gained this step
                         and why it finished, keyed by request id; plain values, no core object
                         (vLLM twin: vllm/v1/engine/__init__.py)
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


# One drawn token: (token id, its logprobs entry {token_id: logprob}, or None if not asked for).
Draw = tuple[int, "dict[int, float] | None"]


@dataclass(slots=True)
class ModelRunnerOutput:
    """What one step's forward pass and sampling produced, for Scheduler.update_from_output.

    sampled[seq_id]   the tokens that sequence appends this step, in order: one, or with
                      speculative decoding the drafts the target accepted and then one more
    forked[seq_id]    (vLLM V0's parallel sampling, for an n > 1 request the core forks; the
                      front end fans n out instead, as V1 does) a sequence whose prompt is now
                      computed, of a request with n > 1 samples:
                      the first token of each other sample (indices 1..n-1), drawn from the
                      same logits row; update_from_output forks the samples and appends them
    errors            request_id -> why sampling failed (that request alone is aborted)
    draft_token_ids[(request_id, index)]   speculative decoding: the drafts the runner's
                      drafter proposed for that sample's next step, from its tokens with this
                      step's appended (vLLM: DraftTokenIds, by request id; here by sample, and
                      not by seq_id: a sample forked this step has none the runner knows); the
                      core hands them to Scheduler.update_draft_token_ids

    A sequence that ran a prefill chunk short of its prompt's end samples nothing: it is in
    none of the dicts.
    """

    sampled: dict[int, list[Draw]] = field(default_factory=dict)
    forked: dict[int, list[Draw]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    draft_token_ids: dict[tuple[str, int], list[int]] = field(default_factory=dict)


@dataclass(slots=True)
class EngineCoreOutput:
    """One sample of one request, after a step that gave it tokens or finished it."""

    request_id: str
    index: int                                  # which of the request's n samples
    new_token_ids: list[int]                    # appended this step, in order (may be empty)
    new_logprobs: list[dict[int, float]] | None  # one entry per new token, if asked for
    finish_reason: str | None = None            # "stop", "length", "abort"; None: running
    error: str | None = None                    # why the core failed the request, if it did
    first_scheduled_time: float | None = None   # when the core first scheduled the request
    num_draft_tokens: int = 0                   # speculative decoding, so far: drafts verified
    num_accepted_tokens: int = 0                # ... and accepted


@dataclass(slots=True)
class EngineCoreOutputs:
    """What one EngineCore.step hands the front end."""

    outputs: list[EngineCoreOutput] = field(default_factory=list)
    timestamp: float = 0.0                      # time.perf_counter() when the tokens came
    # The core's EngineStats after the step, when it runs in its own process (vLLM's
    # SchedulerStats ride along the same way): the front end's stats() without a round trip.
    scheduler_stats: object | None = None
