"""What the model is: its checkpoint's shape (HfConfig) and how this engine runs it
(ModelConfig). vLLM twin: vllm/config/model.py.

HfConfig is read from a Hugging Face `config.json` dict, so a model converted from GGUF and a
model from the hub look the same to the engine; only the three Llama-family architectures are
understood, anything else is refused by name. (vLLM keeps transformers' PretrainedConfig as
`model_config.hf_config`; this is the part of it minivllm reads.)

ModelConfig holds the checkpoint's path and shape with the settings that change what the
weights compute with: dtype, device (vLLM keeps that in a DeviceConfig), max_model_len, the
weights' quantization, eager or CUDA graphs, the attention backend. Importing this file imports
no torch: the functions that need it import it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from minivllm.config.utils import check_bools, check_choice, check_positive_ints

if TYPE_CHECKING:
    import torch

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")

_DTYPES = {"float32": "float32", "fp32": "float32", "float16": "float16", "fp16": "float16",
           "half": "float16", "bfloat16": "bfloat16", "bf16": "bfloat16"}   # -> torch's name


@dataclass(slots=True)
class HfConfig:
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
    def from_hf_dict(cls, d: dict) -> HfConfig:
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


# The weight formats `quantization` takes, vLLM's QUANTIZATION_METHODS (quantization/ parses one).
INT4_GROUP_SIZES = (32, 64, 128)        # "int4-gG": a scale and a min per G weights of a row
QUANTIZATION_METHODS = ("int8", "int4", *(f"int4-g{g}" for g in INT4_GROUP_SIZES))
ATTENTION_BACKENDS = ("auto", "torch", "triton")


@dataclass(slots=True)
class ModelConfig:
    """The model and what its weights compute with. Built by EngineArgs.create_engine_config
    (device and dtype resolved there); checked once, here."""

    hf_config: HfConfig                   # the checkpoint's shape (config.json)
    model: str | None = None              # the checkpoint's directory (None: shapes only)
    dtype: torch.dtype | None = None      # resolve_dtype's answer
    device: torch.device | None = None    # resolve_device's answer (vLLM: DeviceConfig)
    max_model_len: int | None = None      # longest prompt + output (None: the model's limit)
    # Weights (minivllm/quantization/weight_only.py, lesson 13): None, "int8" (per output
    # channel) or an int4 of QUANTIZATION_METHODS (groups, packed two per byte).
    quantization: str | None = None
    # With quantization, the LM head in int8 too (per row, as llama.cpp's Q8_0 head), untied from
    # the float embedding table; False keeps it float (vLLM's GPTQ lm_head_quantized, opt-in there).
    quantize_lm_head: bool = True
    # Decode steps replay CUDA graphs unless enforce_eager (CUDA; minivllm/worker/compilation.py).
    enforce_eager: bool = False
    attention_backend: str = "auto"       # "torch" | "triton" | "auto" (Triton on CUDA bf16/fp16)

    def __post_init__(self):
        limit = self.hf_config.max_position_embeddings
        if self.max_model_len is None:
            self.max_model_len = limit
        check_positive_ints(self, "max_model_len")
        if self.max_model_len > limit:
            raise ValueError(f"max_model_len={self.max_model_len} exceeds the model's "
                             f"max_position_embeddings ({limit})")
        if self.quantization is not None and self.quantization not in QUANTIZATION_METHODS:
            raise ValueError(f"quantization must be None or one of "
                             f"{list(QUANTIZATION_METHODS)}, got {self.quantization!r}")
        check_bools(self, "quantize_lm_head", "enforce_eager")
        check_choice(self, "attention_backend", ATTENTION_BACKENDS)
