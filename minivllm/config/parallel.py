"""How many processes run the model, and what starts them (vLLM twin: vllm/config/parallel.py)."""

from __future__ import annotations

from dataclasses import dataclass

from minivllm.config.utils import check_choice, check_positive_ints

EXECUTOR_BACKENDS = (None, "uni", "mp", "ray")
DP_BALANCES = ("score", "round_robin", "prefix")     # minivllm/routing.py


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
    data_parallel_balance: str = "score"     # which replica a request goes to (DP_BALANCES)
    # Replicas across hosts (vLLM's flags): this host runs data_parallel_size_local of them
    # (None: all); the others are headless cores on other hosts (`minivllm serve --headless`),
    # which connect to data_parallel_address, replica r at data_parallel_rpc_port + 2r (and +1).
    data_parallel_size_local: int | None = None
    data_parallel_address: str = "127.0.0.1"
    data_parallel_rpc_port: int = 29550
    # The ranks of one replica across hosts (vLLM's flags): nnodes hosts, tp x pp / nnodes
    # ranks each; node 0 runs the engine and the last ranks (the driver samples there), the
    # others `minivllm serve --headless --node-rank k`, all meeting at master_addr:master_port.
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29501
    # The executor (minivllm/executor/): "uni", "mp" (a process a rank), "ray" (a Ray actor a
    # rank); None: "mp" if more than one rank.
    distributed_executor_backend: str | None = None

    def __post_init__(self):
        check_positive_ints(self, "tensor_parallel_size", "pipeline_parallel_size",
                            "data_parallel_size", "data_parallel_rpc_port")
        check_positive_ints(self, "nnodes", "master_port")
        check_choice(self, "data_parallel_balance", DP_BALANCES)
        if self.world_size % self.nnodes or self.node_rank != 0:
            raise ValueError(f"nnodes={self.nnodes} must divide tp x pp = {self.world_size}, "
                             f"and the engine runs on node 0 (the others: serve --headless "
                             f"--node-rank k), got node_rank={self.node_rank}")
        local = self.data_parallel_size_local
        if local is not None and not (isinstance(local, int)
                                      and 0 <= local <= self.data_parallel_size):
            raise ValueError(f"data_parallel_size_local must be 0..data_parallel_size "
                             f"({self.data_parallel_size}), got {local!r}")
        backend = self.distributed_executor_backend
        if backend not in EXECUTOR_BACKENDS or (backend == "uni" and self.world_size > 1):
            raise ValueError(f"distributed_executor_backend must be None, 'uni', 'mp' or "
                             f"'ray' ('uni' is one process: not tensor_parallel_size or "
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
