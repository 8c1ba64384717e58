"""What the scheduler hands the runner each step (vLLM twin: vllm/v1/core/sched/output.py).

The runner keeps its own state of every sample it computes (worker/input_batch.py) and learns
what changed from these messages, keyed by the sample's id, never from a core object:

    scheduled_new_reqs      NewRequestData: a sample the runner has not seen (admitted, forked
                            from its first sample, or back after a recompute preemption): its
                            tokens, params, blocks and computed count, whole
    scheduled_cached_reqs   CachedRequestData: samples it holds: the tokens the core appended
                            since (vLLM sends these for pipeline parallelism; here every
                            rank learns its tokens this way, so no rank but the first needs
                            to sample), their block tables now, and how many tokens have K/V
    num_scheduled_tokens    sample id -> tokens to compute this step (drafts included)
    scheduled_spec_decode_tokens   sample id -> the draft tokens it verifies

vLLM V1 keys these by request id. Here the key is Request.seq_id: the same one-to-one key for
every request the front end sends (it fans n > 1 out into n requests, as V1 does), and one
that still tells apart the samples of a V0-style n > 1 request, which share their request id.
V1 sends only a table's new block ids; here the whole table, a few ints (copy-on-write may
replace its last block, a swap all of them).

The core's own view of the step rides along for traces, lessons and tests (`scheduled_requests`,
`num_new_tokens`, `is_prefill`, `preempted`, ...): the runner never reads it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from minivllm.core.request import Request
from minivllm.sampling_params import SamplingParams


@dataclass(slots=True)
class NewRequestData:
    seq_id: int
    request_id: str
    index: int                        # which of the request's samples
    token_ids: list[int]              # prompt + output so far
    num_prompt_tokens: int
    sampling_params: SamplingParams
    block_ids: list[int]
    num_computed_tokens: int
    lora_int_id: int = 0
    grammar: object | None = None     # its compiled guided-decoding constraint

    @classmethod
    def from_request(cls, request: Request) -> NewRequestData:
        return cls(request.seq_id, request.request_id, request.index, list(request.token_ids),
                   request.num_prompt_tokens, request.sampling_params, list(request.block_table),
                   request.num_computed_tokens, request.lora_int_id, request.grammar)


@dataclass(slots=True)
class CachedRequestData:
    seq_ids: list[int] = field(default_factory=list)
    new_token_ids: list[list[int]] = field(default_factory=list)   # appended since last sent
    block_ids: list[list[int]] = field(default_factory=list)
    num_computed_tokens: list[int] = field(default_factory=list)


@dataclass(slots=True)
class SchedulerOutput:
    """What one step will do: the core carries it out, then keeps it
    (engine_core.last_scheduler_output).

    For the runner: the messages above, in the order the samples are batched (`seq_ids`).
    The core's view: scheduled_requests[i] computes num_new_tokens[i] tokens; is_prefill[i]
    says whether that is a prefill chunk (prompt tokens, or tokens to recompute after a
    preemption) or a one-token decode; spec_token_ids[i] are the drafts it verifies (counted
    in num_new_tokens[i]); sampling[i] says whether its new tokens reach its end, so that it
    samples this step (a prefill chunk short of the prompt's end does not): the runner, the
    simulator and the tests all read this one rule.
    """

    seq_ids: list[int] = field(default_factory=list)
    scheduled_new_reqs: list[NewRequestData] = field(default_factory=list)
    scheduled_cached_reqs: CachedRequestData = field(default_factory=CachedRequestData)
    num_scheduled_tokens: dict[int, int] = field(default_factory=dict)
    scheduled_spec_decode_tokens: dict[int, list[int]] = field(default_factory=dict)
    sampling: list[bool] = field(default_factory=list)
    blocks_to_copy: list[tuple[int, int]] = field(default_factory=list)   # copy-on-write
    blocks_to_swap_out: list[tuple[int, int]] = field(default_factory=list)  # (device, cpu)
    blocks_to_swap_in: list[tuple[int, int]] = field(default_factory=list)   # (cpu, device)
    # Prefill/decode disaggregation: which blocks' K/V the worker loads or sends this step
    # (minivllm/distributed/kv_transfer/kv_connector.py, KVConnectorMetadata), or None.
    kv_connector_metadata: object | None = None
    # The core's view (traces, lessons, tests).
    scheduled_requests: list[Request] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)
    is_prefill: list[bool] = field(default_factory=list)
    spec_token_ids: list[list[int]] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)     # recomputed or swapped out
    swapped_out: list[Request] = field(default_factory=list)   # of those, swapped out
    swapped_in: list[Request] = field(default_factory=list)

    def for_workers(self) -> SchedulerOutput:
        """The messages alone, what crosses to another process: the core's view emptied, and
        no compiled grammar (only the first rank samples)."""
        new = [replace(r, grammar=None) for r in self.scheduled_new_reqs]
        return replace(self, scheduled_new_reqs=new, scheduled_requests=[], num_new_tokens=[],
                       is_prefill=[], spec_token_ids=[], preempted=[], swapped_out=[],
                       swapped_in=[])

    @property
    def num_batched_tokens(self) -> int:
        return sum(self.num_new_tokens)

    @property
    def num_prefill_tokens(self) -> int:
        return sum(n for n, p in zip(self.num_new_tokens, self.is_prefill) if p)

    @property
    def num_decode_tokens(self) -> int:
        return sum(n for n, p in zip(self.num_new_tokens, self.is_prefill) if not p)
