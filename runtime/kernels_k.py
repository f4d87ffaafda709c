"""numba kernels for ggml's K-quants: Y[t, i] = Σ_j W[i, j] · X[t, j] over chosen rows.

Weights stay as the GGUF stores them (uint8 rows of 256-value super-blocks: Q2_K 84 B,
Q4_K 144 B, Q6_K 210 B) and are decoded in registers, so the bytes a kernel reads are the
stored bytes the byte counter reports; each row is read once per call whatever T.

Affine types (Q2_K, Q4_K) compute d·s·Σ q·x − dmin·m·Σ x per sub-block; the Σ x per
sub-block (``xsum``) is computed once per call and shared by all rows.

Hand-written for the same reason as ``runtime/kernels.py``: nothing maintained multiplies
GGUF blocks from Python without dequantizing the whole matrix first.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

QK_K = 256
BLOCK_BYTES = {"Q2_K": 84, "Q4_K": 144, "Q6_K": 210}


def xsum(X: np.ndarray, sub: int) -> np.ndarray:
    """(T, k) -> (T, k/sub) sums of each sub-block of the input."""
    return X.reshape(X.shape[0], -1, sub).sum(axis=2, dtype=np.float32)


@njit(parallel=True, fastmath=True, cache=True)
def mm_q4_k(W, lut, X, xs, rows, Y):  # W (n, k/256·144) uint8; xs (T, k/32) f32
    T, k = X.shape
    nsb = k // QK_K
    for ii in prange(rows.shape[0]):
        i = rows[ii]
        for t in range(T):
            acc = np.float32(0.0)
            for b in range(nsb):
                o = b * 144
                d = lut[np.int64(W[i, o]) | (np.int64(W[i, o + 1]) << 8)]
                dmin = lut[np.int64(W[i, o + 2]) | (np.int64(W[i, o + 3]) << 8)]
                for j in range(8):
                    if j < 4:
                        sc = W[i, o + 4 + j] & 63
                        m = W[i, o + 8 + j] & 63
                    else:
                        sc = (W[i, o + 8 + j] & 15) | ((W[i, o + j] >> 6) << 4)
                        m = (W[i, o + 8 + j] >> 4) | ((W[i, o + 4 + j] >> 6) << 4)
                    q0 = o + 16 + 32 * (j // 2)
                    sh = 4 * (j % 2)
                    x0 = b * QK_K + 32 * j
                    s = np.float32(0.0)
                    for l in range(32):
                        s += np.float32((W[i, q0 + l] >> sh) & 15) * X[t, x0 + l]
                    acc += d * np.float32(sc) * s - dmin * np.float32(m) * xs[t, b * 8 + j]
            Y[t, i] = acc


@njit(parallel=True, fastmath=True, cache=True)
def mm_q2_k(W, lut, X, xs, rows, Y):  # W (n, k/256·84) uint8; xs (T, k/16) f32
    T, k = X.shape
    nsb = k // QK_K
    for ii in prange(rows.shape[0]):
        i = rows[ii]
        for t in range(T):
            acc = np.float32(0.0)
            for b in range(nsb):
                o = b * 84
                d = lut[np.int64(W[i, o + 80]) | (np.int64(W[i, o + 81]) << 8)]
                dmin = lut[np.int64(W[i, o + 82]) | (np.int64(W[i, o + 83]) << 8)]
                for h in range(2):  # value 128h + 32s + l sits in qs[32h + l] at bit 2s
                    for sft in range(4):
                        for half in range(2):
                            j = 8 * h + 2 * sft + half  # 16-value sub-block
                            sc = W[i, o + j]
                            x0 = b * QK_K + 16 * j
                            q0 = o + 16 + 32 * h + 16 * half
                            s = np.float32(0.0)
                            for l in range(16):
                                s += np.float32((W[i, q0 + l] >> (2 * sft)) & 3) * X[t, x0 + l]
                            acc += d * np.float32(sc & 15) * s - dmin * np.float32(sc >> 4) * xs[t, b * 16 + j]
            Y[t, i] = acc


@njit(parallel=True, fastmath=True, cache=True)
def mm_q6_k(W, lut, X, rows, Y):  # W (n, k/256·210) uint8
    T, k = X.shape
    nsb = k // QK_K
    for ii in prange(rows.shape[0]):
        i = rows[ii]
        for t in range(T):
            acc = np.float32(0.0)
            for b in range(nsb):
                o = b * 210
                d = lut[np.int64(W[i, o + 208]) | (np.int64(W[i, o + 209]) << 8)]
                for h in range(2):
                    for g in range(4):  # value 128h + 32g + l
                        sft = 4 * (g // 2)
                        p0 = o + 64 * h + 32 * (g % 2)  # low nibble: ql[64h + p], p = 32(g%2) + l
                        h0 = o + 128 + 32 * h  # high 2 bits: qh[32h + l] at bit 2g
                        x0 = b * QK_K + 128 * h + 32 * g
                        for half in range(2):
                            sc = np.int32(W[i, o + 192 + 8 * h + 2 * g + half])
                            if sc > 127:
                                sc -= 256
                            s = np.float32(0.0)
                            for l in range(16 * half, 16 * half + 16):
                                lo = np.int32((W[i, p0 + l] >> sft) & 15)
                                q = lo | (np.int32((W[i, h0 + l] >> (2 * g)) & 3) << 4)
                                s += np.float32(q - 32) * X[t, x0 + l]
                            acc += d * np.float32(sc) * s
            Y[t, i] = acc
