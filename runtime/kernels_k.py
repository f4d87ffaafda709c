"""numba kernels for ggml's K-quants: Y[t, i] = Σ_j W[i, j] · X[t, j] over chosen rows.

Weights stay as the GGUF stores them (uint8 rows of 256-value super-blocks: Q2_K 84 B,
Q4_K 144 B, Q6_K 210 B) and are decoded in registers, so the bytes a kernel reads are the
stored bytes the byte counter reports; each row is read once per call whatever T.

Affine types (Q2_K, Q4_K) compute d·s·Σ q·x − dmin·m·Σ x per sub-block; the Σ x per
sub-block (``xsum``) is computed once per call and shared by all rows.

Hand-written for the same reason as ``runtime/kernels.py``: nothing maintained multiplies
GGUF blocks from Python without dequantizing the whole matrix first. The kernels themselves
live in ``runtime/kernels.py`` beside the SIMD intrinsics they are built from (numba's cache
only watches the file that defines a kernel); this module keeps the K-quant constants and
the per-sub-block input sums.
"""

from __future__ import annotations

import numpy as np

from aios.quant import QK_K, type_size
from runtime.kernels import mm_q2_k, mm_q4_k, mm_q6_k  # noqa: F401  (re-exported)

TYPES = ("Q2_K", "Q4_K", "Q6_K")
BLOCK_BYTES = {t: type_size(t) for t in TYPES}  # bytes per super-block, from gguf-py's table
# values per sub-block whose Σx the affine kernels subtract (ggml's block_q2_K: 16 scales,
# block_q4_K: 8 per super-block)
SUB_BLOCK = {"Q2_K": QK_K // 16, "Q4_K": QK_K // 8}


def xsum(X: np.ndarray, sub: int) -> np.ndarray:
    """(T, k) -> (T, k/sub) sums of each sub-block of the input."""
    return X.reshape(X.shape[0], -1, sub).sum(axis=2, dtype=np.float32)
