"""Weight-only quantization (vLLM twin: vllm/model_executor/layers/quantization/): the methods.

    __init__.py      the formats `quantization=` takes, parsed (what EngineConfig checks)
    weight_only.py   int8 per channel and int4 in groups: QuantLinear, quantize_model

The parser lives here, as vLLM's QUANTIZATION_METHODS does, so that config.py can check a
setting without importing the layers (which import the model).
"""

INT4_GROUP_SIZES = (32, 64, 128)


def parse_quantization(method: str | None) -> tuple[str, int] | None:
    """'int8' -> ('int8', 0); 'int4-g64' -> ('int4', 64); 'int4' is 'int4-g32' (GGUF Q4_1's
    block, and the one size that divides every dimension of the default model); None -> None."""
    if method is None:
        return None
    known = ["int8", "int4"] + [f"int4-g{g}" for g in INT4_GROUP_SIZES]
    if method not in known:
        raise ValueError(f"quantization must be None or one of {known}, got {method!r}")
    if method == "int8":
        return "int8", 0
    return "int4", int(method.split("-g")[1]) if "-g" in method else 32
