"""minivllm simulate: the engine's own scheduler at any scale, timed by a cost model.

    cost_model.py   model shapes, hardware profiles (data-sheet or fitted), seconds per step
    simulator.py    SimulatedExecutor, `engine_core` and `simulate`: the engine's own EngineCore
                    over an executor with no model, on a virtual clock
    disaggregated.py  prefill engines and decode engines, the KV handed over a timed link
    calibrate.py    fit this machine's profile from real engine steps
    cli.py          the `minivllm simulate` command: its flags, the summary table, plots, the
                    capacity search; run_both and validate, a real run beside its simulation

    from minivllm.simulator import simulate, synthetic_requests
    res = simulate(synthetic_requests(1000), model="Llama-3-70B", profile="H100",
                   tensor_parallel_size=8, max_num_seqs=256)   # pipeline_parallel_size=,
                                                              # data_parallel_size= too
    res.ttft, res.e2e, res.itl, res.goodput(SLO(ttft=2.0, itl=0.1))

No vLLM twin: vLLM has no simulator; Vidur (MLSys 2024) is the research answer.
"""

from minivllm.simulator.cost_model import (MODEL_SHAPES, PROFILES, HardwareProfile, StepTimer,
                                           get_profile, model_config)
from minivllm.simulator.disaggregated import simulate_disaggregated
from minivllm.simulator.simulator import (SLO, SimResult, SimulatedExecutor, engine_core, simulate,
                                          synthetic_requests)

__all__ = ["MODEL_SHAPES", "PROFILES", "HardwareProfile", "SLO", "SimResult", "engine_core",
           "SimulatedExecutor", "StepTimer", "get_profile", "model_config", "simulate",
           "simulate_disaggregated", "synthetic_requests"]
