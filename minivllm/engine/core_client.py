"""How a front end talks to its EngineCore (vLLM twin: vllm/v1/engine/core_client.py).

    InprocClient    the core in the same process, called directly: get_output() is one
                    EngineCore.step(). LLM and LLMEngine use it, so a lesson can step the core
                    and look inside it (client.engine_core.scheduler, .block_manager, ...).

Every message is plain data: EngineCoreRequest in, EngineCoreOutputs out, request ids to abort
or finish. That is what lets vLLM put the core in a process of its own behind the same methods
(SyncMPClient / AsyncMPClient, a busy loop and ZMQ sockets), so that tokenizing, detokenizing
and HTTP in the front end's Python no longer hold up the GPU's next step.

Left out, compared with vLLM: the multiprocess clients (the core in its own process) and the
data-parallel client that balances several cores.
"""

from __future__ import annotations

from minivllm.core.sequence import SequenceStatus
from minivllm.engine.core import EngineCore, EngineCoreRequest
from minivllm.outputs import EngineCoreOutput, EngineCoreOutputs


class InprocClient:
    def __init__(self, engine_core: EngineCore):
        self.engine_core = engine_core

    def add_request(self, request: EngineCoreRequest) -> None:
        self.engine_core.add_request(request)

    def get_output(self) -> EngineCoreOutputs:
        return self.engine_core.step()

    def abort_requests(self, request_ids, errors: dict[str, str] | None = None
                       ) -> list[EngineCoreOutput]:
        return self.engine_core.abort_requests(request_ids, errors)

    def finish_stopped(self, samples: list[tuple[str, int]]) -> None:
        """These samples' text reached a stop string: they finish with finish_reason "stop"."""
        for request_id, index in samples:
            self.engine_core.finish_requests([request_id], SequenceStatus.FINISHED_STOPPED,
                                             index)

    def has_unfinished_requests(self) -> bool:
        return self.engine_core.has_unfinished_requests()
