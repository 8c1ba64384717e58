"""How many processes run the model, and what starts them (vLLM twin: vllm/config/parallel.py)."""

from __future__ import annotations

from dataclasses import dataclass

from minivllm.config.utils import check_positive_ints

EXECUTOR_BACKENDS = (None, "uni", "mp")


@dataclass(slots=True)
class ParallelConfig:
    # Tensor parallelism (minivllm/distributed/): the model split across this many processes.
    tensor_parallel_size: int = 1
    # The executor (minivllm/executor/): "uni", "mp" (a process a rank); None: "mp" if tp > 1.
    distributed_executor_backend: str | None = None

    def __post_init__(self):
        check_positive_ints(self, "tensor_parallel_size")
        backend = self.distributed_executor_backend
        if backend not in EXECUTOR_BACKENDS or (backend == "uni" and self.tensor_parallel_size > 1):
            raise ValueError(f"distributed_executor_backend must be None, 'uni' or 'mp' ('uni' "
                             f"is one process: not tensor_parallel_size > 1), got {backend!r}")

    @property
    def executor_backend(self) -> str:
        """The backend in use: the one named, else "mp" with tp > 1 (vLLM's default too)."""
        if self.distributed_executor_backend is not None:
            return self.distributed_executor_backend
        return "mp" if self.tensor_parallel_size > 1 else "uni"
