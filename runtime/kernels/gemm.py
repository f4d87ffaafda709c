"""Many tokens at once (a prompt, a perplexity window, a calibration text): each weight block
decoded once per matmul, not once per token.

The per-token kernels (``mm_b32_int8``, ``mm_kq_int8``, ``mm_b32``, ``mm_kq``) are built for
decode, where the weights stream from DRAM once per token and decoding them is free beside the
read. With T tokens they decode every block T times: on the real Gemma 3 270M Q4_K_M a 512-token
prompt spent 2.2 of 3.1 s in them (2-core Xeon, AMX, 2026-11-27). Here the stored rows are
decoded in chunks of at most ``CHUNK_VALUES`` values (into a buffer that stays in L2/L3) and the
chunk is multiplied by all T tokens in one float32 GEMM (numpy's BLAS), so the decode is paid
once per matmul and the products run at the BLAS's matrix-matrix rate.

The arithmetic is the caller's, to float32 rounding:

* "float": X times the decoded weights, what ``mm_block`` computes (in another summation order);
* "int8": X quantized to the activation blocks the int8 kernels use (Q8_0 / Q8_1 / Q8_K, the same
  ``quantize_activations*`` calls) and decoded back, d_x·q_x, times the decoded weights d_w·q_w:
  Σ_b d_w·d_x·Σ q_w·q_x written as one sum of products, so the 8-bit rounding of the activations
  (the int8 arithmetic's error against float) is kept exactly. What differs is float32 rounding
  of the sum, and, for the affine types (Q4_1, Q5_1), the minimum's term: m_w·d_x·Σq_x here, where
  ggml multiplies m_w by the fp16 rounding of that block sum (Q8_1's s).

Why not integer tiles (VNNI, AMX): an int8 GEMM cannot apply a scale per 32-value block of the
inner dimension, so it splits into k/32 GEMMs of depth 32 whose outputs are each scaled and
summed: the tiles would have to be written by hand (as llama.cpp's tinyBLAS / AMX kernels are),
and the float32 BLAS already runs at llama.cpp's batched rate here (measured by
benchmarks/prefill_vs_llamacpp.py).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from aios.quant import QK_K
from runtime.kernels.blocks32 import QK
from runtime.kernels.quantize import EXACT_MAX, round_f16

# values decoded per chunk: 16 MB of float32, small beside the output head's 168 M values (the
# real Gemma's 262,144 × 640) and whole for any layer matrix up to 4096 × 4096
CHUNK_VALUES = 1 << 22




@njit(parallel=True, fastmath=EXACT_MAX, cache=True)
def q8_0_values(X):
    """X rounded as ``quantize_activations`` rounds it, as values: per block of 32, d = max|x|/127,
    q = rint(x·(127/max|x|)), d rounded to fp16, X̂ = fp16(d)·q (what the Q8_0 and Q8_1 blocks
    stand for; the int8 quants are never stored). The same float32 operations (fastmath only as
    EXACT_MAX allows)."""
    T, k = X.shape
    out = np.empty((T, k), np.float32)
    for t in prange(T):
        for b in range(k // QK):
            o = b * QK
            amax = np.float32(0.0)
            for i in range(QK):
                amax = max(amax, abs(X[t, o + i]))
            d = round_f16(amax / np.float32(127.0))
            inv = np.float32(127.0) / amax if amax != 0 else np.float32(0.0)
            for i in range(QK):
                out[t, o + i] = d * np.float32(np.rint(X[t, o + i] * inv))
    return out


@njit(parallel=True, fastmath=EXACT_MAX, cache=True)
def q8_k_values(X):
    """X rounded as ``quantize_q8_k`` rounds it (blocks of 256: the value of largest magnitude m,
    iscale = −127/m, q = min(127, rint(iscale·x)), d = 1/iscale), as values d·q."""
    T, k = X.shape
    out = np.empty((T, k), np.float32)
    for t in prange(T):
        for b in range(k // QK_K):
            o = b * QK_K
            amax = np.float32(0.0)
            for i in range(QK_K):
                amax = max(amax, abs(X[t, o + i]))
            mx = np.float32(0.0)
            for i in range(QK_K):  # the first value of that magnitude, as quantize_q8_k picks it
                if abs(X[t, o + i]) == amax:
                    mx = X[t, o + i]
                    break
            if amax == 0:
                for i in range(QK_K):
                    out[t, o + i] = 0.0
                continue
            iscale = np.float32(-127.0) / mx
            d = np.float32(1.0) / iscale
            for i in range(QK_K):
                out[t, o + i] = d * np.float32(min(127, np.int32(np.rint(iscale * X[t, o + i]))))
    return out


_SCRATCH: list[np.ndarray] = []  # the decoded rows' buffer, kept: a fresh 5 MB np.empty per matmul
# is fresh pages from the kernel, each faulted in on first write (0.14 s of a 1.1 s prompt here)


def _scratch(n: int) -> np.ndarray:
    """n float32 values of the module's reusable buffer (grown when a call needs more)."""
    if not _SCRATCH or _SCRATCH[0].size < n:
        _SCRATCH[:] = [np.empty(n, np.float32)]
    return _SCRATCH[0][:n]


def gemm_rows(W: np.ndarray, X: np.ndarray, Y: np.ndarray, decode) -> None:
    """Y (T, n) = X (T, k) @ Ŵᵀ, Ŵ the rows of W decoded by ``decode(W[r0:r1], out)`` (float32
    (r1 − r0, k)) in chunks of at most CHUNK_VALUES values, each chunk times all of X in one GEMM."""
    n, k = Y.shape[1], X.shape[1]
    step = max(1, min(n, CHUNK_VALUES // k))
    buf = _scratch(step * k).reshape(step, k)
    for r0 in range(0, n, step):
        r1 = min(n, r0 + step)
        chunk = buf[: r1 - r0]
        decode(W[r0:r1], chunk)
        if r1 - r0 == n:
            np.matmul(X, chunk.T, out=Y)
        else:
            Y[:, r0:r1] = X @ chunk.T
