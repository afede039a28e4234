"""GGML tensor types of a GGUF file: which the installed `gguf` package can dequantize, and the
dtype the file was made from as far as its types tell."""

from __future__ import annotations

import numpy as np

# Tensors llama.cpp keeps in float32 whatever the file's type (not a sign of its dtype).
_ALWAYS_FLOAT32 = (".ssm_conv1d.weight",)


def checkpoint_dtype(reader) -> str:
    """The dtype the file was made from, as far as it tells: a quantized file says bfloat16."""
    kinds = {
        t.tensor_type.name
        for t in reader.tensors
        if len(t.shape) > 1 and not t.name.endswith(_ALWAYS_FLOAT32)
    }
    return {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}.get(
        kinds.pop() if len(kinds) == 1 else "", "bfloat16"
    )


def check_tensor_types(reader) -> None:
    """Raises ValueError naming any tensor type the installed `gguf` cannot dequantize."""
    import gguf

    unsupported = sorted(
        {t.tensor_type for t in reader.tensors if not _can_dequantize(t.tensor_type)},
        key=lambda t: t.name,
    )
    if unsupported:
        supported = [t.name for t in gguf.GGMLQuantizationType if _can_dequantize(t)]
        raise ValueError(
            f"GGUF tensor type(s) {[t.name for t in unsupported]} cannot be dequantized by "
            f"gguf {_gguf_version()}; it dequantizes {supported}"
        )


def _can_dequantize(qtype) -> bool:
    import gguf

    _, type_size = gguf.GGML_QUANT_SIZES[qtype]
    try:  # one zero block through the library's own dispatch
        gguf.quants.dequantize(np.zeros((1, type_size), dtype=np.uint8), qtype)
    except NotImplementedError:
        return False
    return True


def _gguf_version() -> str:
    from importlib.metadata import version

    return version("gguf")
