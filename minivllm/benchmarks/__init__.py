"""Every `minivllm bench NAME` (vLLM twin: vllm/benchmarks/), and the workloads they share.

    main.py            the table of benchmarks the CLI walks (name -> module, shared flags)
    serve.py           serve: open-loop load on an OpenAI-compatible server (vllm bench serve)
    throughput.py      throughput: a mixed workload, minivllm vs transformers (bench throughput)
    latency.py         decode: one batch's decode tokens/s vs transformers (bench latency)
    prefix_caching.py  prefix: caching on vs off
    load.py            load: the packaged model's load time, first and cached
    spec.py tp.py compile.py guided.py quant.py lora.py disagg.py   one add-on each, on vs off
    ablation.py        the ablation ladder: each core mechanism switched off in turn
    cpu.py gpu.py      the engine at one device's limit (gpu: CUDA; also kernels/bench.py)
    workloads.py       seeded request generators and `serve`, the driver lessons and tests share
    roofline.py        the cost model: this device's peaks, a step's FLOPs and bytes

Each benchmark module has `add_cli_args(parser)` and `run(args)`; nothing here imports them
(main.py does), so importing workloads or roofline stays light.
"""
