"""How many processes run the model, and what starts them (vLLM twin: vllm/config/parallel.py)."""

from __future__ import annotations

from dataclasses import dataclass

from minivllm.config.utils import check_positive_ints

EXECUTOR_BACKENDS = (None, "uni", "mp")


@dataclass(slots=True)
class ParallelConfig:
    # Tensor parallelism (minivllm/distributed/): each layer split across this many processes.
    tensor_parallel_size: int = 1
    # Pipeline parallelism (distributed/pipeline.py): the layers split into this many stages,
    # each stage tensor_parallel_size processes.
    pipeline_parallel_size: int = 1
    # Data parallelism (engine/multiproc/dp_client.py): this many replicas of the whole engine
    # (each tp x pp ranks), each an engine core in its own process, behind one front end.
    data_parallel_size: int = 1
    # The executor (minivllm/executor/): "uni", "mp" (a process a rank); None: "mp" if more
    # than one rank.
    distributed_executor_backend: str | None = None

    def __post_init__(self):
        check_positive_ints(self, "tensor_parallel_size", "pipeline_parallel_size",
                            "data_parallel_size")
        backend = self.distributed_executor_backend
        if backend not in EXECUTOR_BACKENDS or (backend == "uni" and self.world_size > 1):
            raise ValueError(f"distributed_executor_backend must be None, 'uni' or 'mp' ('uni' "
                             f"is one process: not tensor_parallel_size or "
                             f"pipeline_parallel_size > 1), got {backend!r}")

    @property
    def world_size(self) -> int:
        """Processes that run one replica of the model: tp x pp (vLLM's name)."""
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def executor_backend(self) -> str:
        """The backend in use: the one named, else "mp" with more than one rank (vLLM's
        default too)."""
        if self.distributed_executor_backend is not None:
            return self.distributed_executor_backend
        return "mp" if self.world_size > 1 else "uni"
