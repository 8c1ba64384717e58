"""Configuration: what the model is (ModelConfig) and how the engine runs it (EngineConfig).

ModelConfig is read from a Hugging Face `config.json` dict, so a model converted from GGUF and
a model from the hub look the same to the engine; only the three Llama-family architectures
are understood, anything else is refused by name. EngineConfig holds the knobs vLLM users know
(max_model_len, max_num_seqs, max_num_batched_tokens, block_size, ...) and checks them once;
LLMEngine.reconfigure builds a new one through the same checks. Which options combine is one
table, INCOMPATIBLE: the add-ons never refuse each other anywhere else. Importing this file
imports no torch (the functions that need it do): the scheduler reads EngineConfig without.
vLLM twin: vllm/config/ (EngineConfig's knobs split over CacheConfig, SchedulerConfig, ...);
left out: its ~200 settings but those a lesson turns.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")

_DTYPES = {"float32": "float32", "fp32": "float32", "float16": "float16", "fp16": "float16",
           "half": "float16", "bfloat16": "bfloat16", "bf16": "bfloat16"}   # -> torch's name


@dataclass(slots=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None = None     # {"rope_type": "llama3" | "linear", ...} or None
    tie_word_embeddings: bool = False
    attention_bias: bool = False         # Qwen2 always has q/k/v bias
    qk_norm: bool = False                # Qwen3 normalizes q and k per head
    bos_token_id: int | None = None
    eos_token_id: list[int] = field(default_factory=list)

    @classmethod
    def from_hf_dict(cls, d: dict) -> "ModelConfig":
        archs = d.get("architectures") or []
        arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
        if arch is None:
            raise ValueError(
                f"unsupported architecture {archs or d.get('model_type')!r}: minivllm runs "
                f"{', '.join(SUPPORTED_ARCHITECTURES)}")
        # transformers >= 5 folds rope_theta and rope_scaling into one `rope_parameters` dict.
        rope = dict(d.get("rope_parameters") or d.get("rope_scaling") or {})
        rope_theta = float(rope.pop("rope_theta", d.get("rope_theta", 10000.0)))
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        n_heads = d["num_attention_heads"]
        eos = d.get("eos_token_id")
        return cls(
            architecture=arch,
            vocab_size=d["vocab_size"],
            hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"],
            num_hidden_layers=d["num_hidden_layers"],
            num_attention_heads=n_heads,
            num_key_value_heads=d.get("num_key_value_heads") or n_heads,
            head_dim=d.get("head_dim") or d["hidden_size"] // n_heads,
            max_position_embeddings=d.get("max_position_embeddings", 2048),
            rms_norm_eps=d.get("rms_norm_eps", 1e-6),
            rope_theta=rope_theta,
            rope_scaling=None if rope_type == "default" else {**rope, "rope_type": rope_type},
            tie_word_embeddings=d.get("tie_word_embeddings", False),
            attention_bias=arch == "Qwen2ForCausalLM" or d.get("attention_bias", False),
            qk_norm=arch == "Qwen3ForCausalLM",
            bos_token_id=d.get("bos_token_id"),
            eos_token_id=[] if eos is None else ([eos] if isinstance(eos, int) else list(eos)),
        )


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    import torch
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' was asked for, but torch sees no CUDA device")
    return device


def resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    """'auto' means fp32 on CPU (exact, and CPUs have no fast bf16 matmul) and bf16 on CUDA."""
    import torch
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; use 'auto' or one of {sorted(_DTYPES)}")
    return getattr(torch, _DTYPES[dtype])


# The string settings and the values each takes (the first is the default).
_CHOICES = {"preemption_mode": ("recompute", "swap"), "scheduling": ("continuous", "static"),
            "kv_layout": ("paged", "contiguous"), "attention_backend": ("auto", "torch", "triton"),
            "kv_cache_dtype": ("auto", "fp8", "int8")}
# The weight formats `quantization` takes, vLLM's QUANTIZATION_METHODS (quantization/ parses one).
INT4_GROUP_SIZES = (32, 64, 128)        # "int4-gG": a scale and a min per G weights of a row
QUANTIZATION_METHODS = ("int8", "int4", *(f"int4-g{g}" for g in INT4_GROUP_SIZES))


@dataclass(slots=True)
class EngineConfig:
    """The engine's knobs, named as in vLLM. Validated once, here."""

    max_model_len: int = 2048             # longest prompt + output one request may reach
    max_num_seqs: int = 64                # sequences in one batch, at most
    max_num_batched_tokens: int = 2048    # tokens in one forward pass, at most (the token budget)
    block_size: int = 16                  # tokens per KV block
    # The KV pool's size, first rule that applies: num_kv_blocks blocks (slabs, for the
    # contiguous baseline); kv_cache_memory bytes, on any device; on CUDA, what profiling one
    # full step leaves within gpu_memory_utilization; on CPU, 1 GiB.
    num_kv_blocks: int | None = None
    kv_cache_memory: int | None = None
    gpu_memory_utilization: float = 0.9   # share of the GPU the engine may fill (CUDA)
    enable_chunked_prefill: bool = True   # split long prompts to fit the token budget
    enable_prefix_caching: bool = True    # reuse the K/V blocks of shared prompt prefixes
    preemption_mode: str = "recompute"    # or "swap": park a preempted sequence's KV on host
    swap_space: int = 1 << 30             # bytes of host memory for swapped KV blocks
    scheduling: str = "continuous"        # or "static": a new batch only when one finishes
    attention_backend: str = "auto"       # "torch" | "triton" | "auto" (Triton on CUDA bf16/fp16)
    kv_layout: str = "paged"              # or "contiguous": one max_model_len slab per request
    # Speculative decoding, vLLM's dict: {"method": "ngram", "num_speculative_tokens": k,
    # "prompt_lookup_max": 4, "prompt_lookup_min": 1} (None: off). Kept as a SpeculativeConfig.
    speculative_config: dict | SpeculativeConfig | None = None
    # Tensor parallelism (minivllm/distributed/): the model split across this many processes.
    tensor_parallel_size: int = 1
    # The executor (minivllm/executor/): "uni", "mp" (a process a rank); None: "mp" if tp > 1.
    distributed_executor_backend: str | None = None
    # Decode steps replay CUDA graphs unless enforce_eager (CUDA; minivllm/worker/compilation.py).
    enforce_eager: bool = False
    # torch.compile of the layers around attention: vLLM's level, 0 (off) or 3; an int or
    # {"level": n}. Off by default: on this CPU it does not pay (docs/benchmarks.md).
    compilation_config: int | dict = 0
    # Prefill/decode disaggregation, vLLM's dict: {"kv_connector": "TorchDistributedConnector",
    # "kv_role": "kv_producer" | "kv_consumer", "kv_ip": ..., "kv_port": ...} (minivllm/distributed/kv_transfer/kv_connector.py).
    kv_transfer_config: dict | KVTransferConfig | None = None
    # Quantization (minivllm/quantization/weight_only.py, lesson 13). Weights: None, "int8" (per
    # output channel) or an int4 of QUANTIZATION_METHODS (groups, packed two per byte). KV cache:
    # "auto" (the model's dtype), "fp8" (e4m3) or "int8", one scale per token and KV head.
    quantization: str | None = None
    # With quantization, the LM head in int8 too (per row, as llama.cpp's Q8_0 head), untied from
    # the float embedding table; False keeps it float (vLLM's GPTQ lm_head_quantized, opt-in there).
    quantize_lm_head: bool = True
    kv_cache_dtype: str = "auto"
    # Multi-LoRA (minivllm/lora/): adapters served in max_loras slots of max_lora_rank, and
    # kept read in host memory up to max_cpu_loras (None: max_loras).
    enable_lora: bool = False
    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: int | None = None

    def __post_init__(self):
        for name in ("max_model_len", "max_num_seqs", "max_num_batched_tokens", "block_size",
                     "kv_cache_memory", "num_kv_blocks", "swap_space", "tensor_parallel_size",
                     "max_loras", "max_lora_rank", "max_cpu_loras"):
            value = getattr(self, name)
            if value is None and name in ("kv_cache_memory", "num_kv_blocks", "max_cpu_loras"):
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if isinstance(self.compilation_config, dict):
            unknown = sorted(set(self.compilation_config) - {"level"})
            if unknown:
                raise ValueError(f"compilation_config: unknown key(s) {unknown}; minivllm "
                                 "reads only 'level'")
            self.compilation_config = self.compilation_config.get("level", 0)
        if self.compilation_config not in (0, 3) or isinstance(self.compilation_config, bool):
            raise ValueError(f"compilation_config level must be 0 (eager) or 3 (torch.compile "
                             f"around attention), got {self.compilation_config!r}")
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise ValueError(f"max_cpu_loras ({self.max_cpu_loras}) must be >= max_loras "
                             f"({self.max_loras}): every adapter in a slot is also kept on host")
        for name in ("enable_chunked_prefill", "enable_prefix_caching", "enforce_eager",
                     "enable_lora", "quantize_lm_head"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        for name, choices in _CHOICES.items():
            if getattr(self, name) not in choices:
                raise ValueError(f"{name} must be {', '.join(map(repr, choices[:-1]))} or "
                                 f"{choices[-1]!r}, got {getattr(self, name)!r}")
        backend = self.distributed_executor_backend
        tp = self.tensor_parallel_size
        if backend not in (None, "uni", "mp") or (backend == "uni" and tp > 1):
            raise ValueError(f"distributed_executor_backend must be None, 'uni' or 'mp' ('uni' "
                             f"is one process: not tensor_parallel_size > 1), got {backend!r}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got "
                             f"{self.gpu_memory_utilization}")
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(
                f"without chunked prefill a whole prompt must fit one step: "
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= "
                f"max_model_len ({self.max_model_len})")
        for name, cls in (("speculative_config", SpeculativeConfig),
                          ("kv_transfer_config", KVTransferConfig)):    # vLLM's dicts, parsed
            value = getattr(self, name)
            if isinstance(value, dict):
                setattr(self, name, cls.from_dict(value))
            elif not isinstance(value, (cls, type(None))):
                raise ValueError(f"{name} must be a dict or None, got {value!r}")
        if self.quantization is not None and self.quantization not in QUANTIZATION_METHODS:
            raise ValueError(f"quantization must be None or one of "
                             f"{list(QUANTIZATION_METHODS)}, got {self.quantization!r}")
        if self.kv_cache_dtype == "fp8":
            import torch
            if not hasattr(torch, "float8_e4m3fn"):
                raise ValueError(f"kv_cache_dtype='fp8' needs torch.float8_e4m3fn, which torch "
                                 f"{torch.__version__} lacks; use 'int8'")
        check_compatibility(self)


# Which engine options combine: each row is two settings that do not, and the message. Checked in
# one place, EngineConfig's construction (so at every reconfigure too), except two rows: the
# last one's first setting is per request (SamplingParams), so structured_output checks it at
# add_request with this row's message; CUDA_GRAPHS depends on the device, which the ModelRunner
# knows (worker/model_runner.py, use_cuda_graphs). (Whether tp = N splits a given model depends on the model's shapes:
# distributed/parallel_state.py's check_tensor_parallel.)
TP = "tensor_parallel_size > 1"
PER_REQUEST = "guided_decoding, penalties or min_tokens"
CUDA_GRAPHS = "CUDA graphs"      # on CUDA unless enforce_eager: the runner checks this row
INCOMPATIBLE = (
    (TP, "quantization", "quantization with tensor_parallel_size > 1 is not supported by "
     "minivllm; leave quantization unset with tp > 1"),
    (TP, "enable_lora", "enable_lora with tensor_parallel_size > 1 is not supported by "
     "minivllm; leave enable_lora unset with tp > 1"),
    (TP, "compilation_config", "compilation_config with tensor_parallel_size > 1 is not "
     "supported by minivllm (its graphs would break at every all-reduce); use "
     "compilation_config=0"),
    (TP, "speculative_config", "speculative_config with tensor_parallel_size > 1 is not "
     "supported by minivllm; leave speculative_config unset with tp > 1"),
    (TP, "kv_transfer_config", "kv_transfer_config with tensor_parallel_size > 1 is not "
     "supported by minivllm; leave kv_transfer_config unset with tp > 1"),
    ("enable_lora", "compilation_config", "enable_lora with compilation_config is not "
     "supported by minivllm: the adapters' per-step layout is Python state a compiled graph "
     "would guard on and recompile for; use compilation_config=0 with enable_lora"),
    ("enable_lora", "quantization", "enable_lora with quantization is not supported by "
     "minivllm: LoRA wraps plain nn.Linear layers, and quantization swaps them for QuantLinear"),
    (CUDA_GRAPHS, "enable_lora", "enable_lora with CUDA graphs is not supported by minivllm: "
     "a decode graph replays the base path it was captured with, so the adapters would be "
     "ignored after the first token; pass enforce_eager=True with enable_lora on CUDA"),
    ("kv_layout='contiguous'", "preemption_mode='swap'",
     "preemption_mode='swap' needs kv_layout='paged': it moves KV blocks"),
    ("kv_layout='contiguous'", "speculative_config", "speculative_config needs "
     "kv_layout='paged': rejected draft tokens give their lookahead blocks back"),
    ("kv_layout='contiguous'", "kv_transfer_config",
     "kv_transfer_config needs kv_layout='paged': KV moves in blocks"),
    (PER_REQUEST, "speculative_config",
     "guided_decoding, penalties and min_tokens are not supported with speculative decoding "
     "(drafts are verified against the unprocessed distribution); use an engine without "
     "speculative_config"),
)


def check_compatibility(config: EngineConfig) -> None:
    """Raise the message of the first INCOMPATIBLE row whose two settings config both sets."""
    on = {TP: config.tensor_parallel_size > 1,
          "quantization": config.quantization is not None,
          "enable_lora": config.enable_lora,
          "compilation_config": config.compilation_config != 0,
          "speculative_config": config.speculative_config is not None,
          "kv_transfer_config": config.kv_transfer_config is not None,
          "kv_layout='contiguous'": config.kv_layout == "contiguous",
          "preemption_mode='swap'": config.preemption_mode == "swap"}
    for a, b, message in INCOMPATIBLE:
        if on.get(a) and on[b]:                 # PER_REQUEST is not an engine setting: skipped
            raise ValueError(message)


def incompatibility(a: str, b: str) -> str:
    """The message of INCOMPATIBLE's row for settings a and b (for a check made elsewhere)."""
    return next(message for x, y, message in INCOMPATIBLE if (x, y) == (a, b))


def _check_keys(cls, name: str, d: dict, required: str, hint: str) -> dict:
    """d, once its keys are all fields of cls and the `required` one is there."""
    keys = list(cls.__dataclass_fields__)
    unknown = sorted(set(d) - set(keys))
    if unknown:
        raise ValueError(f"{name}: unknown key(s) {unknown}; the keys are {keys}")
    if required not in d:
        raise ValueError(f"{name} needs {required}{hint}")
    return d


SPECULATIVE_METHODS = ("ngram", "draft_model")


@dataclass(slots=True, frozen=True)
class SpeculativeConfig:
    """Speculative decoding (minivllm/spec_decode/decoder.py), from vLLM's `speculative_config` dict.

    method "ngram": prompt lookup, no extra model. "draft_model": a smaller model sharing the
    target's vocabulary, named by `model` (a checkpoint path, as for the target), guesses
    greedily over its own KV cache; `quantization` quantizes its weights (a quantized copy of
    the target is a draft that agrees with it often). Only the keys below exist.
    """

    num_speculative_tokens: int           # k: draft tokens proposed, then verified, per step
    method: str = "ngram"
    model: str | None = None              # the draft model's checkpoint ("draft_model" only)
    quantization: str | None = None       # ... and its weights' format, as LLM(quantization=)
    prompt_lookup_max: int = 4            # n-gram: longest suffix to look up in the sequence
    prompt_lookup_min: int = 1            # ... and the shortest

    @classmethod
    def from_dict(cls, d: dict) -> SpeculativeConfig:
        d = dict(_check_keys(cls, "speculative_config", d, "num_speculative_tokens", " (k >= 1)"))
        if d.get("model") is not None:
            if d.get("method", "draft_model") != "draft_model":
                raise ValueError(f"speculative_config names both method={d['method']!r} and "
                                 f"model={d['model']!r}: the n-gram proposer needs no model; "
                                 "give one or the other")
            d["method"] = "draft_model"
        return cls(**d)

    def __post_init__(self):
        k = self.num_speculative_tokens
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise ValueError(f"speculative_config: num_speculative_tokens must be an integer "
                             f">= 1, got {k!r}")
        if self.method not in SPECULATIVE_METHODS:
            raise ValueError(f"speculative_config: unknown method {self.method!r}; minivllm "
                             f"has {list(SPECULATIVE_METHODS)}")
        if (self.method == "draft_model") != (self.model is not None):
            raise ValueError("speculative_config: method 'draft_model' needs a model (a "
                             "checkpoint sharing the target's vocabulary), and only it does")
        lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
        if not all(isinstance(n, int) and n >= 1 for n in (lo, hi)) or lo > hi:
            raise ValueError(f"speculative_config: need 1 <= prompt_lookup_min <= "
                             f"prompt_lookup_max, got {lo} and {hi}")


KV_CONNECTORS = ("TorchDistributedConnector",)
KV_ROLES = ("kv_producer", "kv_consumer")


@dataclass(slots=True, frozen=True)
class KVTransferConfig:
    """Prefill/decode disaggregation (minivllm/distributed/kv_transfer/kv_connector.py), from vLLM's `kv_transfer_config`.

    The kv_producer (rank 0) prefills prompts and sends their KV; the kv_consumer (rank 1)
    decodes. The producer listens at kv_ip:kv_port, the consumer connects there.
    kv_connector_extra_config takes {"timeout": seconds} (default 120): how long to wait for
    the other role to join, and for a send to complete.
    """

    kv_role: str
    kv_connector: str = "TorchDistributedConnector"
    kv_rank: int | None = None            # 0 (producer) or 1 (consumer); derived if None
    kv_parallel_size: int = 2             # one producer and one consumer
    kv_ip: str = "127.0.0.1"
    kv_port: int = 14579
    kv_connector_extra_config: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: dict) -> KVTransferConfig:
        return cls(**_check_keys(cls, "kv_transfer_config", d, "kv_role",
                                 f", one of {list(KV_ROLES)}"))

    def __post_init__(self):
        if self.kv_role not in KV_ROLES:
            raise ValueError(f"kv_transfer_config: kv_role must be one of {list(KV_ROLES)}, "
                             f"got {self.kv_role!r}")
        if self.kv_connector not in KV_CONNECTORS:
            raise ValueError(f"kv_transfer_config: unknown kv_connector {self.kv_connector!r}; "
                             f"minivllm has {list(KV_CONNECTORS)}")
        if self.kv_rank not in (None, self.rank):
            raise ValueError(f"kv_transfer_config: a {self.kv_role} is kv_rank {self.rank}, "
                             f"got {self.kv_rank!r}")
        if self.kv_parallel_size != 2:
            raise ValueError(f"kv_transfer_config: kv_parallel_size must be 2 (one producer, "
                             f"one consumer), got {self.kv_parallel_size!r}")
        if not isinstance(self.kv_port, int) or not 0 < self.kv_port < 65536:
            raise ValueError(f"kv_transfer_config: kv_port must be in 1..65535, got "
                             f"{self.kv_port!r}")
        unknown = sorted(set(self.kv_connector_extra_config) - {"timeout"})
        if unknown or not self.timeout > 0:
            raise ValueError(f"kv_transfer_config: kv_connector_extra_config takes "
                             f"{{'timeout': seconds > 0}}, got {self.kv_connector_extra_config!r}")

    @property
    def rank(self) -> int:
        return KV_ROLES.index(self.kv_role)

    @property
    def timeout(self) -> float:
        return self.kv_connector_extra_config.get("timeout", 120.0)
