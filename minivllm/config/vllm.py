"""The engine's whole configuration, one part per concern (vLLM twin: vllm/config/vllm.py).

VllmConfig holds the parts; each component takes the ones it reads (the scheduler its
SchedulerConfig and CacheConfig, the model runner the ModelConfig and CacheConfig, ...). Each
part checks its own fields when it is built; which options of different parts combine is one
table here, INCOMPATIBLE, checked as a VllmConfig is built: the add-ons never refuse each other
anywhere else. A VllmConfig is built from flat keyword arguments (LLM(**kwargs), the server's
flags) by EngineArgs.create_engine_config (engine/arg_utils.py), and again by every
LLMEngine.reconfigure. Importing this file imports no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from minivllm.config.cache import CacheConfig
from minivllm.config.compilation import CompilationConfig
from minivllm.config.kv_events import KVEventsConfig
from minivllm.config.kv_transfer import KVTransferConfig
from minivllm.config.lora import LoRAConfig
from minivllm.config.model import ModelConfig
from minivllm.config.parallel import ParallelConfig
from minivllm.config.scheduler import SchedulerConfig
from minivllm.config.speculative import SpeculativeConfig


@dataclass(slots=True)
class VllmConfig:
    model_config: ModelConfig
    cache_config: CacheConfig = field(default_factory=CacheConfig)
    scheduler_config: SchedulerConfig = field(default_factory=SchedulerConfig)
    parallel_config: ParallelConfig = field(default_factory=ParallelConfig)
    lora_config: LoRAConfig | None = None                 # None: enable_lora off
    speculative_config: SpeculativeConfig | None = None   # None: no speculative decoding
    compilation_config: CompilationConfig = field(default_factory=CompilationConfig)
    kv_transfer_config: KVTransferConfig | None = None    # None: no disaggregation
    kv_events_config: KVEventsConfig | None = None        # None: no KV cache events

    def __post_init__(self):
        if self.scheduler_config.max_model_len != self.model_config.max_model_len:
            raise ValueError(f"the scheduler's max_model_len "
                             f"({self.scheduler_config.max_model_len}) differs from the model's "
                             f"({self.model_config.max_model_len})")
        check_compatibility(self)


# Which engine options combine: each row is two settings that do not, and the message. Checked in
# one place, VllmConfig's construction (so at every reconfigure too), except two rows: the
# last one's first setting is per request (SamplingParams), so structured_output checks it at
# add_request with this row's message; CUDA_GRAPHS depends on the device, which the ModelRunner
# knows (worker/model_runner.py, use_cuda_graphs). (Whether tp = N splits a given model depends
# on the model's shapes: distributed/parallel_state.py's check_tensor_parallel.)
TP = "tensor_parallel_size > 1"
PP = "pipeline_parallel_size > 1"
PER_REQUEST = "guided_decoding, penalties or min_tokens"
CUDA_GRAPHS = "CUDA graphs"      # on CUDA unless enforce_eager: the runner checks this row
INCOMPATIBLE = (
    *((split, option, f"{option} with {split} is not supported by minivllm{why}")
      for split in (TP, PP) for option, why in (
        ("quantization", "; leave quantization unset"),
        ("enable_lora", "; leave enable_lora unset"),
        ("compilation_config", " (its graphs would break at every collective); use "
                               "compilation_config=0"),
        ("speculative_config", "; leave speculative_config unset"),
        ("kv_transfer_config", "; leave kv_transfer_config unset"))),
    ("enable_lora", "compilation_config", "enable_lora with compilation_config is not "
     "supported by minivllm: the adapters' per-step layout is Python state a compiled graph "
     "would guard on and recompile for; use compilation_config=0 with enable_lora"),
    ("enable_lora", "quantization", "enable_lora with quantization is not supported by "
     "minivllm: LoRA wraps plain nn.Linear layers, and quantization swaps them for QuantLinear"),
    (CUDA_GRAPHS, "enable_lora", "enable_lora with CUDA graphs is not supported by minivllm: "
     "a decode graph replays the base path it was captured with, so the adapters would be "
     "ignored after the first token; pass enforce_eager=True with enable_lora on CUDA"),
    (PP, "preemption_mode='swap'", "preemption_mode='swap' (V0's) needs one pipeline stage"),
    ("kv_layout='contiguous'", "preemption_mode='swap'",
     "preemption_mode='swap' needs kv_layout='paged': it moves KV blocks"),
    ("kv_layout='contiguous'", "speculative_config", "speculative_config needs "
     "kv_layout='paged': rejected draft tokens give their lookahead blocks back"),
    ("kv_layout='contiguous'", "kv_transfer_config",
     "kv_transfer_config needs kv_layout='paged': KV moves in blocks"),
    ("kv_layout='contiguous'", "kv_offloading_size",
     "kv_offloading_size needs kv_layout='paged': the CPU tier keeps KV blocks by hash"),
    ("preemption_mode='swap'", "kv_offloading_size", "kv_offloading_size with "
     "preemption_mode='swap' is not supported: the CPU tier is V1's successor to V0's swap "
     "(a preempted request loads its offloaded blocks back); use preemption_mode='recompute'"),
    ("kv_transfer_config", "kv_offloading_size", "kv_offloading_size with kv_transfer_config "
     "is not supported by minivllm: one KV connector at a time (no MultiConnector)"),
    # Async scheduling (core/async_scheduler.py) needs the one sampling worker to fill in
    # the tokens the core has not seen, and a step's inputs to depend on no unseen token.
    *(("async_scheduling", option, f"async_scheduling with {option} is not supported by "
       f"minivllm: {why}") for option, why in (
        (TP, "only the driver samples, the other ranks would miss the tokens"),
        (PP, "the stages' batch queue is the one async scheduling uses"),
        ("speculative_config", "the drafts would follow a token not yet sampled"),
        ("kv_transfer_config", "a transferred request's first token comes from the core"),
        ("kv_offloading_size", "a block is stored by the hash of tokens not yet sampled"))),
    (PER_REQUEST, "speculative_config",
     "guided_decoding, penalties and min_tokens are not supported with speculative decoding "
     "(drafts are verified against the unprocessed distribution); use an engine without "
     "speculative_config"),
)


def check_compatibility(config: VllmConfig) -> None:
    """Raise the message of the first INCOMPATIBLE row whose two settings config both sets."""
    on = {TP: config.parallel_config.tensor_parallel_size > 1,
          PP: config.parallel_config.pipeline_parallel_size > 1,
          "quantization": config.model_config.quantization is not None,
          "enable_lora": config.lora_config is not None,
          "compilation_config": config.compilation_config.level != 0,
          "speculative_config": config.speculative_config is not None,
          "kv_transfer_config": config.kv_transfer_config is not None,
          "kv_layout='contiguous'": config.cache_config.kv_layout == "contiguous",
          "preemption_mode='swap'": config.scheduler_config.preemption_mode == "swap",
          "kv_offloading_size": config.cache_config.kv_offloading_size is not None,
          "async_scheduling": config.scheduler_config.async_scheduling}
    for a, b, message in INCOMPATIBLE:
        if on.get(a) and on[b]:                 # PER_REQUEST is not an engine setting: skipped
            raise ValueError(message)


def incompatibility(a: str, b: str) -> str:
    """The message of INCOMPATIBLE's row for settings a and b (for a check made elsewhere)."""
    return next(message for x, y, message in INCOMPATIBLE if (x, y) == (a, b))
