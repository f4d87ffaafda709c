"""numba kernels: Y[t, i] = Σ_j W[i, j] · X[t, j] over a chosen set of rows, per storage type.

Weights stay in their stored precision and are decoded in registers (F16/BF16 through a
65536-entry lookup table, Q8_0/Q4_0 block by block), so the bytes a kernel reads are the
bytes the byte counter reports. Each weight row is read once per call whatever the number
of tokens T (chunked prefill reuses it across the chunk).

Hand-written because no maintained library multiplies GGUF block formats on the CPU
from Python without dequantizing the whole matrix first (which would triple the traffic).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

QK = 32  # elements per Q8_0 / Q4_0 block

LUT_F16 = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
LUT_BF16 = (np.arange(65536, dtype=np.uint32) << 16).view(np.float32)


@njit(parallel=True, fastmath=True, cache=True)
def mm_f32(W, X, rows, Y):  # W (n, k) f32; X (T, k); rows (r,) int64; Y (T, n)
    T, k = X.shape
    for ii in prange(rows.shape[0]):
        i = rows[ii]
        for t in range(T):
            acc = np.float32(0.0)
            for j in range(k):
                acc += W[i, j] * X[t, j]
            Y[t, i] = acc


@njit(parallel=True, fastmath=True, cache=True)
def mm_u16(W, lut, X, rows, Y):  # W (n, k) uint16 (F16 or BF16 bits)
    T, k = X.shape
    for ii in prange(rows.shape[0]):
        i = rows[ii]
        for t in range(T):
            acc = np.float32(0.0)
            for j in range(k):
                acc += lut[W[i, j]] * X[t, j]
            Y[t, i] = acc


# Block kernels keep 32 independent partial sums (one per lane of a block) instead of one
# running sum: the lanes carry no dependency, so LLVM vectorizes the int8 → f32 decode and
# the multiply-add across them (about 7× faster than a scalar reduction per block).


@njit(parallel=True, fastmath=True, cache=True)
def mm_q8_0(qs, d, lut, X, rows, Y):  # qs (n, k) int8; d (n, k/32) fp16 bits (uint16)
    T, k = X.shape
    nb = k // 32
    for ii in prange(rows.shape[0]):
        i = rows[ii]
        q = qs[i].reshape(nb, 32)
        di = d[i]
        lanes = np.zeros(32, np.float32)
        for t in range(T):
            x = X[t].reshape(nb, 32)
            lanes[:] = 0
            for b in range(nb):
                qb = q[b]
                xb = x[b]
                sc = lut[di[b]]
                for u in range(32):
                    lanes[u] += np.float32(qb[u]) * sc * xb[u]
            Y[t, i] = lanes.sum()


@njit(parallel=True, fastmath=True, cache=True)
def mm_q4_0(qs, d, lut, X, rows, Y):  # qs (n, k/2) uint8 packed as in GGUF; d (n, k/32) fp16 bits
    T, k = X.shape
    nb = k // 32
    for ii in prange(rows.shape[0]):
        i = rows[ii]
        q = qs[i].reshape(nb, 16)
        di = d[i]
        lanes = np.zeros(32, np.float32)
        for t in range(T):
            x = X[t].reshape(nb, 32)
            lanes[:] = 0
            for b in range(nb):
                qb = q[b]
                xb = x[b]
                sc = lut[di[b]]
                for u in range(16):
                    byte = np.int32(qb[u])
                    lanes[u] += np.float32((byte & 15) - 8) * sc * xb[u]
                    lanes[u + 16] += np.float32((byte >> 4) - 8) * sc * xb[u + 16]
            Y[t, i] = lanes.sum()


@njit(parallel=True, fastmath=True, cache=True)
def sparse_rows_f32(Wt, a, active, y):  # Wt (d_ffn, n) f32; y[c] = Σ_{j∈active} a[j]·Wt[j, c]
    n = Wt.shape[1]
    nchunks = (n + 255) // 256
    for c in prange(nchunks):
        c0 = c * 256
        c1 = min(n, c0 + 256)
        for col in range(c0, c1):
            y[col] = 0.0
        for jj in range(active.shape[0]):
            j = active[jj]
            aj = a[j]
            for col in range(c0, c1):
                y[col] += aj * Wt[j, col]


@njit(parallel=True, fastmath=True, cache=True)
def sparse_rows_u16(Wt, lut, a, active, y):  # Wt (d_ffn, n) uint16
    n = Wt.shape[1]
    nchunks = (n + 255) // 256
    for c in prange(nchunks):
        c0 = c * 256
        c1 = min(n, c0 + 256)
        for col in range(c0, c1):
            y[col] = 0.0
        for jj in range(active.shape[0]):
            j = active[jj]
            aj = a[j]
            for col in range(c0, c1):
                y[col] += aj * lut[Wt[j, col]]
