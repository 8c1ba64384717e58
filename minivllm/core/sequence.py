"""Sequence and SequenceGroup: the engine core's state of a request (vLLM twin: V0's
vllm/sequence.py; V1 folds both into vllm/v1/request.py, Request, and fans n > 1 out into n
requests at the front end, vllm/v1/engine/parallel_sampling.py). The front end never sees these
objects: the core reports on them in EngineCoreOutputs (minivllm/outputs.py), and text lives in
the front end's OutputProcessor.

A request becomes one SequenceGroup (vLLM's name) that owns its samples. Each sample is a
Sequence; everything the scheduler, block manager and model runner need to know about it lives
there:

    token_ids            prompt + generated tokens, in order
    num_computed_tokens  how many of them already have K/V in the cache
    block_table          logical block i -> physical block id in the KV pool

The tokens still to be computed are token_ids[num_computed_tokens:]: the whole prompt at first,
then one new token per decode step. Same bookkeeping as vLLM. With speculative decoding a
decoding sequence also holds, for one step, `spec_token_ids`: draft tokens that are not its
tokens yet; they are computed after token_ids, and only those the target accepts join them.

Parallel sampling (n > 1), vLLM V0's way: the group starts with one sequence, which prefills
the prompt once. When the prompt is done, the group forks the other n - 1 samples from it;
they share its blocks (copy-on-write) and each draws its own first token from the same logits
row. The front end (LLMEngine) no longer sends such a group: it fans n out into n requests of
one sample (vLLM V1, engine/parallel_sampling.py). The fork stays for a caller that adds an
EngineCoreRequest with n > 1 to the core itself (lesson 02), and for beam search.

Plain Python only: no torch tensors here (each sample's random generator lives with the
Sampler), so the scheduler and the block manager can be read and tested without a device.
Left out, compared with vLLM: beam search, prompt adapters, encoder-decoder and multi-modal
inputs.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from minivllm.outputs import EngineCoreOutput
from minivllm.sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    SWAPPED = "swapped"            # preempted, its KV parked in host memory
    FINISHED_STOPPED = "stop"      # EOS, a stop token or a stop string
    FINISHED_LENGTH = "length"     # max_tokens or max_model_len reached
    FINISHED_ABORTED = "abort"     # aborted by the caller, or failed (then group.error says why)

    def __init__(self, value: str):
        # A plain attribute, not a property: every sequence asks it every step.
        self.finished = self.name.startswith("FINISHED")


@dataclass(slots=True)
class SequenceMetrics:
    arrival_time: float = field(default_factory=time.perf_counter)
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None
    token_times: list[float] = field(default_factory=list)   # when each output token arrived
    num_draft_tokens: int = 0      # speculative decoding: draft tokens proposed and verified
    num_accepted_tokens: int = 0   # ... and of those, accepted by the target


class Sequence:
    def __init__(self, seq_id: int, group: SequenceGroup, index: int,
                 token_ids: list[int], num_prompt_tokens: int):
        self.seq_id = seq_id
        self.group = group                       # the request this sample belongs to
        self.request_id = group.request_id       # the group's, read per sequence per step
        self.index = index                       # which of the request's n samples
        self.token_ids = list(token_ids)
        self.num_prompt_tokens = num_prompt_tokens
        self.status = SequenceStatus.WAITING
        self.num_computed_tokens = 0
        self.block_table: list[int] = []
        self.spec_token_ids: list[int] = []      # draft tokens to verify this step (spec_decode)
        # Prefix caching: hashes of full blocks (they depend on tokens only), how many leading
        # blocks of the table are already named in the cache, and keys that must also match.
        self.block_hashes: list[int] = []
        self.num_cached_blocks = 0
        self.extra_keys: tuple = ()
        self.output_logprobs: list[dict[int, float]] = []
        self.metrics = SequenceMetrics(arrival_time=group.arrival_time)

    def __len__(self) -> int:
        return len(self.token_ids)

    def __repr__(self) -> str:
        return (f"Sequence(id={self.seq_id}, {self.status.value}, tokens={len(self)}, "
                f"computed={self.num_computed_tokens}, blocks={self.block_table})")

    @property
    def params(self) -> SamplingParams:
        return self.group.params

    @property
    def lora_int_id(self) -> int:
        """The request's LoRA adapter id (minivllm/lora/models.py), 0 for the base model."""
        return self.group.lora_request.lora_int_id if self.group.lora_request else 0

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
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_prefill(self) -> bool:
        """Are prompt tokens (or, after a recompute preemption, any tokens but the newest)
        still without K/V? Then its next step is a prefill chunk, not a one-token decode."""
        num_tokens = len(self.token_ids)
        return num_tokens - self.num_computed_tokens > 1 or num_tokens == self.num_prompt_tokens

    @property
    def is_finished(self) -> bool:
        return self.status.finished

    def output_since(self, num_before: int) -> EngineCoreOutput:
        """What the front end learns of this sample after a step: its tokens from num_before
        on, and how it stands (plain values: no core object leaves the core)."""
        new = self.token_ids[num_before:]
        logprobs = None
        if self.params.logprobs is not None:
            logprobs = self.output_logprobs[len(self.output_logprobs) - len(new):] if new else []
        m = self.metrics
        return EngineCoreOutput(self.request_id, self.index, new, logprobs,
                                self.status.value if self.status.finished else None,
                                self.group.error, m.first_scheduled_time,
                                m.num_draft_tokens, m.num_accepted_tokens)

    def samples_after(self, num_new_tokens: int) -> bool:
        """Do num_new_tokens computed now (its drafts included) reach this sequence's end, so
        that it samples? A prefill chunk short of the prompt's end does not. The one copy of
        this rule: the scheduler records it in SchedulerOutput.sampling."""
        return (self.num_computed_tokens + num_new_tokens
                >= len(self.token_ids) + len(self.spec_token_ids))

    def append_token(self, token_id: int, logprobs: dict[int, float] | None) -> None:
        self.token_ids.append(token_id)
        if logprobs is not None:
            self.output_logprobs.append(logprobs)
        now = time.perf_counter()
        if self.metrics.first_token_time is None:
            self.metrics.first_token_time = now
        self.metrics.token_times.append(now)


class SequenceGroup:
    """One request: its prompt, its SamplingParams, and the samples it owns.

    `seqs` holds the samples that exist: one until the prompt has been prefilled, then all n
    (`fork` makes the others: vLLM V0's parallel sampling; from the front end n is 1). The scheduler asks `num_unforked` to reserve room for the
    samples to come before it admits the first one.
    """

    def __init__(self, request_id: str, prompt: str | None, prompt_token_ids: list[int],
                 params: SamplingParams, first_seq_id: int, lora_request=None):
        self.request_id = request_id
        self.prompt = prompt
        self.params = params
        self.arrival_time = time.perf_counter()
        self.error: str | None = None            # why the engine failed this request, if it did
        self.lora_request = lora_request         # LoRARequest, or None for the base model
        self.grammar = None                      # its compiled guided-decoding constraint
        self.kv_transfer_params = None           # disaggregation: vLLM's, a dict or None
        first = Sequence(first_seq_id, self, 0, prompt_token_ids, len(prompt_token_ids))
        if lora_request is not None:             # its own prefix-cache namespace too
            first.extra_keys = (lora_request.lora_int_id,)
        self.seqs = [first]

    def __repr__(self) -> str:
        return f"SequenceGroup({self.request_id!r}, n={self.params.n}, seqs={self.seqs})"

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.seqs[0].prompt_token_ids

    @property
    def num_unforked(self) -> int:
        return self.params.n - len(self.seqs)

    @property
    def is_finished(self) -> bool:
        return self.num_unforked == 0 and all(s.is_finished for s in self.seqs)

    def fork(self, seq_ids) -> list[Sequence]:
        """Make the other n - 1 samples as copies of the first, whose prompt is now computed.
        They hold no blocks yet: the caller shares the first sample's blocks with them."""
        first = self.seqs[0]
        children = []
        for index in range(len(self.seqs), self.params.n):
            child = Sequence(next(seq_ids), self, index, first.token_ids, first.num_prompt_tokens)
            child.num_computed_tokens = first.num_computed_tokens
            child.block_hashes = list(first.block_hashes)
            child.extra_keys = first.extra_keys
            child.metrics.first_scheduled_time = first.metrics.first_scheduled_time
            children.append(child)
        self.seqs += children
        return children
