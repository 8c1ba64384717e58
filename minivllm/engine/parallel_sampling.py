"""Parallel sampling (n > 1) as vLLM V1 does it: fanned out at the front end into n child
requests (vLLM twin: vllm/v1/engine/parallel_sampling.py, ParentRequest).

    LLMEngine.add_request("r", prompt, n=3)
        -> EngineCoreRequest "0_r" (n=1, seed s)      each child is an ordinary request: the
           EngineCoreRequest "1_r" (n=1, seed s + 1)  core schedules it like any other, and
           EngineCoreRequest "2_r" (n=1, seed s + 2)  the prefix cache lets them share the
                                                      prompt's full blocks (lesson 05)
    OutputProcessor: child "i_r"'s tokens are sample i of "r": ONE RequestOutput for "r",
        with a CompletionOutput per sample (index 0..n-1), as if one request had made them

A seeded child i is seeded `seed + i`, which is exactly how the sampler seeds sample i of a
request (minivllm/sample/sampler.py): a seeded n > 1 request draws the same tokens fanned out
as forked. Aborting the parent aborts every child; a stop string ends its own child only.

vLLM V0 forked the n samples inside the core instead, after one prefill, sharing the prompt's
blocks by reference count and copy-on-write (Request.fork, BlockManager.fork). The core
keeps that path: an EngineCoreRequest with n > 1, built and added directly (lesson 02 shows it
beside this one; beam search forks on it). The front end no longer sends one.

Left out, compared with vLLM: the delta / final-only output kinds (here every RequestOutput
is cumulative and holds every sample that has begun).
"""

from __future__ import annotations

import dataclasses

from minivllm.sampling_params import SamplingParams


class ParentRequest:
    """An n > 1 request as the front end keeps it: its id, its params, its children's ids."""

    def __init__(self, request_id: str, sampling_params: SamplingParams):
        self.request_id = request_id
        self.sampling_params = sampling_params
        # Child i's request id, vLLM's naming: "0_id", "1_id", ...
        self.child_request_ids = [f"{i}_{request_id}" for i in range(sampling_params.n)]

    def child_sampling_params(self, index: int) -> SamplingParams:
        """One sample (n=1); seeded seed + index, the seed the sampler gives sample `index`."""
        seed = self.sampling_params.seed
        return dataclasses.replace(self.sampling_params, n=1,
                                   seed=None if seed is None else seed + index)

    def get_child_info(self, index: int) -> tuple[str, SamplingParams]:
        """(child request id, its SamplingParams) of sample `index` (vLLM's name)."""
        return self.child_request_ids[index], self.child_sampling_params(index)
