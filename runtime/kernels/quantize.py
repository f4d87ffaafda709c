"""The activations as int8 blocks, quantized as ggml does on x86: Q8_0 / Q8_1 (32 values, an
fp16 d; ``quantize_activations``) for the 32-value block types, Q8_K (256 values, a float d and
16-value group sums; ``quantize_activations_k``) for the K-quants."""

from __future__ import annotations

import numpy as np
from numba import njit, prange, types
from numba.extending import intrinsic

from aios.quant import QK_K
from runtime.kernels.blocks32 import QK
from runtime.kernels.ir_helpers import F32, HALF

MANY_TOKENS = 8  # tokens from which the activations are quantized on all threads


# no NaN/inf/signed-zero care, so the maxima and sums vectorize; no reassociation, contraction or
# reciprocal, so every product and quotient rounds as written (what ggml computes, tested bit for bit)
EXACT_MAX = {"nnan", "ninf", "nsz"}


@njit(fastmath=EXACT_MAX, cache=True)
def _q8_row(x, xq, xd, xs):
    """One row of ``quantize_q8``."""
    for b in range(xd.shape[0]):
        o = b * QK
        amax = np.float32(0.0)
        for i in range(QK):
            amax = max(amax, abs(x[o + i]))
        d = amax / np.float32(127.0)
        inv = np.float32(127.0) / amax if amax != 0 else np.float32(0.0)
        s = 0
        for i in range(QK):
            q = np.int32(np.rint(x[o + i] * inv))
            xq[o + i] = q
            s += q
        xd[b] = d
        xs[b] = np.float32(s)


@njit(cache=True)
def quantize_q8(X, xq, xd, xs):
    """Each row of X (T, k) as int8 blocks of QK: xq (T, k) int8, xd (T, k/QK) the scales d in
    float32, xs (T, k/QK) the quants' sums Σq. As ggml's x86 quantize_row_q8_0/q8_1 (AVX): d =
    max|x|/127, q = round half to even of x·(127/max|x|) (0 for an all-zero block); the fp16
    roundings ggml stores are ``quantize_activations``'s. Fastmath only as EXACT_MAX allows:
    the products stay as written, so numpy can repeat them. One thread (decode's one token);
    ``quantize_q8_rows`` spreads many tokens over the threads."""
    for t in range(X.shape[0]):
        _q8_row(X[t], xq[t], xd[t], xs[t])


@njit(parallel=True, cache=True)
def quantize_q8_rows(X, xq, xd, xs):
    """``quantize_q8`` with the tokens spread over the threads (a prompt's)."""
    for t in prange(X.shape[0]):
        _q8_row(X[t], xq[t], xd[t], xs[t])


@njit(cache=True)
def _quantize_q8_blocks(X):
    """(xq, xd, xs) of ``quantize_q8`` for X (T, k), k a multiple of QK, d and s in float32. Its
    own compiled function, called before the kernel: compiled as a callee of the fastmath kernel,
    d came out one ulp off ggml's max|x|/127 (measured)."""
    T, k = X.shape
    xq = np.empty((T, k), np.int8)
    xd = np.empty((T, k // QK), np.float32)
    xs = np.empty((T, k // QK), np.float32)
    if T >= MANY_TOKENS:
        quantize_q8_rows(X, xq, xd, xs)
    else:
        quantize_q8(X, xq, xd, xs)
    return xq, xd, xs


@intrinsic
def round_f16(typingctx, x):
    """float32 x rounded to fp16 and back: nearest even, as F16C's vcvtps2ph, ggml's
    FP32_TO_FP16 and numpy's astype(float16) (LLVM fptrunc/fpext; numba has no float16)."""
    def codegen(context, builder, signature, args):
        return builder.fpext(builder.fptrunc(args[0], HALF), F32)

    return types.float32(types.float32), codegen


# (runtime.decode_block calls it from inside its own compiled function too)
@njit(cache=True)
def quantize_q8_blocks(X, affine):
    """``quantize_activations`` in one compiled call: with d and s rounded to fp16 in numpy
    (astype) a call took 5.6 µs at k 4096 and 12.6 at 14336, in one call 4.0 and 9.9."""
    xq, xd, xs = _quantize_q8_blocks(X)
    for t in range(xd.shape[0]):
        for b in range(xd.shape[1]):
            d, isum = xd[t, b], xs[t, b]
            d16 = round_f16(d)
            xd[t, b] = d16
            xs[t, b] = round_f16(d * isum) if affine else d16 * isum
    return xq, xd, xs


def quantize_activations(X, affine: bool = False):
    """X (T, k) as ggml's block_q8_0 / block_q8_1 on x86: (xq int8 (T, k), d (T, k/QK), s
    (T, k/QK)) with d rounded to fp16 as ggml stores it and s the block's Σx as ggml's dot products
    see it: d·Σq for the Q8_0 partners (Q8_0, Q4_0, Q5_0, IQ4_NL; their kernels do not read it:
    ggml subtracts Q4_0/Q5_0's offset from the quants, and so do the kernels, in the integer
    lanes), and for the Q8_1 partners (``affine``: Q4_1, Q5_1) the stored fp16 of d·Σq taken
    before d's rounding, which their kernels read as float32."""
    return quantize_q8_blocks(X, affine)


@njit(fastmath=EXACT_MAX, cache=True)
def _q8_k_row(x, xq, xd, xb):
    """One row of ``quantize_q8_k``."""
    for b in range(xd.shape[0]):
        o = b * QK_K
        amax = np.float32(0.0)
        for i in range(QK_K):
            amax = max(amax, abs(x[o + i]))
        if amax == 0:
            for i in range(QK_K):
                xq[o + i] = 0
            for g in range(QK_K // 16):
                xb[b * (QK_K // 16) + g] = 0
            xd[b] = np.float32(0.0)
            continue
        mx = np.float32(0.0)
        for i in range(QK_K):  # the first value of that magnitude, as ggml's strict > keeps it
            if abs(x[o + i]) == amax:
                mx = x[o + i]
                break
        iscale = np.float32(-127.0) / mx
        for g in range(QK_K // 16):
            s = 0
            for i in range(16):
                q = min(127, np.int32(np.rint(iscale * x[o + 16 * g + i])))
                xq[o + 16 * g + i] = q
                s += q
            xb[b * (QK_K // 16) + g] = s
        xd[b] = np.float32(1.0) / iscale


@njit(parallel=True, cache=True)
def quantize_q8_k(X, xq, xd, xb):
    """Each row of X (T, k) as ggml's block_q8_K (quantize_row_q8_K reference): per block of
    QK_K, ``max`` the value of largest magnitude (the first one on ties), iscale = −127/max,
    q = nearest_int(iscale·x) (round half to even, as ggml's 1.5·2²³ trick), at most 127,
    d = 1/iscale (negative when max > 0; d·q is x's rounding either way), an all-zero block
    d = 0 and quants 0; xb (T, k/16) int16: the sum of each 16 quants. Fastmath only as
    EXACT_MAX allows (the maximum found in vector lanes, then its first position), so numpy
    can repeat it bit for bit."""
    for t in prange(X.shape[0]):  # one token per thread step (a prompt's tokens; decode's one runs alone)
        _q8_k_row(X[t], xq[t], xd[t], xb[t])


@njit(cache=True)
def quantize_activations_k(X):
    """(xq, xd, xb) of ``quantize_q8_k`` for X (T, k), k a multiple of QK_K."""
    T, k = X.shape
    xq = np.empty((T, k), np.int8)
    xd = np.empty((T, k // QK_K), np.float32)
    xb = np.empty((T, k // 16), np.int16)
    quantize_q8_k(X, xq, xd, xb)
    return xq, xd, xb


# --- a second activation plane (the "int16" arithmetic) ------------------------------------------
# The int8 blocks round each activation to d·q (d = the block's max/127): an error of up to d/2
# per value, which moves a model's perplexity by ~1-2 % (the real Gemma 3 270M: +1.8 %). The
# second plane is that error in steps of d/128, q_lo = rint((x − d·q)·128/d), also int8 (|q_lo|
# ≤ ~72): the tiles form both planes' integer sums from the same weights (runtime.kernels.amx:
# two TDPBUSD/TDPBSSD from one weight tile; runtime.kernels.kq_tiles: vpdpbusd over the first
# plane, the int32 sums shifted left by 7, then over the second into the same sums) and add them
# as 128·Σq_w·q + Σq_w·q_lo, the sums of 16-bit activations 128·q + q_lo in steps of d/128,
# before the same float step. The result is the float product to ~1/32,000 of a block's largest
# value: perplexity equal to the float path's (docs/benchmarks.md).
LO_STEPS = 128  # the second plane's steps per step of the first (a power of two: d/128 is exact)


@njit(parallel=True, cache=True)
def residual_plane(X, xq, xd, block):
    """The second plane of X (T, k) float32 after its int8 blocks (xq (T, k) int8, xd (T, k/block)
    the blocks' d): rint((x − d·q)·128/d) as int8 (0 where d is 0)."""
    T, k = X.shape
    out = np.empty((T, k), np.int8)
    for t in prange(T):
        for b in range(k // block):
            d = xd[t, b]
            inv = np.float32(LO_STEPS) / d if d != 0 else np.float32(0.0)
            for i in range(b * block, (b + 1) * block):
                v = np.rint((X[t, i] - d * np.float32(xq[t, i])) * inv)
                out[t, i] = np.int8(max(-127.0, min(127.0, v)))
    return out
