"""Executors: how the engine core reaches its workers (vLLM twin: vllm/v1/executor/).

    abstract.py            Executor: the core's one handle on the devices (execute_model,
                           initialize_cache, free, collective_rpc); `executor_class` below
                           says which one an engine gets
    uniproc_executor.py    UniProcExecutor: one Worker in the core's process
    multiproc_executor.py  MultiprocExecutor: tensor and pipeline parallelism, a Worker per
                           rank, every rank running the same step on the same messages
    ray_executor.py        RayDistributedExecutor: the same ranks as Ray actors (an optional
                           extra: `uv sync --extra ray`)

EngineCore -> Executor -> Worker (worker/worker.py) -> ModelRunner (worker/model_runner.py):
the scheduler lives in the core only, and every rank's worker is the same code.
"""


def executor_class(parallel_config):
    """"uni" (one process) unless the model is split: "mp" (a process a rank) or "ray" (a Ray
    actor a rank); the ParallelConfig refused "uni" with more than one rank (vLLM:
    Executor.get_class)."""
    if parallel_config.executor_backend == "uni":
        from minivllm.executor.uniproc_executor import UniProcExecutor
        return UniProcExecutor
    if parallel_config.executor_backend == "ray":
        from minivllm.executor.ray_executor import RayDistributedExecutor
        return RayDistributedExecutor
    from minivllm.executor.multiproc_executor import MultiprocExecutor
    return MultiprocExecutor
