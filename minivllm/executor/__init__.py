"""Executors: how the engine core reaches its workers (vLLM twin: vllm/v1/executor/).

    abstract.py            Executor: the core's one handle on the devices (execute_model,
                           initialize_cache, free, collective_rpc), and which one an engine gets
    uniproc_executor.py    UniProcExecutor: one Worker in the core's process
    multiproc_executor.py  MultiprocExecutor: tensor parallelism, a Worker per rank, every rank
                           running the same step on the same messages

EngineCore -> Executor -> Worker (worker/worker.py) -> ModelRunner (worker/model_runner.py):
the scheduler lives in the core only, and every rank's worker is the same code.
"""
