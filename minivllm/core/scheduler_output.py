"""What the scheduler hands the runner each step (vLLM twin: vllm/v1/core/sched/output.py).

The runner keeps its own state of every request it computes (worker/input_batch.py) and learns
what changed from these messages, keyed by request id (V1's req_id), never from a core object:

    scheduled_new_reqs      NewRequestData: a request the runner has not seen (admitted, or
                            back after a recompute preemption): its tokens, params, blocks and
                            computed count, whole
    scheduled_cached_reqs   CachedRequestData: requests it holds: the tokens the core appended
                            since (vLLM sends these for pipeline parallelism; here every
                            rank learns its tokens this way, so no rank but the first needs
                            to sample), their block tables now, and how many tokens have K/V
    num_scheduled_tokens    req_id -> tokens to compute this step (drafts included)
    scheduled_spec_decode_tokens   req_id -> the draft tokens it verifies
    finished_req_ids        requests that finished since the last step: the runner (and its
                            sampler and drafter) forget them before this step runs

V1 sends only a table's new block ids; here the whole table, a few ints (copy-on-write may
replace its last block, a swap all of them).

The core's own view of the step rides along for traces, lessons and tests: one ScheduledRequest
per scheduled request (`scheduled`, plain values, the trace's record too) and the ids preempted,
swapped out and in. The runner never reads it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from typing import TYPE_CHECKING

from minivllm.sampling_params import SamplingParams

if TYPE_CHECKING:
    from minivllm.core.request import Request


@dataclass(slots=True)
class NewRequestData:
    req_id: str
    token_ids: list[int]              # prompt + output so far
    num_prompt_tokens: int
    sampling_params: SamplingParams
    block_ids: list[int]
    num_computed_tokens: int
    lora_int_id: int = 0

    @classmethod
    def from_request(cls, request: Request) -> NewRequestData:
        return cls(request.request_id, list(request.token_ids),
                   request.num_prompt_tokens, request.sampling_params, list(request.block_table),
                   request.num_computed_tokens, request.lora_int_id)


@dataclass(slots=True)          # not frozen: that makes __init__ ~5x slower, and a long
class ScheduledRequest:         # trace or a simulation builds one per request per step
    """One request's share of a step, written once by the scheduler: what a StepRecord lists,
    what the simulator times, what the tests read."""

    request_id: str
    num_tokens: int            # tokens computed for it this step (drafts included)
    is_prefill: bool           # a prefill chunk (or a recompute), not a one-token decode
    num_draft_tokens: int = 0  # of num_tokens, draft tokens verified (speculative decoding)
    lora_int_id: int = 0       # its LoRA adapter (minivllm/lora/models.py), 0 for the base model
    num_computed_tokens: int = 0   # tokens in its KV before the step (prefix-cache hits too)
    samples: bool = True       # its new tokens reach its end, so it samples (not a mid chunk)


@dataclass(slots=True)
class CachedRequestData:
    req_ids: list[str] = field(default_factory=list)
    new_token_ids: list[list[int]] = field(default_factory=list)   # appended since last sent
    block_ids: list[list[int]] = field(default_factory=list)
    num_computed_tokens: list[int] = field(default_factory=list)


@dataclass(slots=True)
class SchedulerOutput:
    """What one step will do: the core carries it out, then keeps it
    (engine_core.last_scheduler_output).

    For the runner: the messages above, in the order the requests are batched (`req_ids`);
    sampling[i] says whether request i's new tokens reach its end, so that it samples this
    step (a prefill chunk short of the prompt's end does not): Request.samples_after, the one
    copy of the rule, also in its ScheduledRequest. The core's view: `scheduled`, a record per
    request in the same order, and the ids that left or came back.
    """

    req_ids: list[str] = field(default_factory=list)
    scheduled_new_reqs: list[NewRequestData] = field(default_factory=list)
    scheduled_cached_reqs: CachedRequestData = field(default_factory=CachedRequestData)
    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)
    scheduled_spec_decode_tokens: dict[str, list[int]] = field(default_factory=dict)
    finished_req_ids: set[str] = field(default_factory=set)
    sampling: list[bool] = field(default_factory=list)
    blocks_to_copy: list[tuple[int, int]] = field(default_factory=list)   # copy-on-write
    blocks_to_swap_out: list[tuple[int, int]] = field(default_factory=list)  # (device, cpu)
    blocks_to_swap_in: list[tuple[int, int]] = field(default_factory=list)   # (cpu, device)
    # Prefill/decode disaggregation: which blocks' K/V the worker loads or sends this step
    # (minivllm/distributed/kv_transfer/kv_connector.py, KVConnectorMetadata), or None.
    kv_connector_metadata: object | None = None
    # Structured output (V1's grammar_bitmask): a row of allowed-token bits for each guided
    # request that samples this step, in the order of structured_output_request_ids; built by
    # the core (structured_output/manager.py), applied by the worker's logits processors.
    structured_output_request_ids: list[str] = field(default_factory=list)
    grammar_bitmask: object | None = None
    # The core's view (traces, lessons, tests).
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)     # request ids, recomputed or swapped out
    swapped_out: list[str] = field(default_factory=list)   # of those, swapped out
    swapped_in: list[str] = field(default_factory=list)
    grammar_errors: dict[str, str] = field(default_factory=dict)   # they fail with the step
    schedule_time: float = 0.0           # seconds the core took to make it (the trace's)

    def for_workers(self) -> SchedulerOutput:
        """The messages alone, what crosses to another process: the core's view emptied."""
        return replace(self, scheduled=[], preempted=[], swapped_out=[], swapped_in=[],
                       grammar_errors={})

    @property
    def num_batched_tokens(self) -> int:
        return sum(s.num_tokens for s in self.scheduled)

    @property
    def num_prefill_tokens(self) -> int:
        return sum(s.num_tokens for s in self.scheduled if s.is_prefill)

    @property
    def num_decode_tokens(self) -> int:
        return sum(s.num_tokens for s in self.scheduled if not s.is_prefill)
