"""Sequence: the state of one sample of one request, as it moves through the engine.

A request with n samples becomes n Sequences that share a request_id. Everything the scheduler,
block manager and model runner need to know about a sequence lives here:

    token_ids            prompt + generated tokens, in order
    num_computed_tokens  how many of them already have K/V in the cache
    block_table          logical block i -> physical block id in the KV pool

The tokens still to be computed are token_ids[num_computed_tokens:]: the whole prompt at first,
then one new token per decode step. Same bookkeeping as vLLM.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

import torch

from minivllm.sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    SWAPPED = "swapped"            # preempted, its KV parked in host memory
    FINISHED_STOPPED = "stop"      # EOS, a stop token or a stop string
    FINISHED_LENGTH = "length"     # max_tokens or max_model_len reached
    FINISHED_ABORTED = "abort"

    @property
    def finished(self) -> bool:
        return self.name.startswith("FINISHED")


@dataclass(slots=True)
class SequenceMetrics:
    arrival_time: float = field(default_factory=time.perf_counter)
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None
    token_times: list[float] = field(default_factory=list)   # when each output token arrived


class Sequence:
    def __init__(self, seq_id: int, request_id: str, prompt: str | None,
                 prompt_token_ids: list[int], params: SamplingParams, seed: int | None,
                 device: torch.device):
        self.seq_id = seq_id
        self.request_id = request_id
        self.prompt = prompt
        self.token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.params = params
        self.status = SequenceStatus.WAITING
        self.num_computed_tokens = 0
        self.block_table: list[int] = []
        # Prefix caching: hashes of full blocks (they depend on tokens only), how many leading
        # blocks of the table are already named in the cache, and keys that must also match.
        self.block_hashes: list[int] = []
        self.num_cached_blocks = 0
        self.extra_keys: tuple = ()
        self.detokenizer = None                  # IncrementalDetokenizer, set by the engine
        self.output_text = ""                    # the text so far (cut at a stop string)
        self.stop_string: str | None = None      # the stop string that finished it, if any
        # Parallel sampling: the prompt is prefilled once, by the first sample; the others wait
        # here and are forked from it (sharing its blocks) when its first token is sampled.
        self.pending_forks: list[Sequence] = []
        self.parent: Sequence | None = None
        self.output_logprobs: list[dict[int, float]] = []
        self.metrics = SequenceMetrics()
        # Every sequence samples from its own generator, so its tokens do not depend on what
        # else shares the batch: a seeded request is reproducible in any company.
        self.generator = torch.Generator(device=device)
        if seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(seed)

    def __len__(self) -> int:
        return len(self.token_ids)

    def __repr__(self) -> str:
        return (f"Sequence(id={self.seq_id}, {self.status.value}, tokens={len(self)}, "
                f"computed={self.num_computed_tokens}, blocks={self.block_table})")

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
    def is_finished(self) -> bool:
        return self.status.finished

    def append_token(self, token_id: int, logprobs: dict[int, float] | None) -> None:
        self.token_ids.append(token_id)
        if logprobs is not None:
            self.output_logprobs.append(logprobs)
        now = time.perf_counter()
        if self.metrics.first_token_time is None:
            self.metrics.first_token_time = now
        self.metrics.token_times.append(now)
