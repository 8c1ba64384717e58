"""LLMEngine: the loop that turns requests into tokens, one iteration at a time.

    add_request(...)   tokenize, validate, make n Sequences, queue them
    step()             schedule -> run the model once -> append tokens, finish, free blocks
                       -> a RequestOutput for every request that made progress (streaming)

LLM (minivllm/llm.py) is the offline front end on top: add everything, step until done.
"""

from __future__ import annotations

import itertools
import logging
import time
from dataclasses import dataclass

import torch

from minivllm.block_manager import BlockManager, cdiv
from minivllm.config import (EngineConfig, ModelConfig, resolve_device, resolve_dtype)
from minivllm.detokenizer import IncrementalDetokenizer
from minivllm.kv_cache import ContiguousAllocator
from minivllm.loader import load_hf_config, load_tokenizer, resolve_model_path
from minivllm.model_runner import ModelRunner
from minivllm.outputs import CompletionOutput, RequestMetrics, RequestOutput
from minivllm.sampling_params import SamplingParams
from minivllm.scheduler import Scheduler
from minivllm.sequence import Sequence, SequenceStatus

logger = logging.getLogger("minivllm")


@dataclass(slots=True)
class EngineStats:
    """A snapshot of the engine between steps."""

    num_running: int
    num_waiting: int
    num_swapped: int
    num_blocks_used: int
    num_blocks_total: int
    slots_reserved: int        # KV slots owned by running sequences (used blocks x block_size)
    tokens_cached: int         # tokens whose K/V those slots actually hold
    num_preemptions: int
    prefix_cache_queried_tokens: int = 0   # prompt tokens looked up at admission
    prefix_cache_hit_tokens: int = 0       # of those, found in the cache (not computed)

    @property
    def prefix_cache_hit_rate(self) -> float:
        q = self.prefix_cache_queried_tokens
        return self.prefix_cache_hit_tokens / q if q else 0.0

    @property
    def kv_utilization(self) -> float:
        """Share of reserved KV memory that holds real tokens."""
        return self.tokens_cached / self.slots_reserved if self.slots_reserved else 0.0


class LLMEngine:
    def __init__(self, model: str | None = None, dtype: str | torch.dtype = "auto",
                 device: str = "auto", max_model_len: int | None = None,
                 kv_layout: str = "paged", **engine_kwargs):
        if kv_layout not in ("paged", "contiguous"):
            raise ValueError(f"kv_layout must be 'paged' or 'contiguous', got {kv_layout!r}")
        t0 = time.perf_counter()
        self.model_path = resolve_model_path(model)
        self.model_config = ModelConfig.from_hf_dict(load_hf_config(self.model_path))
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype, self.device)
        limit = self.model_config.max_position_embeddings
        if max_model_len is not None and max_model_len > limit:
            raise ValueError(f"max_model_len={max_model_len} exceeds the model's "
                             f"max_position_embeddings ({limit})")
        self.config = EngineConfig(max_model_len=max_model_len or limit, **engine_kwargs)

        self.tokenizer = load_tokenizer(self.model_path)
        self.eos_token_ids = set(self.model_config.eos_token_id)
        if self.tokenizer.eos_token_id is not None:
            self.eos_token_ids.add(self.tokenizer.eos_token_id)

        if self.config.preemption_mode == "swap" and kv_layout != "paged":
            raise ValueError("preemption_mode='swap' moves KV blocks, which needs "
                             "kv_layout='paged'")
        self.runner = ModelRunner(self.model_config, self.config, self.model_path,
                                  self.device, self.dtype, kv_layout)
        if kv_layout == "paged":
            self.block_manager = BlockManager(self.runner.num_blocks, self.config.block_size,
                                              self.config.enable_prefix_caching)
        else:
            self.block_manager = ContiguousAllocator(self.runner.num_blocks,
                                                     self.config.max_model_len)
        self.cpu_block_manager = (BlockManager(self.runner.num_cpu_blocks, self.config.block_size)
                                  if self.runner.num_cpu_blocks else None)
        self.scheduler = Scheduler(self.config, self.block_manager, self.cpu_block_manager)
        self.requests: dict[str, list[Sequence]] = {}
        self._seq_ids = itertools.count()
        self.load_time = time.perf_counter() - t0

    def __repr__(self) -> str:
        device = (torch.cuda.get_device_name(self.device) if self.device.type == "cuda"
                  else "CPU")
        return (f"LLMEngine(model={self.model_config.architecture} from {self.model_path.name}, "
                f"device={device}, dtype={str(self.dtype).removeprefix('torch.')}, "
                f"kv={self.runner.kv_layout} {self.runner.num_blocks}x{self.runner.block_size}, "
                f"attention={self.runner.attention_backend})")

    # ---------------------------------------------------------------- requests in
    def add_request(self, request_id: str, prompt: str | list[int],
                    params: SamplingParams | None = None) -> None:
        params = params or SamplingParams()
        if request_id in self.requests:
            raise ValueError(f"request_id {request_id!r} is already in use")
        if isinstance(prompt, str):
            text, token_ids = prompt, self.tokenizer.encode(prompt, add_special_tokens=False)
        else:
            text, token_ids = None, [int(t) for t in prompt]
        self._validate_prompt(token_ids, params)
        seqs = []
        for i in range(params.n):          # sample i draws with seed + i
            seed = None if params.seed is None else params.seed + i
            seq = Sequence(next(self._seq_ids), request_id, text, token_ids, params, seed,
                           self.device)
            seq.detokenizer = IncrementalDetokenizer(self.tokenizer, params.skip_special_tokens,
                                                     start=len(token_ids))
            seqs.append(seq)
        parent, *forks = seqs
        parent.pending_forks = forks       # prefilled once, forked when the prompt is done
        for fork in forks:
            fork.parent = parent
        self.scheduler.add(parent)
        self.requests[request_id] = seqs

    def _validate_prompt(self, token_ids: list[int], params: SamplingParams) -> None:
        max_len = self.config.max_model_len
        if not token_ids:
            raise ValueError("the prompt is empty: give at least one token")
        if params.n > 1 and isinstance(self.block_manager, ContiguousAllocator):
            raise ValueError("parallel sampling (n > 1) shares the prompt's KV blocks, which "
                             "needs kv_layout='paged'; the contiguous baseline cannot share")
        if params.n > self.config.max_num_seqs:
            raise ValueError(f"n={params.n} samples exceed max_num_seqs "
                             f"({self.config.max_num_seqs})")
        if len(token_ids) >= max_len:
            raise ValueError(f"the prompt has {len(token_ids)} tokens, but max_model_len is "
                             f"{max_len}: prompt + at least one new token must fit")
        bad = [t for t in token_ids if not 0 <= t < self.model_config.vocab_size]
        if bad:
            raise ValueError(f"token id {bad[0]} is outside the vocabulary "
                             f"(size {self.model_config.vocab_size})")
        # The request alone, at its longest, must fit the KV pool, or it could never finish.
        longest = min(len(token_ids) + params.max_tokens, max_len)
        bm = self.block_manager
        need = cdiv(longest, bm.block_size)
        if need > bm.num_blocks:
            raise ValueError(
                f"the request needs up to {longest} tokens of KV cache ({need} blocks of "
                f"{bm.block_size}), but the pool has only {bm.num_blocks} blocks; lower "
                "max_tokens or give the engine more KV memory")

    def abort_request(self, request_id: str) -> None:
        for seq in self.requests.pop(request_id, []):
            if not seq.is_finished:
                self.scheduler.finish(seq, SequenceStatus.FINISHED_ABORTED)

    def prompt_logits(self, token_ids: list[int]) -> torch.Tensor:
        """Next-token logits at every position of `token_ids`, (len, vocab), float32."""
        seq = Sequence(-1, "score", None, token_ids, SamplingParams(), 0, self.device)
        if not self.block_manager.can_allocate(seq):
            raise RuntimeError(f"no free KV blocks to score {len(token_ids)} tokens right now")
        self.block_manager.allocate(seq, use_prefix_cache=False)   # every position computed
        try:
            return self.runner.prompt_logits(seq)
        finally:
            self.block_manager.free(seq)

    def stats(self) -> EngineStats:
        bm = self.block_manager
        used = bm.num_blocks - bm.num_free_blocks
        cache = getattr(bm, "prefix_cache", None)
        filled: dict[int, int] = {}        # block -> tokens it holds (shared blocks once)
        for s in self.scheduler.running:
            for i, block in enumerate(s.block_table):
                held = max(0, min(bm.block_size, s.num_computed_tokens - i * bm.block_size))
                filled[block] = max(filled.get(block, 0), held)
        return EngineStats(
            num_running=len(self.scheduler.running), num_waiting=len(self.scheduler.waiting),
            num_swapped=len(self.scheduler.swapped),
            num_blocks_used=used, num_blocks_total=bm.num_blocks,
            slots_reserved=used * bm.block_size, tokens_cached=sum(filled.values()),
            num_preemptions=self.scheduler.num_preemptions,
            prefix_cache_queried_tokens=cache.num_queried_tokens if cache else 0,
            prefix_cache_hit_tokens=cache.num_hit_tokens if cache else 0)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    # ---------------------------------------------------------------- one iteration
    # --8<-- [start:step]
    def step(self) -> list[RequestOutput]:
        batch = self.scheduler.schedule()
        if not batch.seqs:
            if self.has_unfinished_requests():     # admission checks make this unreachable
                raise RuntimeError(f"the scheduler found nothing to run: {self.stats()}")
            return []
        self.runner.swap_out(batch.blocks_to_swap_out)   # before their blocks are reused
        self.runner.swap_in(batch.blocks_to_swap_in)
        self.runner.copy_blocks(batch.blocks_to_copy)
        samples = self.runner.run(batch.seqs, batch.num_new_tokens)
        for seq, n in zip(batch.seqs, batch.num_new_tokens):
            seq.num_computed_tokens += n
            self.block_manager.cache_computed_blocks(seq)    # full blocks become reusable
        touched = {seq.request_id for seq in batch.seqs}
        for seq, _, _ in samples:      # forks first: they share the prompt's blocks
            if seq.parent is not None and seq.status is SequenceStatus.WAITING:
                self.scheduler.fork(seq.parent, seq)
        for seq, token_id, lp in samples:
            seq.append_token(token_id, lp)
            status = self._check_stop(seq)
            if status is not None:
                self.scheduler.finish(seq, status)
                seq.metrics.finished_time = time.perf_counter()
        outputs = [self._request_output(rid) for rid in touched if rid in self.requests]
        for out in outputs:
            if out.finished:
                del self.requests[out.request_id]
        return outputs
    # --8<-- [end:step]

    def _check_stop(self, seq: Sequence) -> SequenceStatus | None:
        """Detokenize seq's newest token, then decide whether seq is done."""
        params, token = seq.params, seq.token_ids[-1]
        stop_token = token in params.stop_token_ids or (not params.ignore_eos
                                                        and token in self.eos_token_ids)
        length = (seq.num_output_tokens >= params.max_tokens
                  or len(seq) >= self.config.max_model_len)
        new_text = seq.detokenizer.update(seq.token_ids, final=stop_token or length)
        seq.output_text = seq.detokenizer.text
        if stop_token:
            return SequenceStatus.FINISHED_STOPPED
        if params.stop and new_text and self._stop_string_hit(seq, new_text):
            return SequenceStatus.FINISHED_STOPPED
        if length:
            return SequenceStatus.FINISHED_LENGTH
        return None

    @staticmethod
    def _stop_string_hit(seq: Sequence, new_text: str) -> bool:
        """Did new_text complete a stop string? If so, cut the output text before it (or after
        it, with include_stop_str_in_output). Only the tail that new_text could have completed
        is searched: an earlier hit would have ended the sequence at an earlier step."""
        text, stops = seq.output_text, seq.params.stop
        start = max(0, len(text) - len(new_text) - max(map(len, stops)) + 1)
        hits = [(i, s) for s in stops if (i := text.find(s, start)) >= 0]
        if not hits:
            return False
        i, seq.stop_string = min(hits)
        keep = len(seq.stop_string) if seq.params.include_stop_str_in_output else 0
        seq.output_text = text[:i + keep]
        return True

    def _request_output(self, request_id: str) -> RequestOutput:
        seqs = self.requests[request_id]
        outputs = []
        for i, seq in enumerate(seqs):
            outputs.append(CompletionOutput(
                index=i, text=seq.output_text, token_ids=seq.output_token_ids,
                logprobs=seq.output_logprobs if seq.params.logprobs is not None else None,
                finish_reason=seq.status.value if seq.is_finished else None))
        first = seqs[0]
        m = first.metrics
        metrics = RequestMetrics(
            arrival_time=m.arrival_time,
            first_scheduled_time=min((s.metrics.first_scheduled_time for s in seqs
                                      if s.metrics.first_scheduled_time), default=None),
            first_token_time=m.first_token_time,
            finished_time=max((s.metrics.finished_time or 0 for s in seqs), default=None)
            if all(s.is_finished for s in seqs) else None)
        times = m.token_times
        return RequestOutput(
            request_id=request_id, prompt=first.prompt,
            prompt_token_ids=first.prompt_token_ids, outputs=outputs,
            finished=all(s.is_finished for s in seqs), metrics=metrics,
            inter_token_latencies=[b - a for a, b in zip(times, times[1:])])
