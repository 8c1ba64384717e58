"""The runner's own state of each request it computes (vLLM twin: CachedRequestState in
vllm/v1/worker/gpu_input_batch.py).

The runner builds a CachedRequestState from a NewRequestData the first time a request is
scheduled, updates its tokens, block table and computed count from each step's
CachedRequestData, and drops it when its id comes in finished_req_ids. So the runner reads no
scheduler object: what it knows of a request came in a SchedulerOutput message
(core/scheduler_output.py). It has the fields the sampler, the logits processors, the
rejection sampler and the logits processors read of a request.

StepInputs holds the step's integer inputs in persistent host buffers (vLLM V1's
CpuGpuBuffer): each is filled in place and, on CUDA, copied from pinned memory into a device
buffer of its own with non_blocking=True, so building a step's inputs never waits for the GPU.

Left out, compared with vLLM: the persistent InputBatch (per-request rows kept across steps and
updated in place, condensed as requests leave); here the step's lists are built anew in Python,
and only their buffers persist.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from minivllm.core.scheduler_output import NewRequestData
from minivllm.sampling_params import SamplingParams


@dataclass(slots=True)
class CachedRequestState:
    req_id: str
    token_ids: list[int]                   # prompt + output, as far as the runner knows
    num_prompt_tokens: int
    sampling_params: SamplingParams
    block_table: list[int]
    num_computed_tokens: int
    lora_int_id: int = 0
    spec_token_ids: list[int] = field(default_factory=list)   # this step's drafts
    grammar_bitmask: object | None = None  # this step's allowed tokens (structured output)

    @classmethod
    def from_new(cls, new: NewRequestData) -> CachedRequestState:
        return cls(new.req_id, list(new.token_ids),
                   new.num_prompt_tokens, new.sampling_params, list(new.block_ids),
                   new.num_computed_tokens, new.lora_int_id)

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[:self.num_prompt_tokens]

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    def samples_after(self, num_new_tokens: int) -> bool:
        """As Request.samples_after (the draft model's own runs ask it of a state)."""
        return (self.num_computed_tokens + num_new_tokens
                >= len(self.token_ids) + len(self.spec_token_ids))


class StepInputs:
    """The step's int64 inputs, one persistent buffer each, by name. `put` writes a list of
    ints into the host buffer and returns the input: on a CPU the host buffer itself (a view of
    its first len(values)), on CUDA a device buffer it was copied to from pinned memory. A
    buffer grows when a step needs more (the draft model's first pass over whole prompts)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.pinned = device.type == "cuda"
        self.host: dict[str, torch.Tensor] = {}
        self.on_device: dict[str, torch.Tensor] = {}

    def put(self, name: str, values: list[int]) -> torch.Tensor:
        n = len(values)
        host = self.host.get(name)
        if host is None or host.numel() < n:
            size = max(n, 2 * host.numel() if host is not None else 256)
            host = self.host[name] = torch.zeros(size, dtype=torch.int64, pin_memory=self.pinned)
            if self.pinned:
                self.on_device[name] = torch.empty_like(host, device=self.device)
        host.numpy()[:n] = values
        if not self.pinned:
            return host[:n]
        return self.on_device[name][:n].copy_(host[:n], non_blocking=True)
