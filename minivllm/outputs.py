"""What a request gets back: RequestOutput with one CompletionOutput per sample (vLLM twin:
vllm/outputs.py).

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
