"""SpecDecodingStats: speculative decoding's counters, which the scheduler keeps as it accepts
drafts (vLLM twin: vllm/v1/spec_decode/metrics.py). EngineCore.stats() reports them, and
lesson 07 reads the acceptance rate per position from them.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class SpecDecodingStats:
    num_drafts: int = 0             # verifications: requests that proposed, summed over steps
    num_draft_tokens: int = 0       # draft tokens verified
    num_accepted_tokens: int = 0    # ... and accepted
    num_accepted_this_step: int = 0
    # [i]: verifications that accepted draft i (0-based; so i + 1 leading drafts, as vLLM's) and
    # that judged it (proposed, 0..i-1 accepted); alpha_i = accepted[i] / judged[i].
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)
    num_judged_tokens_per_pos: list[int] = field(default_factory=list)

    def observe_draft(self, num_draft_tokens: int, num_accepted_tokens: int) -> None:
        """One verification: num_draft_tokens drafts, of which the first num_accepted_tokens
        were accepted (vLLM's name)."""
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted_tokens
        self.num_accepted_this_step += num_accepted_tokens
        accepted, judged = self.num_accepted_tokens_per_pos, self.num_judged_tokens_per_pos
        for per_pos in (accepted, judged):
            per_pos.extend([0] * (num_draft_tokens - len(per_pos)))
        for i in range(num_accepted_tokens):
            accepted[i] += 1
        for i in range(min(num_accepted_tokens + 1, num_draft_tokens)):
            judged[i] += 1
