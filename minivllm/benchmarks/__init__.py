"""Every `minivllm bench X` (vLLM twin: vllm/benchmarks/), and the workloads they share."""
