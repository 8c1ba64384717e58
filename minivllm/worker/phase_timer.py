"""Where a step's time goes on the worker, phase by phase (issue 65: the host's share of a
step). No vLLM twin: vLLM leaves this to its profiler.

    timer = PhaseTimer(device)
    ...                                  # update the runner's state, build the inputs
    timer.lap("prepare")                 # seconds since the last lap, added up by name
    ...                                  # the forward
    timer.lap("forward", device=True)    # on CUDA: once the device has finished it

On CUDA the forward only queues its kernels (or replays a graph) and returns; the lap waits
for the device, so "forward" is the time until the device is done with it, and every other
phase is the host's alone. The sampler waits for the same results a moment later anyway. On a
CPU the cores run the forward as it is called: its lap is its time, Python's dispatch of each
op included. A step's host share is its duration less "forward" (StepRecord.host_time).
"""

from __future__ import annotations

import time

import torch


class PhaseTimer:
    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.times: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, phase: str, device: bool = False) -> None:
        if device and self.cuda:
            torch.cuda.synchronize()
        now = time.perf_counter()
        self.times[phase] = self.times.get(phase, 0.0) + now - self._last
        self._last = now
