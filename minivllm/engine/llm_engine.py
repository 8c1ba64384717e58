"""LLMEngine: the front end of the engine (vLLM twin: vllm/v1/engine/llm_engine.py).

One request's path, as in vLLM V1:

    add_request(id, prompt, params)    Processor: tokenize and check (engine/processor.py), then
                                       an EngineCoreRequest to the core through the client; n > 1
                                       fans out into n child requests of one sample each
                                       (engine/parallel_sampling.py, vLLM V1's ParentRequest)
    step()                             client.get_output(): one EngineCore.step (engine/core.py):
                                       schedule -> execute_model -> update_from_output
                                       -> OutputProcessor (engine/output_processor.py): text,
                                       stop strings (a stopped sample is finished in the core),
                                       a RequestOutput for every request that moved (one for
                                       a parent, its children's samples gathered in it)
    abort_request(id)                  the core finishes it (a parent: every child) and
                                       returns its blocks
    reconfigure(...)                   new settings (EngineArgs' fields) over the same weights
    trace()                            the core's StepRecords: what ran, how long, the engine after

LLM (minivllm/llm.py) is the offline front end on top: add everything, step until done. The
core's parts stay in reach for lessons and tests: `engine.engine_core` is the client, and
`engine.scheduler`, `.block_manager`, `.runner`, `.requests` name the core's own (there, an
n > 1 request is its children, "0_id" .. "{n-1}_id"; a lesson that wants vLLM V0's fork
inside the core adds an EngineCoreRequest with n > 1 to `engine.engine_core` itself).

Where the core runs (vLLM's `multiprocess_mode`, which its LLMEngine takes from the
environment variable VLLM_ENABLE_V1_MULTIPROCESSING), as `make_client` picks the client
(an EngineCoreClient: engine/core_client.py):

    LLMEngine(...)                          in this process (InprocClient): the default, so
                                            lessons can look inside; step() is one core step
    LLMEngine(..., multiprocess_mode=True)  in a process of its own (SyncMPClient, behind a
    or MINIVLLM_ENABLE_MULTIPROCESSING=1    busy loop): step() returns the outputs of the
                                            core's next step; the core's parts above are out
                                            of reach (a clear AttributeError), stats() is the
                                            core's last snapshot, trace() fills its list as
                                            the block ends. `minivllm serve` runs this way.

One request's fault stays that request's: an exception while sampling, detokenizing or
checking its stop conditions finishes it with finish_reason "abort" and the error in its
output, frees its blocks, and the other requests go on. (An exception in the forward pass
itself concerns the whole batch and is raised.)

Left out, compared with vLLM: multi-modal inputs, pooling models, pipeline parallelism, and
prefill/decode disaggregation over the process client (kv_transfer_config needs the core here).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable
from pathlib import Path

import torch

from minivllm.config import ModelConfig, VllmConfig
from minivllm.engine.arg_utils import LOAD_TIME_ARGS, EngineArgs
from minivllm.engine.core import EngineCore, EngineCoreRequest
from minivllm.engine.core_client import EngineCoreClient, InprocClient
from minivllm.engine.multiproc.client import SyncMPClient
from minivllm.engine.multiproc.dp_client import DPLBClient
from minivllm.engine.output_processor import OutputProcessor
from minivllm.engine.parallel_sampling import ParentRequest
from minivllm.engine.processor import encode_prompt, validate_request
from minivllm.engine.stats import EngineStats
from minivllm.models.loader import load_tokenizer
from minivllm.outputs import RequestOutput
from minivllm.sampling_params import SamplingParams
from minivllm.structured_output.manager import StructuredOutputManager

logger = logging.getLogger("minivllm")


def make_client(vllm_config: VllmConfig, tokenizer, multiprocess_mode: bool
                ) -> EngineCoreClient:
    """The front end's client (vLLM's EngineCoreClient.make_client): the core here
    (InprocClient, the weights loaded in this process), or in a process of its own
    (SyncMPClient), or one per data-parallel replica (DPLBClient)."""
    if not multiprocess_mode:
        return InprocClient(EngineCore.from_model(vllm_config, tokenizer))
    if vllm_config.parallel_config.data_parallel_size > 1:
        return DPLBClient(vllm_config)
    return SyncMPClient(vllm_config)


def multiprocessing_enabled() -> bool:
    """MINIVLLM_ENABLE_MULTIPROCESSING=1: the core in its own process unless told otherwise
    (vLLM's VLLM_ENABLE_V1_MULTIPROCESSING; off by default here, for the lessons' sake)."""
    return os.environ.get("MINIVLLM_ENABLE_MULTIPROCESSING", "0") not in ("0", "", "false")


class LLMEngine:
    def __init__(self, model: str | None = None, dtype: str | torch.dtype = "auto",
                 device: str = "auto", multiprocess_mode: bool | None = None,
                 **engine_kwargs):
        """engine_kwargs: EngineArgs' fields (vLLM's names). multiprocess_mode: run the
        EngineCore in a process of its own (None: as MINIVLLM_ENABLE_MULTIPROCESSING says, off
        unless set)."""
        EngineArgs.check_names(engine_kwargs, fixed=LOAD_TIME_ARGS)
        args = EngineArgs(model=model, dtype=dtype, device=device, **engine_kwargs)
        config = args.create_engine_config()
        # Kept for reconfigure, the checkpoint found: later configs need not look for it.
        self.engine_args = dataclasses.replace(args, model=config.model_config.model)
        self.tokenizer = load_tokenizer(Path(config.model_config.model))
        self.multiprocess_mode = (multiprocessing_enabled() if multiprocess_mode is None
                                  else bool(multiprocess_mode))
        dp = config.parallel_config.data_parallel_size
        if dp > 1 and multiprocess_mode is False:
            raise ValueError("data_parallel_size > 1 runs each replica's engine core in a "
                             "process of its own: not with multiprocess_mode=False")
        self.multiprocess_mode = self.multiprocess_mode or dp > 1
        if self.multiprocess_mode and config.kv_transfer_config is not None:
            raise ValueError("kv_transfer_config needs the engine core in this process: "
                             "use multiprocess_mode=False")
        self.engine_core = make_client(config, self.tokenizer, self.multiprocess_mode)
        # The front end's grammars: checked and compiled here, matched by the core.
        self.structured_output = StructuredOutputManager(
            self.tokenizer, config.model_config.hf_config.vocab_size,
            self.engine_core.info.eos_token_ids)
        self.eos_token_ids = self.engine_core.info.eos_token_ids
        self.output_processor = OutputProcessor(self.tokenizer)

    @classmethod
    def from_engine_args(cls, engine_args: EngineArgs, multiprocess_mode: bool | None = None
                         ) -> LLMEngine:
        """vLLM's constructor from an EngineArgs (LLMEngine(**kwargs) is the same engine)."""
        return cls(**dataclasses.asdict(engine_args), multiprocess_mode=multiprocess_mode)

    # The core's parts, for lessons and tests that look inside (vLLM: the in-process client's
    # llm_engine.engine_core.engine_core.scheduler, ...).
    @property
    def core(self) -> EngineCore:
        if self.multiprocess_mode:
            raise AttributeError(
                "the EngineCore (its scheduler, runner, block manager, requests, ...) runs in "
                f"its own process (pid {self.engine_core.pid}, multiprocess_mode=True), not in "
                "this one: build the engine with multiprocess_mode=False to look inside it")
        return self.engine_core.engine_core

    @property
    def model_executor(self):
        return self.core.model_executor

    @property
    def runner(self):
        """The driver worker's ModelRunner (rank 0's, under tensor parallelism)."""
        return self.core.model_executor.driver_worker.model_runner

    @property
    def vllm_config(self) -> VllmConfig:
        """The configuration the core runs now (engine_args made it; reconfigure replaces it)."""
        return self.engine_core.vllm_config

    @property
    def model_config(self) -> ModelConfig:
        return self.vllm_config.model_config

    @property
    def model_path(self) -> Path:
        return Path(self.vllm_config.model_config.model)

    @property
    def device(self) -> torch.device:
        return self.vllm_config.model_config.device

    @property
    def dtype(self) -> torch.dtype:
        return self.vllm_config.model_config.dtype

    @property
    def scheduler(self):
        return self.core.scheduler

    @property
    def block_manager(self):
        return self.core.scheduler.block_manager

    @property
    def requests(self):
        """The core's unfinished Requests, by id: an n > 1 request's children
        by theirs ("0_id" .. "{n-1}_id")."""
        return self.core.requests

    @property
    def last_scheduler_output(self):
        return self.core.last_scheduler_output

    @property
    def num_steps(self) -> int:
        return self.core.num_steps

    # --8<-- [start:reconfigure]
    def reconfigure(self, **changes) -> LLMEngine:
        """New engine settings over the weights already loaded: a fresh KV pool, block
        manager and scheduler (so a fresh prefix cache and fresh counters too).

        `changes` are EngineArgs fields but model, dtype and device (max_num_batched_tokens,
        max_num_seqs, block_size, num_kv_blocks, kv_cache_memory, enable_prefix_caching,
        preemption_mode, scheduling, kv_layout, ...); anything not named keeps its current
        value, and the new VllmConfig is checked as a fresh engine's is. Refused while requests
        are in flight: their blocks live in the pool being replaced.
        """
        in_flight = list(self.output_processor.request_states)
        if self.has_unfinished_requests():
            raise RuntimeError(
                f"cannot reconfigure with {len(in_flight)} request(s) in flight "
                f"({', '.join(in_flight[:5])}); let them finish or abort them first")
        EngineArgs.check_names(changes, fixed=LOAD_TIME_ARGS)
        args = dataclasses.replace(self.engine_args, **changes)
        config = args.create_engine_config(self.model_config.hf_config)
        dp = self.vllm_config.parallel_config.data_parallel_size
        if config.parallel_config.data_parallel_size != dp:
            raise ValueError(f"data_parallel_size is fixed when the engine starts (here {dp}): "
                             "start a new LLM for another size")
        self.engine_core.reconfigure(config)    # the old settings back if the new fail
        self.engine_args = args
        return self
    # --8<-- [end:reconfigure]

    def __repr__(self) -> str:
        device = (torch.cuda.get_device_name(self.device) if self.device.type == "cuda"
                  else "CPU")
        info = self.engine_core.info
        core = f", core in process {self.engine_core.pid}" if self.multiprocess_mode else ""
        architecture = self.model_config.hf_config.architecture
        return (f"LLMEngine(model={architecture} from {self.model_path.name}, "
                f"device={device}, dtype={str(self.dtype).removeprefix('torch.')}, "
                f"kv={info.kv_layout} {info.num_blocks}x{info.block_size}, "
                f"attention={info.attention_backend}{core})")

    # ---------------------------------------------------------------- requests in
    def add_request(self, request_id: str, prompt: str | list[int],
                    params: SamplingParams | None = None, lora_request=None,
                    grammar=None, kv_transfer_params: dict | None = None) -> None:
        """`grammar`: the guided-decoding constraint compiled beforehand (AsyncLLMEngine does
        it on a worker thread); None: compiled here, or found in the cache.

        n > 1 fans out here, as in vLLM V1: n child requests of one sample each, seeded
        seed + i, which the core runs like any others (the prompt's full blocks shared through
        the prefix cache); `step` gathers them back into one RequestOutput.
        `kv_transfer_params`: {"do_remote_decode": True} sends the prompt's K/V to the
        kv_consumer once its first token is sampled (DisaggLLM asks it)."""
        params = params or SamplingParams()
        if not isinstance(request_id, str) or not request_id:
            raise ValueError(f"request_id must be a non-empty string, got {request_id!r}")
        if isinstance(prompt, str):
            text = prompt
            token_ids = encode_prompt(self.tokenizer, prompt)
        else:
            text = None
            token_ids = list(prompt)
            bad = [t for t in token_ids if isinstance(t, bool) or not isinstance(t, int)]
            if bad:
                raise ValueError(f"prompt token ids must be integers, got {bad[0]!r}")
        config = self.vllm_config
        validate_request(token_ids, params, config, self.engine_core.info)  # n too, before
        parent = ParentRequest(request_id, params) if params.n > 1 else None  # its children
        for rid in [request_id, *(parent.child_request_ids if parent else ())]:
            if self.output_processor.in_use(rid):
                raise ValueError(f"request_id {rid!r} is already in use")
        grammar = self.structured_output.check(params, bool(config.speculative_config), grammar,
                                               serialized=self.multiprocess_mode)
        if lora_request is not None:         # checked and read now: a bad adapter fails alone
            self.engine_core.add_lora(lora_request)
        request = EngineCoreRequest(request_id, token_ids, params, lora_request, grammar,
                                    kv_transfer_params=kv_transfer_params)
        if parent is None:
            self.engine_core.add_request(request)
        else:                                  # V1's fan-out: n requests of one sample each
            for index in range(params.n):
                child_id, child_params = parent.get_child_info(index)
                self.engine_core.add_request(dataclasses.replace(
                    request, request_id=child_id, sampling_params=child_params))
        self.output_processor.add_request(request_id, text, token_ids, params,
                                          request.arrival_time, parent)

    def add_schedule_callback(self, callback: Callable[[], None]) -> None:
        """Call callback() each time a step has been scheduled, before its forward pass (the
        async engine refreshes its running/KV gauges there); with the core in its own
        process, as the news arrives, on the thread that reads the core's messages."""
        self.engine_core.add_schedule_callback(callback)

    def remove_schedule_callback(self, callback: Callable[[], None]) -> None:
        self.engine_core.remove_schedule_callback(callback)

    def abort_request(self, request_id: str) -> None:
        """Abort a request: a parent's every child (a child's id aborts its parent too)."""
        self.engine_core.abort_requests(self.output_processor.abort_requests([request_id]))

    def prompt_logits(self, token_ids: list[int]) -> torch.Tensor:
        """Next-token logits at every position of `token_ids`, (len, vocab), float32."""
        return self.engine_core.prompt_logits(token_ids)

    def stats(self, fresh: bool = False) -> EngineStats:
        """With the core in its own process, the snapshot it sent last (at most a message
        old), or with fresh=True its answer now, once it has applied every earlier message."""
        return self.engine_core.stats(fresh)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix, so the next request starts cold (vLLM's name); False,
        and nothing forgotten, while a request holds blocks."""
        return self.engine_core.reset_prefix_cache()

    def list_loras(self) -> set[int]:
        """The ids of the LoRA adapters now in the engine's slots (vLLM's name)."""
        return self.engine_core.list_loras()

    def has_unfinished_requests(self) -> bool:
        return (self.output_processor.has_unfinished_requests()
                or self.engine_core.has_unfinished_requests())

    def trace(self):
        """Record every step taken inside the block: `with engine.trace() as steps: ...`
        fills `steps` with one StepRecord per step (the core keeps them)."""
        return self.engine_core.trace()

    def wake(self) -> None:
        """A thread waiting in step() for the core's process returns now, with no outputs
        (AsyncLLMEngine: a command came in). Nothing to do with the core in this process."""
        self.engine_core.wake()

    def shutdown(self) -> None:
        """Stop the core's process and the executor's worker processes, if any (garbage
        collection and exit do it too)."""
        self.engine_core.shutdown()

    # ---------------------------------------------------------------- one iteration
    # --8<-- [start:step]
    def step(self) -> list[RequestOutput]:
        core_outputs = self.engine_core.get_output()       # one EngineCore.step
        processed = self.output_processor.process_outputs(core_outputs)
        if processed.stopped:                              # text reached a stop string
            self.engine_core.finish_stopped(processed.stopped)
        for request_id, error in processed.errors.items():     # this request alone fails
            logger.error("request %s failed and was aborted: %s", request_id, error)
        if processed.to_abort:                             # (a parent: all its children)
            self.engine_core.abort_requests(list(processed.to_abort), processed.to_abort)
        for out in processed.request_outputs:
            if out.error is not None and out.request_id not in processed.errors:
                logger.error("request %s failed and was aborted: %s", out.request_id, out.error)
        return processed.request_outputs
    # --8<-- [end:step]
