"""UniProcExecutor: one Worker, in the engine core's own process (vLLM twin:
vllm/v1/executor/abstract.py's UniProcExecutor)."""

from __future__ import annotations

from minivllm.config import EngineConfig
from minivllm.executor.abstract import Executor
from minivllm.worker.worker import Worker


class UniProcExecutor(Executor):
    def __init__(self, model_config, config: EngineConfig, path, device, dtype, sampler=None):
        self.driver_worker = Worker(model_config, config, path, device, dtype, sampler=sampler)
        self.driver_worker.load_model()
        self.initialize_cache(config)

    def collective_rpc(self, method: str, *args):
        return getattr(self.driver_worker, method)(*args)
