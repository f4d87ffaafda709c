"""llama.cpp's own summation order for one token's K-quant dot products (the "llamacpp" arithmetic).

The int8 arithmetic computes what llama.cpp computes (the same 8-bit activation blocks, the same
integer products) but sums the float terms in the order our fastest kernels like; the results
differ from llama.cpp's in the last bits, and on a model with near-tied logits (the real Gemma 3
270M) that moves top-1 at some positions. The "llamacpp" arithmetic (runtime.kernels.dispatch)
runs, per tensor type, a kernel that sums exactly as llama.cpp's CPU backend does on its plain
buffers: the K-quant row tiles (llama.cpp's tiled kernel, from 8 tokens), the 32-value types'
blockwise kernels (its vec_dot_*_q8_0 and tinyBLAS_Q0), and for one token of Q4_K, Q5_K and Q6_K the
kernels below, which mirror ggml_vec_dot_q4_K_q8_K / q5_K_q8_K / q6_K_q8_K of
ggml-cpu/arch/x86/quants.c (its __AVX2__ path, which AVX-512 builds compile too):

- the integer sums in 8 int32 lanes, lane l holding values 4l .. 4l+3 of every 32-value chunk
  (``_mm256_maddubs_epi16`` then ``_mm256_madd_epi16`` with the sub-block's scale), exact;
- Q6_K: minus 32·(bsum·scale) of sub-blocks 2l, 2l+1 in lane l (its ``q8sclsub``);
- per super-block one fma of the 8 lanes (converted to float) with d = f32(d_x·d_w);
- Q4_K: the minimums in 4 more lanes, lane k = m[2k]·Σ₃₂x[2k] + m[2k+1]·Σ₃₂x[2k+1], fma'd with
  dmin = f32(−d_x·dmin_w);
- Q5_K: the minimums as one exact integer per super-block, fma'd with dmin into one float;
- at the end ``hsum_float_8``: ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)), Q4_K plus the minimums'
  (m0+m2)+(m1+m3), Q5_K plus its minimums' float.

Plain numba loops, not vector intrinsics: this mode exists to reproduce llama.cpp, not to race
it. Hand-written because no library reproduces ggml's rounding order.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from aios.quant import QK_K
from runtime.kernels.blocks32_int import dot4_b32_int, dot4i_q8_0
from runtime.kernels.groups import AHEAD, group4, row_at, row_count, store_group
from runtime.kernels.ir_helpers import fma32
from runtime.kernels.kq_row_tiles import scale_min_k4
from runtime.kernels.kq_tiles import f16_le
from runtime.kernels.kquants import Q4K_QS, Q4K_SCALES, Q5K_QH, Q5K_QS, Q6K_D, Q6K_QH, Q6K_SCALES
from runtime.kernels.type_traits import names

# the rows of runtime.kernels.type_traits with a ``ggml_kind``, in that kind's order
GGML_KQ_TYPES = names("kq", by="ggml_kind")  # one-token K-quant dot products mirrored here
GGML_KQ_KIND = {t: i for i, t in enumerate(GGML_KQ_TYPES)}
# 32-value types whose blockwise kernel (blocks32.BLOCKWISE's order: each block's signed integer
# dot in 8 int32 lanes, one fma per block, then hsum) is llama.cpp's for any number of tokens
# (vec_dot_*_q8_0 and tinyBLAS_Q0_AVX alike). Q8_0's default kernel already sums so; Q4_0 and
# Q5_0 get blockwise twins here (their default quad kernels add the offset as a float term).
GGML_B32_TYPES = names("b32", by="ggml_kind")
GGML_B32_KIND = {t: i for i, t in enumerate(GGML_B32_TYPES)}
dot4i_q4_0_ggml, dot4i_q5_0_ggml = dot4_b32_int("q4_0", blockwise=True), dot4_b32_int("q5_0", blockwise=True)
_F32 = np.float32


@njit(cache=True, inline="always")
def _hsum8(a):  # ggml's hsum_float_8
    return _F32(_F32(_F32(a[0] + a[4]) + _F32(a[2] + a[6])) + _F32(_F32(a[1] + a[5]) + _F32(a[3] + a[7])))


@njit(cache=True, inline="always")
def _lanes(acc32, lanes):  # the 32 per-value-offset sums into ggml's 8 lanes of 4 offsets
    for lane in range(8):
        lanes[lane] += (acc32[4 * lane] + acc32[4 * lane + 1]) + (acc32[4 * lane + 2] + acc32[4 * lane + 3])


@njit(cache=True)
def dot_q4_k_ggml(p, xq, xd, xb, nsb, lanes, acc, accm, acc32):
    """One row p (the file's Q4_K super-blocks) · one token's Q8_K blocks, as ggml_vec_dot_q4_K_q8_K.
    The integer sums are exact, so they are formed per offset within the 32-value chunks (a loop
    LLVM vectorizes) and only then gathered into ggml's lanes."""
    acc[:] = 0
    accm[:] = 0
    for i in range(nsb):
        o = i * 144
        d = _F32(xd[i] * f16_le(p, o))
        dmin = _F32(-xd[i] * f16_le(p, o + 2))
        sc = p[o + Q4K_SCALES: o + Q4K_SCALES + 12]
        for k in range(4):
            _, m0 = scale_min_k4(sc, 2 * k)
            _, m1 = scale_min_k4(sc, 2 * k + 1)
            b = i * 16 + 4 * k  # bsums of 16 values: sub-block 2k is 4k, 4k + 1; 2k + 1 is 4k + 2, 4k + 3
            prod = m0 * (np.int32(xb[b]) + np.int32(xb[b + 1])) + m1 * (np.int32(xb[b + 2]) + np.int32(xb[b + 3]))
            accm[k] = fma32(dmin, _F32(prod), accm[k])
        acc32[:] = 0
        for j in range(4):  # 64 values: 32 bytes, low nibbles sub-block 2j, high ones 2j + 1
            s_lo, _ = scale_min_k4(sc, 2 * j)
            s_hi, _ = scale_min_k4(sc, 2 * j + 1)
            q = o + Q4K_QS + 32 * j
            x = i * QK_K + 64 * j
            for v in range(32):
                w = np.int32(p[q + v])
                acc32[v] += s_lo * (w & 15) * np.int32(xq[x + v]) + s_hi * (w >> 4) * np.int32(xq[x + 32 + v])
        lanes[:] = 0
        _lanes(acc32, lanes)
        for lane in range(8):
            acc[lane] = fma32(d, _F32(lanes[lane]), acc[lane])
    return _F32(_hsum8(acc) + _F32(_F32(accm[0] + accm[2]) + _F32(accm[1] + accm[3])))


@njit(cache=True)
def dot_q5_k_ggml(p, xq, xd, xb, nsb, lanes, acc, acc32):
    """One row p (the file's Q5_K super-blocks) · one token's Q8_K blocks, as ggml_vec_dot_q5_K_q8_K:
    Q4_K's lanes with each value's fifth bit from qh; the minimums as one exact integer sum
    (its hadd of the 4 lanes), fma'd with dmin into a scalar added after hsum_float_8 (GCC
    contracts its ``summs += dmin * sum`` into that fma)."""
    acc[:] = 0
    summs = _F32(0.0)
    for i in range(nsb):
        o = i * 176
        d = _F32(xd[i] * f16_le(p, o))
        dmin = _F32(-xd[i] * f16_le(p, o + 2))
        sc = p[o + Q4K_SCALES: o + Q4K_SCALES + 12]
        msum = np.int32(0)
        for k in range(8):
            _, m = scale_min_k4(sc, k)
            msum += m * (np.int32(xb[i * 16 + 2 * k]) + np.int32(xb[i * 16 + 2 * k + 1]))
        summs = fma32(dmin, _F32(msum), summs)
        acc32[:] = 0
        for j in range(4):  # 64 values: low nibbles sub-block 2j (fifth bit: qh bit 2j), high ones 2j + 1
            s_lo, _ = scale_min_k4(sc, 2 * j)
            s_hi, _ = scale_min_k4(sc, 2 * j + 1)
            q = o + Q5K_QS + 32 * j
            h = o + Q5K_QH
            x = i * QK_K + 64 * j
            b_lo, b_hi = np.int32(2 * j), np.int32(2 * j + 1)
            for v in range(32):
                w = np.int32(p[q + v])
                hb = np.int32(p[h + v])
                lo = (w & 15) | (((hb >> b_lo) & 1) << 4)
                hi = (w >> 4) | (((hb >> b_hi) & 1) << 4)
                acc32[v] += s_lo * lo * np.int32(xq[x + v]) + s_hi * hi * np.int32(xq[x + 32 + v])
        lanes[:] = 0
        _lanes(acc32, lanes)
        for lane in range(8):
            acc[lane] = fma32(d, _F32(lanes[lane]), acc[lane])
    return _F32(_hsum8(acc) + summs)


@njit(cache=True)
def dot_q6_k_ggml(p, xq, xd, xb, nsb, lanes, acc, acc32):
    """One row p (the file's Q6_K super-blocks) · one token's Q8_K blocks, as ggml_vec_dot_q6_K_q8_K
    (the integer sums formed per offset first, as ``dot_q4_k_ggml``)."""
    acc[:] = 0
    for i in range(nsb):
        o = i * 210
        d = _F32(xd[i] * f16_le(p, o + Q6K_D))
        acc32[:] = 0
        for h in range(2):  # 128 values each: ql[64], qh[32]
            for part in range(4):  # 32 values: ql's low nibbles (0-31, 32-63), then its high ones
                x = i * QK_K + 128 * h + 32 * part
                ql = o + 64 * h + 32 * (part % 2)
                qh = o + Q6K_QH + 32 * h
                shift, hshift = np.int32(4 * (part // 2)), np.int32(2 * part)
                s0 = np.int32(np.int8(p[o + Q6K_SCALES + 8 * h + 2 * part]))  # values 0-15
                s1 = np.int32(np.int8(p[o + Q6K_SCALES + 8 * h + 2 * part + 1]))  # values 16-31
                for v in range(32):
                    q6 = ((np.int32(p[ql + v]) >> shift) & 15) | (((np.int32(p[qh + v]) >> hshift) & 3) << 4)
                    acc32[v] += (s0 if v < 16 else s1) * q6 * np.int32(xq[x + v])
        for lane in range(8):  # q8sclsub: 32 · (bsum · scale) of 16-value sub-blocks 2l and 2l + 1
            s0 = np.int32(np.int8(p[o + Q6K_SCALES + 2 * lane]))
            s1 = np.int32(np.int8(p[o + Q6K_SCALES + 2 * lane + 1]))
            lanes[lane] = -32 * (np.int32(xb[i * 16 + 2 * lane]) * s0 + np.int32(xb[i * 16 + 2 * lane + 1]) * s1)
        _lanes(acc32, lanes)
        for lane in range(8):
            acc[lane] = fma32(d, _F32(lanes[lane]), acc[lane])
    return _hsum8(acc)


@njit(parallel=True, cache=True)
def mm_kq_ggml(W, xq, xd, xb, rows, Y, kind):
    """Y[t, rows] = W[rows] · x_t for every token t (x as Q8_K: quants, d, 16-value sums), each dot
    product summed as llama.cpp's one-token kernel of GGML_KQ_TYPES[kind] sums it."""
    T = xq.shape[0]
    nsb = xd.shape[1]
    n = row_count(rows, W)
    for r in prange(n):
        lanes = np.zeros(8, np.int32)
        acc = np.zeros(8, _F32)
        accm = np.zeros(4, _F32)
        acc32 = np.zeros(32, np.int32)
        row = row_at(rows, r)
        for t in range(T):
            if kind == 0:
                Y[t, row] = dot_q4_k_ggml(W[row], xq[t], xd[t], xb[t], nsb, lanes, acc, accm, acc32)
            elif kind == 1:
                Y[t, row] = dot_q6_k_ggml(W[row], xq[t], xd[t], xb[t], nsb, lanes, acc, acc32)
            else:
                Y[t, row] = dot_q5_k_ggml(W[row], xq[t], xd[t], xb[t], nsb, lanes, acc, acc32)


@njit(parallel=True, cache=True)
def mm_b32_ggml(W, xq, xd, xs, rows, Y, kind):
    """Y[t, rows] = W[rows] · x_t for every token t (x as Q8_0 blocks), the blocks of
    GGML_B32_TYPES[kind] summed in llama.cpp's order: ``mm_b32_int8``'s loop over the blockwise
    kernels. A loop of its own rather than two more kinds in ``mm_b32_int8``: that kernel is
    compiled into every decode step (runtime.decode_block), whose cold start would then compile
    two more intrinsics that only this arithmetic uses."""
    T = xq.shape[0]
    nb = xd.shape[1]
    n = row_count(rows, W)
    for g in prange((n + 3) // 4):
        i0, i1, i2, i3 = group4(rows, n, g)
        n0, n1, n2, n3 = group4(rows, n, g + AHEAD)
        for t in range(T):
            if kind == 0:
                y = dot4i_q8_0(W[i0], W[i1], W[i2], W[i3], W[n0], W[n1], W[n2], W[n3], xq[t], xd[t], xs[t], nb)
            elif kind == 1:
                y = dot4i_q4_0_ggml(W[i0], W[i1], W[i2], W[i3], W[n0], W[n1], W[n2], W[n3], xq[t], xd[t], xs[t], nb)
            else:
                y = dot4i_q5_0_ggml(W[i0], W[i1], W[i2], W[i3], W[n0], W[n1], W[n2], W[n3], xq[t], xd[t], xs[t], nb)
            store_group(Y, t, rows, n, 4 * g, 1, y)
