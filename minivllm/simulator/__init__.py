"""minivllm simulate: the engine's own scheduler at any scale, timed by a cost model.

    cost_model.py   model shapes, hardware profiles (data-sheet or fitted), seconds per step
    simulator.py    SimulatedRunner and `simulate`: Scheduler + BlockManager on a virtual clock
    calibrate.py    fit this machine's profile from real engine steps; compare with a real run
    (the `minivllm simulate` command's flags, table and plots: minivllm/benchmarks/simulate.py)

    from minivllm.simulator import simulate, synthetic_requests
    res = simulate(synthetic_requests(1000), model="Llama-3-70B", profile="H100",
                   tensor_parallel_size=8, max_num_seqs=256)
    print(res.summary())

No vLLM twin: vLLM has no simulator; Vidur (MLSys 2024) is the research answer.
"""

from minivllm.simulator.cost_model import (MODEL_SHAPES, PROFILES, HardwareProfile, StepTimer,
                                           get_profile, model_config)
from minivllm.simulator.simulator import (SLO, SimResult, SimulatedRunner, capacity, simulate,
                                          synthetic_requests)

__all__ = ["MODEL_SHAPES", "PROFILES", "HardwareProfile", "SLO", "SimResult", "SimulatedRunner",
           "StepTimer", "capacity", "get_profile", "model_config", "simulate", "synthetic_requests"]
