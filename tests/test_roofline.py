"""The course's cost model (minivllm/benchmarks/roofline.py) against torch's own FLOP counter on a real
transformers forward, and the measured peaks of this device."""

import json

import torch
from torch.utils.flop_counter import FlopCounterMode

from minivllm.config import HfConfig
from minivllm.benchmarks.roofline import StepCost, measure_peaks


def test_step_flops_match_torch_flop_counter(tiny_checkpoint):
    path, model = tiny_checkpoint("llama")
    cost = StepCost.of(HfConfig.from_hf_dict(json.loads((path / "config.json").read_text())))
    # One token: attention over a context of one, so causal and full attention cost the same
    # and the counter (which counts SDPA's full square) must agree with the model exactly.
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(torch.tensor([[5]]))
    flops, moved = cost.step([1], [1], sampled=1)
    assert flops == counter.get_total_flops()
    assert moved > cost.weight_bytes == 4 * sum(p.numel() for n, p in model.named_parameters()
                                                if p.dim() == 2 and "embed" not in n)
    # Prefill is more intense than decode: P tokens of work for one read of the weights. (This
    # tiny model is mostly its 49152 x 64 embedding, so the gap is small; SmolLM2's is ~100x.)
    prefill = cost.step([256], [256], sampled=1)
    decode = cost.step([1] * 4, [256] * 4, sampled=4)
    assert prefill[0] / prefill[1] > 2 * decode[0] / decode[1]


def test_measured_peaks_are_a_roofline():
    peaks = measure_peaks("cpu", torch.float32, n=256, copy_mib=8, repeats=1)
    assert peaks.flops > 1e8 and peaks.bandwidth > 1e8
    assert peaks.bound(peaks.flops, 0) == 1.0 and peaks.bound(0, peaks.bandwidth) == 1.0
    assert peaks.ridge == peaks.flops / peaks.bandwidth
