"""Weight-only quantization (vLLM twin: vllm/model_executor/layers/quantization/): the methods.

    __init__.py      a format's name -> (method, group size), what the layers need to know
    weight_only.py   int8 per channel and int4 in groups: QuantLinear, quantize_model

The names `quantization=` takes are config/model.py's QUANTIZATION_METHODS, which ModelConfig
checks without importing this package (its layers import the model, which imports config/).
vLLM keeps its QUANTIZATION_METHODS here and its config imports them: a cycle minivllm avoids.
"""

from minivllm.config import QUANTIZATION_METHODS


def parse_quantization(method: str | None) -> tuple[str, int] | None:
    """'int8' -> ('int8', 0); 'int4-g64' -> ('int4', 64); 'int4' is 'int4-g32' (GGUF Q4_1's
    block, and the one size that divides every dimension of the default model); None -> None."""
    if method is None:
        return None
    if method not in QUANTIZATION_METHODS:
        raise ValueError(f"quantization must be None or one of {list(QUANTIZATION_METHODS)}, "
                         f"got {method!r}")
    if method == "int8":
        return "int8", 0
    return "int4", int(method.split("-g")[1]) if "-g" in method else 32
