"""The runner's own state of each sample it computes (vLLM twin: CachedRequestState in
vllm/v1/worker/gpu_input_batch.py).

The runner builds a CachedRequestState from a NewRequestData the first time a sample is
scheduled, updates its block table and computed count from each step's CachedRequestData,
and appends the tokens it samples itself; finished samples are dropped. So the runner reads no
scheduler object: what it knows of a sample came in a SchedulerOutput message
(core/scheduler_output.py). It has the fields the sampler, the logits processors, the
rejection sampler and guided decoding read of a sample.

Left out, compared with vLLM: the persistent InputBatch (tensors kept across steps and
updated in place, rows condensed as requests leave); here the step's tensors are built anew.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from minivllm.core.scheduler_output import NewRequestData
from minivllm.sampling_params import SamplingParams


@dataclass(slots=True)
class CachedRequestState:
    seq_id: int
    request_id: str
    index: int                             # which of the request's samples
    token_ids: list[int]                   # prompt + output, as far as the runner knows
    num_prompt_tokens: int
    sampling_params: SamplingParams
    block_table: list[int]
    num_computed_tokens: int
    lora_int_id: int = 0
    grammar: object | None = None
    spec_token_ids: list[int] = field(default_factory=list)   # this step's drafts

    @classmethod
    def from_new(cls, new: NewRequestData) -> CachedRequestState:
        return cls(new.seq_id, new.request_id, new.index, list(new.token_ids),
                   new.num_prompt_tokens, new.sampling_params, list(new.block_ids),
                   new.num_computed_tokens, new.lora_int_id, new.grammar)

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[:self.num_prompt_tokens]

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def num_forks(self) -> int:
        """Samples to fork when this one first samples: n - 1 for the first sample of an
        n > 1 request whose prompt is now computed (V0's fork; V1 fans n out instead)."""
        first = self.index == 0 and self.num_output_tokens == 0
        return self.sampling_params.n - 1 if first else 0

    def samples_after(self, num_new_tokens: int) -> bool:
        """As Request.samples_after (the draft model's own runs ask it of a state)."""
        return (self.num_computed_tokens + num_new_tokens
                >= len(self.token_ids) + len(self.spec_token_ids))
