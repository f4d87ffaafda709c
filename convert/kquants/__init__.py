"""K-quant encoders: float32 rows -> ggml's Q2_K, Q3_K, Q4_K, Q5_K and Q6_K block bytes.

gguf-py decodes the K-quants but cannot encode them, and llama.cpp's encoder is C behind a
model-file API; these are our own encoders. The bytes follow ggml's ``block_q*_K`` layouts
(super-blocks of 256 values), so ``gguf.quants.dequantize`` and llama.cpp read them back.

Formats (value = what a decoder computes; d, dmin are fp16 per super-block):

    q2_k  16 × 16 values, q ∈ 0..3,   4-bit scale s and min m:  d·s·q − dmin·m     84 B
    q3_k  16 × 16 values, q ∈ −4..3,  6-bit signed scale s:     d·s·q             110 B
    q4_k   8 × 32 values, q ∈ 0..15,  6-bit scale s and min m:  d·s·q − dmin·m    144 B
    q5_k   8 × 32 values, q ∈ 0..31,  6-bit scale s and min m:  d·s·q − dmin·m    176 B
    q6_k  16 × 16 values, q ∈ −32..31, 8-bit signed scale s:    d·s·q             210 B

The search (``search``: numba, per sub-block sweeps and least-squares fits, then per
super-block coordinate descent on the reconstruction error) finds each block's integer fields;
``pack`` lays them out as ggml's bytes (vectorized numpy).

``imatrix`` (per-column importances, e.g. calibration mean squares of the layer's input)
weights the squared error, so columns that see large activations are reproduced better.

Out of range: non-finite input is refused; magnitudes beyond what fp16 super-scales can
express saturate (d = 65504) instead of producing inf; values far below fp16's smallest
subnormal (6e-8 per level step) decode to zero, as in ggml.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from aios import quant
from aios.errors import UsageError
from aios.quant import QK_K
from convert.kquants.pack import PACK
from convert.kquants.search import AFFINE, SYMMETRIC, encode_affine, encode_symmetric

TYPES = ("q2_k", "q3_k", "q4_k", "q5_k", "q6_k")
BLOCK_BYTES = {t: quant.type_size(t) for t in TYPES}  # bytes per super-block (gguf-py's table)


def row_bytes(n_cols: int, type_name: str) -> int:
    """Bytes one row of ``n_cols`` values takes in ``type_name``."""
    return n_cols // QK_K * BLOCK_BYTES[type_name]


def quantize(x: np.ndarray, type_name: str, imatrix: np.ndarray | None = None) -> np.ndarray:
    """Encode float32 rows ``x`` (n_rows, n_cols) -> uint8 (n_rows, row_bytes) in ggml's layout.

    ``n_cols`` must be a multiple of 256. ``imatrix`` (n_cols,), optional, non-negative:
    per-column weights of the squared error. Deterministic: same input, same bytes.
    """
    t = type_name.lower()
    if t not in TYPES:
        raise UsageError(f"K-quant type must be one of {', '.join(TYPES)}, not '{type_name}'.")
    x = np.asarray(x)
    if x.ndim != 2:
        raise UsageError(f"quantize needs a 2-D array (rows, columns), got shape {x.shape}.")
    n_rows, n_cols = x.shape
    if n_cols % QK_K or n_cols == 0:
        raise UsageError(f"{quant.qtype(t).name} needs rows whose length is a multiple of {QK_K}; "
                         f"got {n_cols}.")
    x = np.ascontiguousarray(x, dtype=np.float32)
    if not np.isfinite(x).all():
        raise UsageError("The tensor to quantize contains NaN or infinite values.")
    wb = _weights(imatrix, n_cols).reshape(-1, QK_K)  # (n_cols/256, 256): one per column block
    if t in AFFINE:
        fields = _threaded(encode_affine, x, wb, AFFINE[t])  # d, dmin, scale codes, min codes, levels
    else:
        fields = _threaded(encode_symmetric, x, wb, SYMMETRIC[t])  # d, scale codes, levels
    blocks = PACK[t](*fields)
    assert blocks.shape == (n_rows * n_cols // QK_K, BLOCK_BYTES[t]), blocks.shape
    return blocks.reshape(n_rows, row_bytes(n_cols, t))


def dequantize(q: np.ndarray, type_name: str) -> np.ndarray:
    """uint8 (n_rows, row_bytes) -> float32 (n_rows, n_cols), by gguf-py's decoder."""
    from gguf.quants import dequantize as gguf_dequantize

    return gguf_dequantize(q, quant.qtype(type_name))


def _threaded(fn, x: np.ndarray, wb: np.ndarray, params: tuple) -> list[np.ndarray]:
    """Run the numba encoder over row chunks on all cores (it releases the GIL); same bytes
    whatever the thread count, since every super-block is encoded independently."""
    n_rows = x.shape[0]
    n_threads = max(1, min(os.cpu_count() or 1, n_rows, x.size // (64 * QK_K) or 1))
    bounds = np.linspace(0, n_rows, n_threads + 1).astype(int)

    def run(i: int):
        return fn(x[bounds[i]:bounds[i + 1]].reshape(-1, QK_K), wb, *params)

    if n_threads == 1:
        return list(run(0))
    with ThreadPoolExecutor(n_threads) as ex:
        parts = list(ex.map(run, range(n_threads)))
    return [np.concatenate(f) for f in zip(*parts)]


def _weights(imatrix: np.ndarray | None, n_cols: int) -> np.ndarray:
    if imatrix is None:
        return np.ones(n_cols, np.float32)
    w = np.asarray(imatrix, dtype=np.float64).reshape(-1)
    if w.shape[0] != n_cols or not np.isfinite(w).all() or (w < 0).any() or not w.any():
        raise UsageError(f"imatrix must hold {n_cols} finite, non-negative importances, not all zero.")
    w = w / w.mean()
    return np.maximum(w, 1e-6).astype(np.float32)  # a never-seen column still gets a tiny say



# --- llama.cpp's own encoder, for parity tests and the benchmark ---------------------------


def llama_cpp_quantize(x: np.ndarray, type_name: str, imatrix: np.ndarray | None = None) -> np.ndarray:
    """The same rows encoded by llama.cpp's ``ggml_quantize_chunk`` (the library bundled
    with llama-cpp-python), in the same (n_rows, row_bytes) layout as :func:`quantize`. Runs in
    a child process (``aios.reference.llamacpp``), like every use of llama.cpp as a reference."""
    from aios.reference import llamacpp

    x = np.ascontiguousarray(x, dtype=np.float32)
    return llamacpp.quantize_rows(x, type_name, int(quant.qtype(type_name)),
                                  row_bytes(x.shape[1], quant.outtype_name(type_name)), imatrix).value
