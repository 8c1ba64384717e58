"""The engine's settings as flat keyword arguments and command-line flags (vLLM twin:
vllm/engine/arg_utils.py).

    EngineArgs(**kwargs)                 every setting LLM(...) takes, flat, with vLLM's names
      .create_engine_config()            -> VllmConfig, its parts each checked (config/)
    add_cli_args(parser)                 the flags, group "engine (vLLM's flag names)"
    engine_kwargs(args)                  the parsed flags as EngineArgs' keyword arguments

`minivllm serve`, `minivllm disagg` and `minivllm bench serve --compare-offline` parse the same
engine from the same command line; LLMEngine.reconfigure replaces fields of its EngineArgs and
builds a new VllmConfig through the same checks. Leaves out the ~150 flags minivllm has no
mechanism for; a flag here is a knob the engine has.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from dataclasses import dataclass

from minivllm.config import (CacheConfig, CompilationConfig, HfConfig, KVEventsConfig,
                             KVTransferConfig, LoRAConfig, ModelConfig, ParallelConfig,
                             SchedulerConfig, SpeculativeConfig, VllmConfig, resolve_device,
                             resolve_dtype)
from minivllm.config.utils import check_bools
from minivllm.config.parallel import DP_BALANCES
from minivllm.config.scheduler import V1_SCHEDULER

# Fixed when the weights load: reconfigure takes every other field.
LOAD_TIME_ARGS = ("model", "dtype", "device")


@dataclass
class EngineArgs:
    """Every engine setting, flat, as LLM(**kwargs) takes them. The comments say which part of
    the VllmConfig each lands in; the parts hold the documentation."""

    model: str | None = None              # ModelConfig: a checkpoint, .gguf, or hub id; None:
    dtype: str = "auto"                   # the packaged SmolLM2. dtype, device: resolved
    device: str = "auto"                  # there ("auto": fp32 on CPU, bf16 on CUDA)
    max_model_len: int | None = None      # ModelConfig and SchedulerConfig
    quantization: str | None = None       # ModelConfig: the weights' format
    quantize_lm_head: bool = True
    enforce_eager: bool = False
    attention_backend: str = "auto"
    max_num_seqs: int = 64                # SchedulerConfig
    max_num_batched_tokens: int = 2048
    enable_chunked_prefill: bool = True
    preemption_mode: str = "recompute"
    scheduling: str = "continuous"
    scheduler_cls: str = V1_SCHEDULER
    async_scheduling: bool = False
    block_size: int = 16                  # CacheConfig
    num_kv_blocks: int | None = None
    kv_cache_memory: int | None = None
    gpu_memory_utilization: float = 0.9
    enable_prefix_caching: bool = True
    swap_space: float = 1.0               # GiB
    kv_offloading_size: float | None = None
    kv_offloading_backend: str = "native"
    kv_cache_dtype: str = "auto"          # CacheConfig.cache_dtype
    kv_layout: str = "paged"
    tensor_parallel_size: int = 1         # ParallelConfig
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1
    data_parallel_balance: str = "score"
    data_parallel_size_local: int | None = None
    data_parallel_address: str = "127.0.0.1"
    data_parallel_rpc_port: int = 29550
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29501
    distributed_executor_backend: str | None = None
    enable_lora: bool = False             # LoRAConfig, or None without enable_lora
    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: int | None = None
    speculative_config: dict | SpeculativeConfig | None = None    # vLLM's dicts, parsed
    kv_transfer_config: dict | KVTransferConfig | None = None
    kv_events_config: dict | KVEventsConfig | None = None
    compilation_config: int | dict | CompilationConfig = 0        # a level, or {"level": n}

    @classmethod
    def check_names(cls, names, fixed: tuple[str, ...] = ()) -> None:
        """TypeError naming the settings that are not fields (or are `fixed`)."""
        settings = [f.name for f in dataclasses.fields(cls) if f.name not in fixed]
        unknown = sorted(set(names) - set(settings))
        if unknown:
            raise TypeError(f"unknown engine setting(s) {unknown}; the settings are "
                            f"{sorted(settings)}"
                            + (f" ({', '.join(fixed)} need a new engine)" if fixed else ""))

    def create_engine_config(self, hf_config: HfConfig | None = None) -> VllmConfig:
        """The VllmConfig these settings make, each part checked. hf_config: the model's
        shape when the caller has it (reconfigure, the simulator); else read from the
        checkpoint `model` names."""
        model = self.model
        if hf_config is None:
            from minivllm.models.loader import load_hf_config, resolve_model_path
            path = resolve_model_path(self.model)
            model, hf_config = str(path), HfConfig.from_hf_dict(load_hf_config(path))
        device = resolve_device(self.device)
        model_config = ModelConfig(
            hf_config=hf_config, model=model, dtype=resolve_dtype(self.dtype, device),
            device=device, max_model_len=self.max_model_len, quantization=self.quantization,
            quantize_lm_head=self.quantize_lm_head, enforce_eager=self.enforce_eager,
            attention_backend=self.attention_backend)
        check_bools(self, "enable_lora")
        lora_config = (LoRAConfig(max_loras=self.max_loras, max_lora_rank=self.max_lora_rank,
                                  max_cpu_loras=self.max_cpu_loras) if self.enable_lora else None)
        return VllmConfig(
            model_config=model_config,
            cache_config=CacheConfig(
                block_size=self.block_size, num_kv_blocks=self.num_kv_blocks,
                kv_cache_memory=self.kv_cache_memory,
                gpu_memory_utilization=self.gpu_memory_utilization,
                enable_prefix_caching=self.enable_prefix_caching, swap_space=self.swap_space,
                cache_dtype=self.kv_cache_dtype, kv_layout=self.kv_layout,
                kv_offloading_size=self.kv_offloading_size,
                kv_offloading_backend=self.kv_offloading_backend),
            scheduler_config=SchedulerConfig(
                max_num_seqs=self.max_num_seqs, max_num_batched_tokens=self.max_num_batched_tokens,
                max_model_len=model_config.max_model_len,
                enable_chunked_prefill=self.enable_chunked_prefill,
                preemption_mode=self.preemption_mode, scheduling=self.scheduling,
                scheduler_cls=self.scheduler_cls, async_scheduling=self.async_scheduling),
            parallel_config=ParallelConfig(
                tensor_parallel_size=self.tensor_parallel_size,
                pipeline_parallel_size=self.pipeline_parallel_size,
                data_parallel_size=self.data_parallel_size,
                data_parallel_balance=self.data_parallel_balance,
                data_parallel_size_local=self.data_parallel_size_local,
                data_parallel_address=self.data_parallel_address,
                data_parallel_rpc_port=self.data_parallel_rpc_port,
                nnodes=self.nnodes, node_rank=self.node_rank, master_addr=self.master_addr,
                master_port=self.master_port,
                distributed_executor_backend=self.distributed_executor_backend),
            lora_config=lora_config,
            speculative_config=_parse("speculative_config", self.speculative_config,
                                      SpeculativeConfig),
            compilation_config=CompilationConfig.from_value(self.compilation_config),
            kv_transfer_config=_parse("kv_transfer_config", self.kv_transfer_config,
                                      KVTransferConfig),
            kv_events_config=_parse("kv_events_config", self.kv_events_config, KVEventsConfig))


def _parse(name: str, value, cls):
    """vLLM's dict-valued settings: a dict parsed into cls, a cls as it is, or None."""
    if isinstance(value, dict):
        return cls.from_dict(value)
    if not isinstance(value, (cls, type(None))):
        raise ValueError(f"{name} must be a dict or None, got {value!r}")
    return value


def add_cli_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The engine's flags, with vLLM's names; `engine_kwargs` turns them into LLMEngine's."""
    g = parser.add_argument_group("engine (vLLM's flag names)")
    g.add_argument("--dtype", default="auto", help="auto (fp32 on CPU, bf16 on CUDA), float32, "
                   "bfloat16, float16")
    g.add_argument("--device", default="auto", help="auto, cpu or cuda")
    g.add_argument("--max-model-len", type=int, default=None,
                   help="longest prompt + output (default: the model's context length)")
    g.add_argument("--max-num-seqs", type=int, default=64, help="sequences per batch, at most")
    g.add_argument("--max-num-batched-tokens", type=int, default=None,
                   help="tokens per forward pass, at most (the token budget; default 2048, "
                        "but `serve` on a CPU measures one: --cpu-max-step-seconds)")
    g.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    g.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction,
                   default=True, help="reuse the KV blocks of shared prompt prefixes")
    g.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                   help="share of the GPU the engine may fill (CUDA)")
    g.add_argument("--num-gpu-blocks-override", type=int, default=None,
                   help="KV pool size in blocks, instead of the memory rule")
    g.add_argument("--tensor-parallel-size", "-tp", type=int, default=1,
                   help="split each layer across this many processes (GPUs)")
    g.add_argument("--pipeline-parallel-size", "-pp", type=int, default=1,
                   help="split the layers into this many stages, each -tp processes")
    g.add_argument("--data-parallel-size", "-dp", type=int, default=1,
                   help="this many replicas of the engine (each -tp x -pp processes) behind "
                        "one front end, requests balanced between them")
    g.add_argument("--data-parallel-balance", choices=DP_BALANCES, default="score",
                   help="which replica a request goes to: score (4 x waiting + running, "
                        "vLLM V1's before 0.33), round_robin, or prefix (its cached blocks "
                        "against load; needs --kv-events-config)")
    g.add_argument("--data-parallel-size-local", "-dpl", type=int, default=None,
                   help="replicas on this host (default: all); with --headless, the ones this "
                        "host runs for a front end elsewhere")
    g.add_argument("--data-parallel-address", default="127.0.0.1",
                   help="the front end's address, where replicas on other hosts connect")
    g.add_argument("--data-parallel-rpc-port", type=int, default=29550,
                   help="replica r's sockets: this port + 2r and + 2r + 1")
    g.add_argument("--data-parallel-start-rank", type=int, default=0,
                   help="with --headless: the first replica rank this host runs")
    g.add_argument("--nnodes", type=int, default=1,
                   help="hosts one replica's tp x pp ranks span (node 0 runs the engine)")
    g.add_argument("--node-rank", type=int, default=0,
                   help="this host's place among them (with --headless: 1, 2, ...)")
    g.add_argument("--master-addr", default="127.0.0.1", help="node 0's address")
    g.add_argument("--master-port", type=int, default=29501,
                   help="node 0's rendezvous port (node k's sockets: + 2k - 1 and + 2k)")
    g.add_argument("--headless", action="store_true",
                   help="run replicas' engine cores for a front end on another host, no server")
    g.add_argument("--distributed-executor-backend", choices=("uni", "mp", "ray"),
                   default=None, help="uni: one process; mp: a process per rank (default with "
                                      "-tp or -pp > 1); ray: a Ray actor per rank")
    g.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs for decode")
    g.add_argument("--async-scheduling", action="store_true",
                   help="schedule step N + 1 while step N runs (V1's AsyncScheduler)")
    g.add_argument("--kv-offloading-size", type=float, default=None,
                   help="GiB of host memory for the CPU tier of the KV cache (off: unset)")
    g.add_argument("--kv-offloading-backend", choices=("native",), default="native",
                   help="the CPU tier's implementation (vLLM's native one)")
    g.add_argument("--kv-events-config", type=json.loads, default=None,
                   help='the prefix cache\'s events, as JSON: {"enable_kv_cache_events": true}')
    return parser


# The EngineArgs fields `add_cli_args` sets, each from the flag of its name (node_rank and the
# headless launcher's flags are `serve --headless`'s own: the engine runs on node 0).
CLI_FIELDS = ("dtype", "device", "max_model_len", "max_num_seqs", "block_size",
              "enable_prefix_caching", "gpu_memory_utilization", "tensor_parallel_size",
              "pipeline_parallel_size", "data_parallel_size", "data_parallel_balance",
              "data_parallel_size_local", "data_parallel_address", "data_parallel_rpc_port",
              "nnodes", "master_addr", "master_port", "enforce_eager", "async_scheduling",
              "kv_offloading_size", "kv_offloading_backend", "kv_events_config",
              "distributed_executor_backend")


def engine_kwargs(args: argparse.Namespace) -> dict:
    """EngineArgs' keyword arguments from the flags `add_cli_args` added (vLLM's
    EngineArgs.from_cli_args; the one rename: --num-gpu-blocks-override is num_kv_blocks;
    the token budget only when given: `serve` on a CPU measures one otherwise)."""
    kwargs = {name: getattr(args, name) for name in CLI_FIELDS}
    kwargs["num_kv_blocks"] = args.num_gpu_blocks_override
    if args.max_num_batched_tokens is not None:
        kwargs["max_num_batched_tokens"] = args.max_num_batched_tokens
    return kwargs
