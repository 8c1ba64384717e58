"""RayDistributedExecutor: MultiprocExecutor's ranks as Ray actors (vLLM twin:
vllm/v1/executor/ray_distributed_executor.py).

`LLM(..., distributed_executor_backend="ray")` with tensor or pipeline parallelism. Ray places
each rank but the driver as an actor (on any node of the cluster `ray.init` joins: the one
RAY_ADDRESS names, else a local one it starts), and the rest is MultiprocExecutor's design:
the driver, tensor rank 0 of the last stage, runs in the engine core's process; every rank
joins the same process groups over a TCPStore the driver serves; `collective_rpc` calls the
same Worker method on every actor (a Ray method call each: an actor runs its calls in order)
and then on the driver; a step can be started on the actors and finished on the driver later
(pipeline parallelism's steps in flight).

Ray is an optional extra: `uv sync --extra ray`. Without it, this executor says so.

Left out, compared with vLLM: placement groups (which node and GPU each rank gets), the
compiled DAG that moves a step's tensors between actors, and Ray's own worker health checks
(a dead actor surfaces as the next call's error).
"""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist

from minivllm.config import VllmConfig
from minivllm.distributed.layers import weight_bytes
from minivllm.distributed.parallel_state import check_tensor_parallel, init_groups
from minivllm.distributed.pipeline import check_pipeline_parallel
from minivllm.executor.abstract import Executor
from minivllm.executor.multiproc_executor import START_TIMEOUT, PendingStep
from minivllm.worker.worker import Worker

RAY_EXTRA = ("distributed_executor_backend='ray' needs Ray, an optional extra: run `uv sync "
             "--extra ray` (or pip install ray)")


class RayWorker:
    """One rank, inside a Ray actor: joins the groups, loads its shard, runs what it is sent."""

    def __init__(self, rank: int, tp: int, pp: int, host: str, port: int, backend: str,
                 vllm_config: VllmConfig, num_threads: int):
        torch.set_num_threads(num_threads)
        self.where = rank, tp, pp, host, port, backend
        self.vllm_config = vllm_config
        self.worker = None

    def start(self) -> dict[str, int]:
        """The rendezvous (the driver joins it meanwhile), then the weights: their bytes."""
        rank, tp, pp, host, port, backend = self.where
        store = dist.TCPStore(host, port, tp * pp, False,
                              timeout=datetime.timedelta(seconds=START_TIMEOUT))
        tp_group, pp_group = init_groups(rank, tp, pp, store, backend)
        device = torch.device("cuda", 0) if backend == "nccl" else torch.device("cpu")
        with torch.inference_mode():
            self.worker = Worker(self.vllm_config, device=device, tp=tp_group, pp=pp_group)
            self.worker.load_model()
        return weight_bytes(self.worker.model_runner.model)

    def execute_method(self, method: str, *args) -> None:
        with torch.inference_mode():
            getattr(self.worker, method)(*args)


class RayDistributedExecutor(Executor):
    def __init__(self, vllm_config: VllmConfig, sampler=None):
        try:
            import ray
        except ImportError:
            raise ImportError(RAY_EXTRA) from None
        self.ray = ray
        parallel = vllm_config.parallel_config
        tp, pp, n = (parallel.tensor_parallel_size, parallel.pipeline_parallel_size,
                     parallel.world_size)
        self.driver_rank = n - tp                # vLLM's output rank, as MultiprocExecutor's
        self.max_concurrent_batches = pp
        device = vllm_config.model_config.device
        check_tensor_parallel(vllm_config.model_config.hf_config, tp)
        check_pipeline_parallel(vllm_config.model_config.hf_config, pp)
        if not ray.is_initialized():
            ray.init(address=os.environ.get("RAY_ADDRESS"), include_dashboard=False,
                     log_to_driver=False)
        backend = "nccl" if device.type == "cuda" else "gloo"
        host = ray.util.get_node_ip_address()     # where actors on other nodes find the store
        self.store = dist.TCPStore(host, 0, n, True, wait_for_workers=False,
                                   timeout=datetime.timedelta(seconds=START_TIMEOUT))
        actor = ray.remote(num_cpus=0, num_gpus=1 if device.type == "cuda" else 0)(RayWorker)
        threads = max(1, torch.get_num_threads() // n)
        self.workers = [actor.remote(rank, tp, pp, host, self.store.port, backend, vllm_config,
                                     threads)
                        for rank in range(n) if rank != self.driver_rank]
        try:
            started = [w.start.remote() for w in self.workers]
            tp_group, pp_group = init_groups(self.driver_rank, tp, pp, self.store, backend)
            self.driver_worker = Worker(
                vllm_config, tp=tp_group, sampler=sampler, pp=pp_group,
                device=torch.device("cuda", self.driver_rank) if device.type == "cuda" else None)
            self.driver_worker.load_model()
            self.rank_weight_bytes = self._get(started)
            self.rank_weight_bytes.insert(self.driver_rank,
                                          weight_bytes(self.driver_worker.model_runner.model))
            self.initialize_cache(vllm_config)
        except BaseException:
            self.shutdown()
            raise

    def _get(self, refs: list):
        try:
            return self.ray.get(refs, timeout=START_TIMEOUT)
        except self.ray.exceptions.RayError as e:
            raise RuntimeError(f"a Ray worker failed: {e}") from e

    def _send(self, method: str, args: tuple) -> list:
        sent = (args[0].for_workers(),) if method == "execute_model" else args
        return [w.execute_method.remote(method, *sent) for w in self.workers]

    def collective_rpc(self, method: str, *args):
        refs = self._send(method, args)
        result = getattr(self.driver_worker, method)(*args)
        self._get(refs)                          # an actor's error is the caller's
        return result

    def execute_model(self, scheduler_output, non_block: bool = False):
        refs = self._send("execute_model", (scheduler_output,))

        def finish():
            output = self.driver_worker.execute_model(scheduler_output)
            self._get(refs)
            return output
        return PendingStep(finish) if non_block else finish()

    def shutdown(self) -> None:
        for w in getattr(self, "workers", []):
            self.ray.kill(w)
        self.workers = []
