"""The workloads and the serving driver, where lessons and scripts import them from:
`from minivllm.workloads import lognormal_requests, serve`. They live in
minivllm/benchmarks/workloads.py, beside the benchmarks that share them.

vLLM twin: none. This is a re-export only, a short path for the lessons; the workloads' twin
is vllm/benchmarks/datasets.py."""

from minivllm.benchmarks.workloads import (FILLER, Request, ServeResult, bimodal_requests,
                                           conversation_requests, mixed_requests,
                                           lognormal_requests, poisson_arrivals,
                                           shared_prefix_requests, spread_requests,
                                           tool_catalog_prompt, serve)

__all__ = ["FILLER", "Request", "ServeResult", "bimodal_requests", "conversation_requests",
           "lognormal_requests", "mixed_requests", "poisson_arrivals", "serve", "shared_prefix_requests",
           "spread_requests", "tool_catalog_prompt"]
