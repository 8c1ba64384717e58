"""How a front end talks to its EngineCore (vLLM twin: vllm/v1/engine/core_client.py).

EngineCoreClient is the interface, and `make_client` (engine/llm_engine.py: it imports the
process clients, which import this module) picks one of three:

    InprocClient    the core in the same process, called directly: get_output() is one
                    EngineCore.step(). LLM and LLMEngine use it by default, so a lesson can step
                    the core and look inside it (client.engine_core.scheduler, ...).
    SyncMPClient    the core in a process of its own, behind a busy loop and ZMQ sockets
                    (engine/multiproc/: client.py, core_proc.py). `minivllm serve` uses it.
    DPLBClient      data parallelism: several cores, each in its own process, behind one front
                    end (engine/multiproc/dp_client.py), the same methods over SyncMPClients.

They have the same methods, and every message is plain data: EngineCoreRequest in,
EngineCoreOutputs out, request ids to abort or finish. What the front end asks of the core
besides (stats, reconfigure, LoRA adapters, prompt logits for scoring, traces) is a method of
the core that InprocClient forwards to; SyncMPClient sends its name and arguments as a utility
call (vLLM's `call_utility`), which the core's process answers by calling that very
InprocClient method.

Left out, compared with vLLM: AsyncMPClient (AsyncLLMEngine drives the sync client from its
engine thread).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

from minivllm.config import VllmConfig
from minivllm.core.request import RequestStatus
from minivllm.engine.core import EngineCore, EngineCoreInfo, EngineCoreRequest
from minivllm.engine.stats import EngineStats
from minivllm.outputs import EngineCoreOutput, EngineCoreOutputs


class EngineDeadError(RuntimeError):
    """The engine has stopped (its core process died, or its loop did); nothing more is
    served (vLLM twin: vllm/v1/engine/exceptions.py)."""


class EngineCoreClient(ABC):
    """How a front end reaches its core, wherever the core runs (vLLM's EngineCoreClient)."""

    vllm_config: VllmConfig      # the configuration the core runs now
    info: EngineCoreInfo         # what the front end knows of the core (engine/core.py)

    # ---------------------------------------------------------------- requests in, outputs out
    @abstractmethod
    def add_request(self, request: EngineCoreRequest) -> None:
        """Queue a tokenized, checked request in the core."""

    @abstractmethod
    def get_output(self) -> EngineCoreOutputs:
        """The outputs of the core's next step (in process: run that step now)."""

    @abstractmethod
    def abort_requests(self, request_ids, errors: dict[str, str] | None = None
                       ) -> list[EngineCoreOutput]:
        """Finish these requests now (finish_reason "abort", with the error if given)."""

    @abstractmethod
    def finish_stopped(self, request_ids: list[str]) -> None:
        """These requests' text reached a stop string: they finish with finish_reason "stop"."""

    @abstractmethod
    def has_unfinished_requests(self) -> bool:
        """Has the core requests it has not finished?"""

    @abstractmethod
    def wake(self) -> None:
        """Wake a thread waiting in get_output (a request was added or aborted)."""

    @abstractmethod
    def shutdown(self) -> None:
        """Stop the core and its workers."""

    # ---------------------------------------------------------------- utility calls
    @abstractmethod
    def stats(self, fresh: bool = False) -> EngineStats:
        """The core's stats (fresh: asked of the core now, not the last step's)."""

    @abstractmethod
    def reconfigure(self, vllm_config: VllmConfig) -> EngineCoreInfo:
        """A fresh KV pool, block manager and scheduler for `vllm_config`, same weights."""

    @abstractmethod
    def add_lora(self, lora_request) -> None:
        """Load a LoRA adapter now (it fails alone, before its request is queued)."""

    @abstractmethod
    def list_loras(self) -> set[int]:
        """The ids of the adapters loaded."""

    @abstractmethod
    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix; False if blocks are in use."""

    @abstractmethod
    def prompt_logits(self, token_ids: list[int]):
        """Next-token logits at every position of token_ids, (len, vocab)."""

    @abstractmethod
    def trace(self):
        """`with client.trace() as steps`: the core's StepRecords, appended as steps run."""

    @abstractmethod
    def add_schedule_callback(self, callback: Callable[[], None]) -> None:
        """Call `callback` after each schedule (a long prefill shows as running meanwhile)."""

    @abstractmethod
    def remove_schedule_callback(self, callback: Callable[[], None]) -> None:
        """Stop calling it."""


class InprocClient(EngineCoreClient):
    def __init__(self, engine_core: EngineCore):
        self.engine_core = engine_core

    # ---------------------------------------------------------------- requests in, outputs out
    def add_request(self, request: EngineCoreRequest) -> None:
        self.engine_core.add_request(request)

    def get_output(self) -> EngineCoreOutputs:
        outputs = self.engine_core.step()
        outputs.kv_events = self.engine_core.take_kv_events()   # what it cached, if asked
        return outputs

    def abort_requests(self, request_ids, errors: dict[str, str] | None = None
                       ) -> list[EngineCoreOutput]:
        return self.engine_core.abort_requests(request_ids, errors)

    def finish_stopped(self, request_ids: list[str]) -> None:
        self.engine_core.finish_requests(request_ids, RequestStatus.FINISHED_STOPPED)

    def has_unfinished_requests(self) -> bool:
        return self.engine_core.has_unfinished_requests()

    def wake(self) -> None:
        """Nothing waits here: get_output is a step, run on the caller's thread."""

    def shutdown(self) -> None:
        """The core lives and goes with this process; its executor's workers, if it has
        other ranks, stop now."""
        self.engine_core.model_executor.shutdown()

    # ---------------------------------------------------------------- utility calls
    # Each forwards to the core, as the process client sends it (engine/multiproc/).
    @property
    def vllm_config(self) -> VllmConfig:
        return self.engine_core.vllm_config

    @property
    def info(self) -> EngineCoreInfo:
        return self.engine_core.info()

    def stats(self, fresh: bool = False) -> EngineStats:
        """The core's stats now (fresh or not: the core is here)."""
        return self.engine_core.stats()

    def reconfigure(self, config: VllmConfig) -> EngineCoreInfo:
        """A fresh KV pool, block manager and scheduler for `config` over the same weights; the
        old ones back if the new ones cannot be built."""
        core = self.engine_core
        old = core.vllm_config
        try:
            core.model_executor.initialize_cache(config)
            core.init_state(config)
        except Exception:                # e.g. a draft model that cannot serve: as before
            core.model_executor.initialize_cache(old)
            core.init_state(old)
            raise
        return self.info

    def add_lora(self, lora_request) -> None:
        self.engine_core.add_lora(lora_request)

    def reset_prefix_cache(self) -> bool:
        return self.engine_core.reset_prefix_cache()

    def list_loras(self) -> set[int]:
        return self.engine_core.list_loras()

    def prompt_logits(self, token_ids: list[int]):
        return self.engine_core.prompt_logits(token_ids)

    def trace(self):
        return self.engine_core.trace()

    def add_schedule_callback(self, callback: Callable[[], None]) -> None:
        self.engine_core.schedule_callbacks.append(callback)

    def remove_schedule_callback(self, callback: Callable[[], None]) -> None:
        self.engine_core.schedule_callbacks.remove(callback)
