"""UniProcExecutor: one Worker, in the engine core's own process (vLLM twin:
vllm/v1/executor/abstract.py's UniProcExecutor).

Async scheduling (core/async_scheduler.py): two steps may be in flight, and
`execute_model(so, non_block=True)` runs the step on a thread of its own and returns its
future, so the core schedules the next step meanwhile. On CUDA that thread mostly waits for
the device; on a CPU the forward and the core share the cores (docs/benchmarks.md measures it).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from minivllm.config import VllmConfig
from minivllm.executor.abstract import Executor
from minivllm.platforms import release_openmp_threads
from minivllm.worker.worker import Worker


class UniProcExecutor(Executor):
    def __init__(self, vllm_config: VllmConfig, sampler=None):
        self.step_thread: ThreadPoolExecutor | None = None     # async scheduling's
        self.driver_worker = Worker(vllm_config, sampler=sampler)
        self.driver_worker.load_model()
        self.initialize_cache(vllm_config)

    @property
    def max_concurrent_batches(self) -> int:
        """Two under async scheduling (the config the worker holds now), else one."""
        return 2 if self.driver_worker.vllm_config.scheduler_config.async_scheduling else 1

    def collective_rpc(self, method: str, *args):
        return getattr(self.driver_worker, method)(*args)

    def execute_model(self, scheduler_output, non_block: bool = False):
        if not non_block:
            return super().execute_model(scheduler_output)
        if self.step_thread is None:
            release_openmp_threads()         # one OpenMP team: the step thread's
            self.step_thread = ThreadPoolExecutor(1, thread_name_prefix="minivllm-step")
        return self.step_thread.submit(self.driver_worker.execute_model, scheduler_output)

    def shutdown(self) -> None:
        if self.step_thread is not None:
            self.step_thread.shutdown()
