"""The FFN activations the forward pass runs, by the name a GGUF declares (``aios.ffn_activation``)
or the one llama.cpp's arithmetic stands for under the int8 setting (GGML_GELU, GGML_SILU)."""

from __future__ import annotations

import numpy as np

from aios.errors import UnsupportedArchitectureError
from runtime import ggml_ops, ops

GGML_GELU = "gelu (ggml fp16 table)"  # what Model._activation() names the GELU family under int8 arithmetic
GGML_SILU = "silu (ggml_v_expf)"  # and SiLU (runtime.ggml_ops.silu_mul)
GELU_FAMILY = ("gelu", "gelu_new", "gelu_pytorch_tanh", "gelu_fast")


PARALLEL_VALUES = 1 << 16  # from this many values the float SiLU runs on all threads


def activation(name: str, x: np.ndarray, threshold: float | None) -> np.ndarray:
    """The FFN activation ``name`` of ``x`` (``threshold``: FATReLU's, a part of the model)."""
    if name == "relu":
        return np.maximum(x, 0)
    if name == "relu2":
        r = np.maximum(x, 0)
        return r * r
    if name == "fatrelu":
        return np.where(x > (threshold or 0.0), x, 0).astype(np.float32)
    if name == "silu":  # a prompt's (T × d_ffn) on all threads: the same bits (runtime.ops.silu_chunks)
        f = ops.silu_chunks if x.size >= PARALLEL_VALUES else ops.silu
        return f(np.ascontiguousarray(x, np.float32).reshape(-1)).reshape(x.shape)
    if name == "gelu":  # exact (erf) GELU, as HF "gelu"
        return ops.gelu_erf(np.ascontiguousarray(x, np.float32).reshape(-1)).reshape(x.shape)
    if name == GGML_GELU:  # the int8 arithmetic's GELU: llama.cpp's (ops.gelu_ggml)
        return ops.gelu_ggml(x)
    if name == GGML_SILU:
        return ggml_ops.silu_mul(x, np.ones_like(x))
    if name in ("gelu_new", "gelu_pytorch_tanh", "gelu_fast"):
        return ops.gelu_tanh(np.ascontiguousarray(x, np.float32).reshape(-1)).reshape(x.shape)
    raise UnsupportedArchitectureError(f"FFN activation '{name}' is not supported by the runtime.")
