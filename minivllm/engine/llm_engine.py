"""LLMEngine: the loop that turns requests into tokens, one iteration at a time (vLLM twin:
vllm/v1/engine/llm_engine.py with vllm/v1/engine/core.py's step folded in).

    add_request(...)   tokenize, validate, make a SequenceGroup, queue it
    step()             schedule -> execute_model -> update_from_output -> outputs: one owner
                       per phase; a RequestOutput for every request that made progress
    abort_request(id)  finish a request now and return its blocks
    reconfigure(...)   new EngineConfig values (token budget, pool size, ...) over the same
                       weights, checked exactly like a fresh engine's
    trace()            record a StepRecord per step (what ran, how long, the engine after)

LLM (minivllm/llm.py) is the offline front end on top: add everything, step until done.
Add-ons meet the step at named seams only: speculative decoding's `propose` before scheduling
(the other seams are inside the scheduler and the runner: minivllm/spec_decode/__init__.py),
and the KV connector (minivllm/distributed/kv_transfer/) through add_prefilled_request.

One request's fault stays that request's: an exception while sampling, detokenizing or
checking its stop conditions finishes it with finish_reason "abort" and the error in its
output, frees its blocks, and the other requests go on. (An exception in the forward pass
itself concerns the whole batch and is raised.)

Left out, compared with vLLM: the separate engine-core process (V1 runs the busy loop in its
own process and talks to the front end over ZMQ; minivllm's AsyncLLMEngine uses a thread),
multi-modal inputs, pooling models, and pipeline parallelism.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from collections.abc import Callable
from contextlib import contextmanager

import torch

from minivllm.core.block_manager import BlockManager
from minivllm.config import EngineConfig, ModelConfig, resolve_device, resolve_dtype
from minivllm.structured_output.manager import StructuredOutputManager
from minivllm.core.kv_cache import ContiguousAllocator
from minivllm.models.loader import load_hf_config, load_tokenizer, resolve_model_path
from minivllm.worker.model_runner import ModelRunner
from minivllm.engine.output_processor import OutputProcessor, request_output
from minivllm.outputs import RequestOutput
from minivllm.distributed.executor import MultiprocExecutor
from minivllm.engine.processor import encode_prompt, validate_request
from minivllm.sampling_params import SamplingParams
from minivllm.core.scheduler import Scheduler, SchedulerOutput
from minivllm.core.sequence import Sequence, SequenceGroup, SequenceStatus
from minivllm.sample.sampler import Sampler
from minivllm.spec_decode.decoder import SpeculativeDecoder
from minivllm.engine.stats import EngineStats, ScheduledSeq, StepRecord

logger = logging.getLogger("minivllm")


class LLMEngine:
    def __init__(self, model: str | None = None, dtype: str | torch.dtype = "auto",
                 device: str = "auto", **engine_kwargs):
        t0 = time.perf_counter()
        self.model_path = resolve_model_path(model)
        self.model_config = ModelConfig.from_hf_dict(load_hf_config(self.model_path))
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype, self.device)
        config = self._make_config(None, engine_kwargs)
        self.tokenizer = load_tokenizer(self.model_path)
        self.eos_token_ids = set(self.model_config.eos_token_id)
        if self.tokenizer.eos_token_id is not None:
            self.eos_token_ids.add(self.tokenizer.eos_token_id)
        self.structured_output = StructuredOutputManager(   # logits processors' engine state
            self.tokenizer, self.model_config.vocab_size, self.eos_token_ids)
        sampler = Sampler(self.device, self.eos_token_ids, self.structured_output)
        make_runner = (MultiprocExecutor.make_runner if config.tensor_parallel_size > 1
                       else ModelRunner)
        self.runner = make_runner(self.model_config, config, self.model_path, self.device,
                                  self.dtype, sampler=sampler)
        self.output_processor = OutputProcessor(self.tokenizer)
        self._seq_ids = itertools.count()
        self._traces: list[list[StepRecord]] = []
        self._init_state(config)
        self._schedule_callbacks: list[Callable[[], None]] = []   # see add_schedule_callback
        self.kv_connector = None             # prefill/decode disaggregation (kv_transfer/)
        if config.kv_transfer_config is not None:
            from minivllm.distributed.kv_transfer.kv_connector import KVConnector
            self.kv_connector = KVConnector(self)     # meets the other role, or refuses
        self.load_time = time.perf_counter() - t0

    def _make_config(self, base: EngineConfig | None, changes: dict) -> EngineConfig:
        """base (or the defaults) with `changes`, validated by EngineConfig like a fresh
        config, and against the model: max_model_len (None: the model's own limit) must be
        within max_position_embeddings."""
        names = {f.name for f in dataclasses.fields(EngineConfig)}
        unknown = sorted(set(changes) - names)
        if unknown:
            raise TypeError(f"unknown engine setting(s) {unknown}; the settings are "
                            f"{sorted(names)} (model, dtype and device need a new engine)")
        changes, limit = dict(changes), self.model_config.max_position_embeddings
        if changes.get("max_model_len", base.max_model_len if base else None) is None:
            changes["max_model_len"] = limit
        length = changes.get("max_model_len")
        if isinstance(length, int) and length > limit:
            raise ValueError(f"max_model_len={length} exceeds the model's "
                             f"max_position_embeddings ({limit})")
        return EngineConfig(**changes) if base is None else dataclasses.replace(base, **changes)

    def _init_state(self, config: EngineConfig) -> None:
        """The block managers, scheduler and request table for `config` (the pool is sized)."""
        self.config = config
        runner = self.runner
        if config.kv_layout == "paged":
            self.block_manager = BlockManager(runner.num_blocks, config.block_size,
                                              config.enable_prefix_caching)
        else:
            self.block_manager = ContiguousAllocator(runner.num_blocks, config.max_model_len)
        self.cpu_block_manager = (BlockManager(runner.num_cpu_blocks, config.block_size)
                                  if runner.num_cpu_blocks else None)
        self.scheduler = Scheduler(config, self.block_manager, self.cpu_block_manager,
                                   self.eos_token_ids, self._seq_ids)
        self.spec_decoder = (SpeculativeDecoder(config.speculative_config, runner)
                             if config.speculative_config else None)
        self.requests: dict[str, SequenceGroup] = {}
        self.num_steps = 0
        self.last_scheduler_output: SchedulerOutput | None = None

    # --8<-- [start:reconfigure]
    def reconfigure(self, **changes) -> LLMEngine:
        """New engine settings over the weights already loaded: a fresh KV pool, block
        manager and scheduler (so a fresh prefix cache and fresh counters too).

        `changes` are EngineConfig fields (max_num_batched_tokens, max_num_seqs, block_size,
        num_kv_blocks, kv_cache_memory, enable_prefix_caching, preemption_mode, scheduling,
        kv_layout, ...); anything not named keeps its current value. Refused while requests
        are in flight: their blocks live in the pool being replaced.
        """
        if self.has_unfinished_requests():
            raise RuntimeError(
                f"cannot reconfigure with {len(self.requests)} request(s) in flight "
                f"({', '.join(list(self.requests)[:5])}); let them finish or abort them first")
        config = self._make_config(self.config, changes)
        old = self.config
        try:
            self.runner.init_kv_cache(config)
            self._init_state(config)
        except Exception:                # e.g. a draft model that cannot serve: as before
            self.runner.init_kv_cache(old)
            self._init_state(old)
            raise
        return self
    # --8<-- [end:reconfigure]

    def __repr__(self) -> str:
        device = (torch.cuda.get_device_name(self.device) if self.device.type == "cuda"
                  else "CPU")
        return (f"LLMEngine(model={self.model_config.architecture} from {self.model_path.name}, "
                f"device={device}, dtype={str(self.dtype).removeprefix('torch.')}, "
                f"kv={self.runner.kv_layout} {self.runner.num_blocks}x{self.runner.block_size}, "
                f"attention={self.runner.attention_backend})")

    # ---------------------------------------------------------------- requests in
    def add_request(self, request_id: str, prompt: str | list[int],
                    params: SamplingParams | None = None, lora_request=None,
                    grammar=None) -> None:
        """`grammar`: the guided-decoding constraint compiled beforehand (AsyncLLMEngine does
        it on a worker thread); None: compiled here, or found in the cache."""
        params = params or SamplingParams()
        if not isinstance(request_id, str) or not request_id:
            raise ValueError(f"request_id must be a non-empty string, got {request_id!r}")
        if request_id in self.requests:
            raise ValueError(f"request_id {request_id!r} is already in use")
        if isinstance(prompt, str):
            text = prompt
            token_ids = encode_prompt(self.tokenizer, prompt)
        else:
            text = None
            token_ids = list(prompt)
            bad = [t for t in token_ids if isinstance(t, bool) or not isinstance(t, int)]
            if bad:
                raise ValueError(f"prompt token ids must be integers, got {bad[0]!r}")
        validate_request(token_ids, params, self.config, self.model_config, self.block_manager)
        grammar = self.structured_output.check(params, self.spec_decoder is not None, grammar)
        if lora_request is not None:         # checked and read now: a bad adapter fails alone
            if self.runner.lora_manager is None:
                raise ValueError(f"{lora_request} was given, but LoRA is off: start the engine "
                                 "with enable_lora=True (and max_loras, max_lora_rank)")
            self.runner.lora_manager.add_lora(lora_request)
        group = SequenceGroup(request_id, text, token_ids, params, next(self._seq_ids),
                              lora_request)
        group.grammar = grammar
        self.scheduler.add(group.seqs[0])
        self.requests[request_id] = group

    def add_prefilled_request(self, request_id: str, prompt_token_ids: list[int],
                              params: SamplingParams, first_token: int, load_kv,
                              first_logprobs: dict[int, float] | None = None) -> bool:
        """A request whose prompt another engine prefilled (minivllm/distributed/kv_transfer/):
        the scheduler admits it with its normal checks, load_kv(seq) writes the prompt's K/V,
        and it runs from its first token on, as if prefilled here. False, with nothing
        changed, when the pool or the batch has no room for it now."""
        if request_id in self.requests:
            raise ValueError(f"request_id {request_id!r} is already in use")
        validate_request(prompt_token_ids + [first_token], params, self.config,
                         self.model_config, self.block_manager)
        group = SequenceGroup(request_id, None, prompt_token_ids, params, next(self._seq_ids))
        seq = group.seqs[0]
        if not self.scheduler.add_prefilled(seq, load_kv, (first_token, first_logprobs)):
            return False
        self.output_processor.detokenize(seq)       # the first token's text
        self.requests[request_id] = group
        return True

    def add_schedule_callback(self, callback: Callable[[], None]) -> None:
        """Call callback() each time a step has been scheduled, before its forward pass (the
        async engine refreshes its running/KV gauges there)."""
        self._schedule_callbacks.append(callback)

    def remove_schedule_callback(self, callback: Callable[[], None]) -> None:
        self._schedule_callbacks.remove(callback)

    def abort_request(self, request_id: str) -> None:
        group = self.requests.pop(request_id, None)
        if group is not None:
            self.scheduler.finish_group(group, SequenceStatus.FINISHED_ABORTED)
            self.runner.free(self.scheduler.take_finished())

    def prompt_logits(self, token_ids: list[int]) -> torch.Tensor:
        """Next-token logits at every position of `token_ids`, (len, vocab), float32."""
        seq = SequenceGroup("score", None, token_ids, SamplingParams(), -1).seqs[0]
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
            prefix_cache_hit_tokens=cache.num_hit_tokens if cache else 0,
            **(self._spec_decode_stats() if self.spec_decoder else {}))

    def _spec_decode_stats(self) -> dict[str, int]:
        s = self.scheduler.spec_decoding_stats
        return {"spec_decode_num_drafts": s.num_drafts,
                "spec_decode_num_draft_tokens": s.num_draft_tokens,
                "spec_decode_num_accepted_tokens": s.num_accepted_tokens,
                "spec_decode_num_accepted_tokens_per_pos": tuple(s.num_accepted_tokens_per_pos),
                "spec_decode_num_judged_tokens_per_pos": tuple(s.num_judged_tokens_per_pos)}

    def list_loras(self) -> set[int]:
        """The ids of the LoRA adapters now in the engine's slots (vLLM's name)."""
        return set(self.runner.lora_manager.slots) if self.runner.lora_manager else set()

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests) or self.scheduler.has_unfinished()

    @contextmanager
    def trace(self):
        """Record every step taken inside the block: `with engine.trace() as steps: ...`
        fills `steps` with one StepRecord per step."""
        steps: list[StepRecord] = []
        self._traces.append(steps)
        try:
            yield steps
        finally:
            self._traces.remove(steps)

    # ---------------------------------------------------------------- one iteration
    # --8<-- [start:step]
    def step(self) -> list[RequestOutput]:
        t0 = time.perf_counter()
        if self.spec_decoder:                    # seam: draft tokens first (spec_decode/)
            self.spec_decoder.propose(self.scheduler.running)
        # 1. Schedule: which sequences run, how many tokens each, which blocks move.
        scheduler_output = self.scheduler.schedule()
        self.last_scheduler_output = scheduler_output
        for callback in self._schedule_callbacks:   # a long prefill shows as running meanwhile
            callback()
        # 2. Execute: block copies, one forward pass, the sampled tokens.
        runner_output = self.runner.execute_model(scheduler_output)
        if not scheduler_output.seqs:
            if self.scheduler.has_unfinished():      # admission checks make this unreachable
                raise RuntimeError(f"the scheduler found nothing to run: {self.stats()}")
            return []
        # 3. Update: append, fork, accept drafts, stop on tokens and length, free blocks.
        updated = self.scheduler.update_from_output(scheduler_output, runner_output)
        # 4. Outputs: text and stop strings, then a RequestOutput per request that moved.
        errors = self._detokenize(updated, dict(runner_output.errors))
        outputs = self._request_outputs(scheduler_output)
        self.runner.free(self.scheduler.take_finished())     # their sampling state goes too
        self.num_steps += 1
        if self._traces:
            self._record(scheduler_output, outputs, errors, t0)
        return outputs
    # --8<-- [end:step]

    def _detokenize(self, seqs: list[Sequence], errors: dict[str, str]) -> dict[str, str]:
        """Text for the sequences that got tokens; a stop string finishes its sequence. A
        failure here fails that request alone. Returns errors, with this phase's added."""
        for seq in seqs:
            if seq.group.error is not None:          # another sample of it failed just now
                continue
            try:
                if self.output_processor.detokenize(seq):
                    self.scheduler.finish_on_stop_string(seq)
            except Exception as e:                   # noqa: BLE001 (this request alone)
                errors[seq.request_id] = f"output processing failed: {e!r}"
                seq.group.error = errors[seq.request_id]
                self.scheduler.finish_group(seq.group, SequenceStatus.FINISHED_ABORTED)
        for request_id, error in errors.items():
            logger.error("request %s failed and was aborted: %s", request_id, error)
        return errors

    def _request_outputs(self, scheduler_output: SchedulerOutput) -> list[RequestOutput]:
        """A RequestOutput for every request that ran this step; finished ones leave."""
        touched = {seq.request_id for seq in scheduler_output.seqs}
        outputs = [request_output(self.requests[rid]) for rid in touched if rid in self.requests]
        for out in outputs:
            if out.finished:
                del self.requests[out.request_id]
        return outputs

    def _record(self, batch: SchedulerOutput, outputs: list[RequestOutput],
                errors: dict[str, str], t0: float) -> None:
        rids = lambda seqs: [s.request_id for s in seqs]  # noqa: E731
        record = StepRecord(
            step=self.num_steps - 1,
            scheduled=[ScheduledSeq(s.request_id, s.index, n, p, len(d), s.lora_int_id)
                       for s, n, p, d in
                       zip(batch.seqs, batch.num_new_tokens, batch.is_prefill,
                           batch.spec_token_ids)],
            preempted=rids(batch.preempted), swapped_out=rids(batch.swapped_out),
            swapped_in=rids(batch.swapped_in), num_blocks_copied=len(batch.blocks_to_copy),
            finished=[o.request_id for o in outputs if o.finished],
            duration=time.perf_counter() - t0, stats=self.stats(), start_time=t0, errors=errors,
            num_accepted_tokens=self.scheduler.spec_decoding_stats.num_accepted_this_step)
        for steps in self._traces:
            steps.append(record)
