"""UniProcExecutor: one Worker, in the engine core's own process (vLLM twin:
vllm/v1/executor/abstract.py's UniProcExecutor)."""

from __future__ import annotations

from minivllm.config import VllmConfig
from minivllm.executor.abstract import Executor
from minivllm.worker.worker import Worker


class UniProcExecutor(Executor):
    def __init__(self, vllm_config: VllmConfig, sampler=None):
        self.driver_worker = Worker(vllm_config, sampler=sampler)
        self.driver_worker.load_model()
        self.initialize_cache(vllm_config)

    def collective_rpc(self, method: str, *args):
        return getattr(self.driver_worker, method)(*args)
