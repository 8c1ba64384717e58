"""Request: the engine core's state of one request (vLLM twin: vllm/v1/request.py). The front
end never sees it: the core reports on it in EngineCoreOutputs (minivllm/outputs.py), and text
lives in the front end's OutputProcessor.

Everything the scheduler, block manager and KV connector need to know of a request lives here:

    token_ids            prompt + generated tokens, in order
    num_computed_tokens  how many of them already have K/V in the cache
    block_table          logical block i -> physical block id in the KV pool
    spec_token_ids       speculative decoding: draft tokens to verify next step, not its
                         tokens yet; they are computed after token_ids, and only those the
                         target accepts join them
    status               WAITING, RUNNING, SWAPPED (V0's swap), or how it finished

The tokens still to be computed are token_ids[num_computed_tokens:]: the whole prompt at first,
then one new token per decode step. (vLLM V1 keeps the block ids in its KVCacheManager, keyed by
request id; here each request carries its table, which the block manager fills and empties.)

The request id is the one key of every message the core sends and receives (vLLM V1's req_id):
parallel sampling (n > 1) reaches the core as n requests of one sample each, fanned out by the
front end (engine/parallel_sampling.py), which share the prompt's blocks through the prefix
cache. V0's in-core fork and beam search (core/v0/) make their samples as requests of their
own too, each with its own id.

Plain Python only: no torch tensors here (each request's random generator lives with the
Sampler), so the scheduler and the block manager can be read and tested without a device.
Left out, compared with vLLM: pooling requests, multi-modal inputs, the client index.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from minivllm.outputs import EngineCoreOutput
from minivllm.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    SWAPPED = "swapped"                # V0's swap preemption: its KV parked in host memory
    FINISHED_STOPPED = "stop"          # EOS, a stop token or a stop string
    FINISHED_LENGTH_CAPPED = "length"  # max_tokens or max_model_len reached
    FINISHED_ABORTED = "abort"         # aborted by the caller, or failed (then .error says why)

    def __init__(self, value: str):
        # A plain attribute, not a property: every request asks it every step.
        self.finished = self.name.startswith("FINISHED")


@dataclass(slots=True)
class RequestMetrics:
    arrival_time: float = field(default_factory=time.perf_counter)
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None
    token_times: list[float] = field(default_factory=list)   # when each output token arrived
    num_draft_tokens: int = 0      # speculative decoding: draft tokens proposed and verified
    num_accepted_tokens: int = 0   # ... and of those, accepted by the target


class Request:
    def __init__(self, request_id: str, prompt_token_ids: list[int],
                 sampling_params: SamplingParams, lora_request=None,
                 arrival_time: float | None = None):
        self.request_id = request_id
        self.sampling_params = sampling_params
        self.lora_request = lora_request         # LoRARequest, or None for the base model
        self.grammar = None                      # its compiled guided-decoding constraint
        self.matcher = None                      # ... and its state (structured_output/)
        self.kv_transfer_params = None           # disaggregation: vLLM's, a dict or None
        self.beam_search = None                  # V0's in-core beam search: BeamSearchParams
        self.error: str | None = None            # why the engine failed it, if it did
        self.token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.status = RequestStatus.WAITING
        self.num_computed_tokens = 0
        self.num_output_placeholders = 0  # async scheduling: tokens sampled, not yet seen
        self.num_cached_tokens = 0       # tokens found cached (either tier) when first admitted
        self.block_table: list[int] = []
        self.spec_token_ids: list[int] = []
        # Prefix caching: hashes of full blocks (they depend on tokens only), how many leading
        # blocks of the table are already named in the cache, and keys that must also match
        # (an adapter's id: each adapter has its own prefix-cache namespace).
        self.block_hashes: list[int] = []
        self.num_cached_blocks = 0
        self.extra_keys: tuple = (lora_request.lora_int_id,) if lora_request else ()
        self.output_logprobs: list[dict[int, float]] = []
        self.metrics = RequestMetrics(time.perf_counter() if arrival_time is None
                                      else arrival_time)

    @classmethod
    def from_engine_core_request(cls, request) -> Request:
        """The core's Request for an EngineCoreRequest (engine/core.py), as vLLM V1's."""
        new = cls(request.request_id, request.prompt_token_ids, request.sampling_params,
                  request.lora_request, request.arrival_time)
        new.grammar = request.grammar
        new.kv_transfer_params = request.kv_transfer_params
        new.beam_search = request.beam_search
        return new

    def __len__(self) -> int:
        return len(self.token_ids)

    def __repr__(self) -> str:
        return (f"Request({self.request_id!r}, {self.status.value}, "
                f"tokens={len(self)}, computed={self.num_computed_tokens}, "
                f"blocks={self.block_table})")

    @property
    def lora_int_id(self) -> int:
        """The request's LoRA adapter id (minivllm/lora/models.py), 0 for the base model."""
        return self.lora_request.lora_int_id if self.lora_request else 0

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
        return len(self.token_ids) + self.num_output_placeholders - self.num_computed_tokens

    @property
    def is_prefill(self) -> bool:
        """Are prompt tokens (or, after a recompute preemption, any tokens but the newest)
        still without K/V? Then its next step is a prefill chunk, not a one-token decode."""
        num_tokens = len(self.token_ids) + self.num_output_placeholders
        return num_tokens - self.num_computed_tokens > 1 or num_tokens == self.num_prompt_tokens

    @property
    def is_finished(self) -> bool:
        return self.status.finished

    def output_since(self, num_before: int) -> EngineCoreOutput:
        """What the front end learns of this request after a step: its tokens from num_before
        on, and how it stands (plain values: no core object leaves the core)."""
        new = self.token_ids[num_before:]
        logprobs = None
        if self.sampling_params.logprobs is not None:
            logprobs = self.output_logprobs[len(self.output_logprobs) - len(new):] if new else []
        m = self.metrics
        return EngineCoreOutput(self.request_id, new, logprobs,
                                self.status.value if self.status.finished else None,
                                self.error, m.first_scheduled_time,
                                m.num_draft_tokens, m.num_accepted_tokens,
                                self.num_cached_tokens)

    def samples_after(self, num_new_tokens: int) -> bool:
        """Do num_new_tokens computed now (its drafts included) reach this request's end, so
        that it samples? A prefill chunk short of the prompt's end does not. The one copy of
        this rule: the scheduler records it in the step's ScheduledRequest and in
        SchedulerOutput.sampling, the runner's message."""
        return num_new_tokens >= self.num_uncomputed_tokens + len(self.spec_token_ids)

    def append_token(self, token_id: int, logprobs: dict[int, float] | None) -> None:
        self.token_ids.append(token_id)
        if logprobs is not None:
            self.output_logprobs.append(logprobs)
        now = time.perf_counter()
        if self.metrics.first_token_time is None:
            self.metrics.first_token_time = now
        self.metrics.token_times.append(now)


def check_stop(request: Request, eos_token_ids: set[int], max_model_len: int
               ) -> RequestStatus | None:
    """After appending a token: a stop token ends the request, so do max_tokens, max_model_len
    (stop strings need the text: engine/output_processor.py checks them). vLLM twin:
    vllm/v1/core/sched/utils.py."""
    params = request.sampling_params
    token = request.token_ids[-1]
    if token in params.stop_token_ids or (not params.ignore_eos and token in eos_token_ids):
        return RequestStatus.FINISHED_STOPPED
    num_tokens = len(request.token_ids)
    if num_tokens - request.num_prompt_tokens >= params.max_tokens or num_tokens >= max_model_len:
        return RequestStatus.FINISHED_LENGTH_CAPPED
    return None
