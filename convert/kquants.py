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

Search (what makes the error competitive, in the spirit of ggml's make_qkx/make_qx but
minimizing plain — or importance-weighted — squared error rather than a heuristic weight):

1. per sub-block, a sweep of candidate step sizes around max−min / nmax, each followed by a
   weighted least-squares fit of (scale, offset) to the rounded levels, then Lloyd steps
   (re-round, re-fit) while the error falls;
2. per super-block, the sub-block scales/mins are quantized to their integer codes under
   fp16 super-scales, then coordinate descent on the *reconstruction* error: refit the
   integer codes given (d, dmin), refit (d, dmin) by least squares given the codes, re-round
   the levels — each move kept only when the super-block's error drops.

``imatrix`` (per-column importances, e.g. calibration mean squares of the layer's input)
weights the squared error, so columns that see large activations are reproduced better.

Out of range: non-finite input is refused; magnitudes beyond what fp16 super-scales can
express saturate (d = 65504) instead of producing inf; values far below fp16's smallest
subnormal (6e-8 per level step) decode to zero, as in ggml.

The numba search is hand-written because no maintained library fits ggml's two-level
scale structure; bit packing is vectorized numpy.
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from numba import njit

from aios import quant
from aios.errors import UsageError
from aios.quant import QK_K

TYPES = ("q2_k", "q3_k", "q4_k", "q5_k", "q6_k")
BLOCK_BYTES = {t: quant.type_size(t) for t in TYPES}  # bytes per super-block (gguf-py's table)
F16_MAX = 65504.0
F16_TINY = 2.0**-24  # smallest fp16 subnormal
SYM_STEP = 0.2  # symmetric sweep: the largest value mapped to its end level ± 0..1 in these steps
DESCENT_STEPS = 12  # super-block coordinate-descent rounds (most stop after 2-4)

# affine types: (sub-block length, level max, scale-code max, sweep start, step, steps)
_AFFINE = {"q2_k": (16, 3, 15, -0.5, 0.1, 20), "q4_k": (32, 15, 63, -1.0, 0.1, 20),
           "q5_k": (32, 31, 63, -1.0, 0.1, 20)}
# symmetric types: (sub-block length, level min, level max, scale-code min, scale-code max)
_SYMMETRIC = {"q3_k": (16, -4, 3, -32, 31), "q6_k": (16, -32, 31, -128, 127)}


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
    if t in _AFFINE:
        fields = _threaded(_encode_affine, x, wb, _AFFINE[t])  # d, dmin, scale codes, min codes, levels
    else:
        fields = _threaded(_encode_symmetric, x, wb, _SYMMETRIC[t])  # d, scale codes, levels
    blocks = _PACK[t](*fields)
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


# --- numba search --------------------------------------------------------------------------


@njit(cache=True)
def _f16(v):
    """Nearest fp16 value of ``v`` (round half to even), saturating at ±65504."""
    a = abs(v)
    if a >= F16_MAX:
        return math.copysign(F16_MAX, v)
    if a < 6.103515625e-05:  # subnormal: fixed step 2^-24
        step = F16_TINY
    else:
        e = math.frexp(a)[1]  # a in [2^(e-1), 2^e): 11 significant bits
        step = math.ldexp(1.0, e - 11)
    return math.copysign(np.rint(a / step) * step, v)


@njit(cache=True)
def _fit_affine(x, w, nmax, r0, dr, steps, L, Lt):
    """Best (scale, offset ≤ 0) with x ≈ scale·L + offset, L ∈ 0..nmax; fills L. Weighted."""
    n = x.shape[0]
    lo = min(x.min(), 0.0)
    hi = x.max()
    if hi <= lo:
        L[:] = 0
        return 0.0, lo
    sw = 0.0
    sx = 0.0
    sx2 = 0.0
    for i in range(n):
        sw += w[i]
        sx += w[i] * x[i]
        sx2 += w[i] * x[i] * x[i]
    best = np.inf
    bs, bo = (hi - lo) / nmax, lo
    s, o = bs, bo
    for k in range(-1, steps + 1 + 8):
        if k < 0:  # the plain min/max grid
            s, o = (hi - lo) / nmax, lo
        elif k <= steps:  # a sweep of step sizes, each refit once (as ggml's make_qkx2)
            s, o = (hi - lo) / (nmax + r0 + dr * k), lo
        elif k == steps + 1:  # then Lloyd steps from the best: round to the grid, refit it
            s, o = bs, bo
        if s <= 0.0:
            break
        sl = 0.0
        sl2 = 0.0
        sxl = 0.0
        inv = 1.0 / s
        for i in range(n):
            q = min(max(np.rint((x[i] - o) * inv), 0.0), nmax)
            Lt[i] = q
            sl += w[i] * q
            sl2 += w[i] * q * q
            sxl += w[i] * q * x[i]
        D = sw * sl2 - sl * sl
        if D <= 0.0 or sl2 <= 0.0:
            continue
        ns = (sw * sxl - sx * sl) / D
        no = (sl2 * sx - sl * sxl) / D
        if no > 0.0:
            no = 0.0
            ns = sxl / sl2
        # Σ w (ns·L + no − x)², expanded: no second pass over the values
        err = sx2 + ns * ns * sl2 + no * no * sw + 2 * (ns * no * sl - ns * sxl - no * sx)
        if err < best:
            best = err
            bs, bo = ns, no
            L[:] = Lt
        elif k > steps:
            break  # Lloyd stopped improving
        s, o = ns, no
    return bs, bo


@njit(cache=True)
def _affine_err(x, w, sub, nmax, d, dmin, ls, lm, L):
    """Round every value to its best level under (d, dmin, codes); weighted squared error."""
    err = 0.0
    for j in range(ls.shape[0]):
        s = np.float32(d) * np.float32(ls[j])  # as the decoder computes it, in float32
        m = np.float32(dmin) * np.float32(lm[j])
        inv = 1.0 / s if s != 0.0 else 0.0
        for i in range(j * sub, (j + 1) * sub):
            q = min(max(np.rint((x[i] + m) * inv), 0.0), nmax)
            L[i] = q
            r = s * q - m - x[i]
            err += w[i] * r * r
    return err


@njit(cache=True)
def _refit_codes(x, w, L, ls, lm, d, dmin, sub, smax):
    """Step (a) of the descent: each sub-block's integer scale/min codes re-fitted by weighted
    least squares of x ≈ s·L − m given the levels L and the super-block scales (d, dmin)."""
    ls2 = ls.copy()
    lm2 = lm.copy()
    for j in range(QK_K // sub):
        a0 = 0.0
        a1 = 0.0
        a2 = 0.0
        b0 = 0.0
        b1 = 0.0
        for i in range(j * sub, (j + 1) * sub):
            a0 += w[i]
            a1 += w[i] * L[i]
            a2 += w[i] * L[i] * L[i]
            b0 += w[i] * x[i]
            b1 += w[i] * x[i] * L[i]
        det = a0 * a2 - a1 * a1
        if det > 0.0:
            s = (a0 * b1 - a1 * b0) / det  # x ≈ s·L − m
            m = (a1 * b1 - a2 * b0) / det
            ls2[j] = min(max(np.rint(s / d), 0.0), smax)
            if dmin != 0.0:
                lm2[j] = min(max(np.rint(m / dmin), 0.0), smax)
    return ls2, lm2


@njit(cache=True)
def _refit_scales(x, w, L, ls, lm, d, dmin, sub):
    """Step (b) of the descent: the super-block scales (d, dmin) by weighted least squares given
    the codes and levels, rounded to fp16; unchanged when the system is singular."""
    p2 = 0.0
    pq = 0.0
    q2 = 0.0
    px = 0.0
    qx = 0.0
    for j in range(QK_K // sub):
        for i in range(j * sub, (j + 1) * sub):
            p = ls[j] * L[i]
            q = -lm[j]
            p2 += w[i] * p * p
            pq += w[i] * p * q
            q2 += w[i] * q * q
            px += w[i] * p * x[i]
            qx += w[i] * q * x[i]
    det = p2 * q2 - pq * pq
    if det > 0.0:
        return _f16((px * q2 - qx * pq) / det), _f16((qx * p2 - px * pq) / det)
    if p2 > 0.0:
        return _f16(px / p2), dmin
    return d, dmin


@njit(cache=True, nogil=True)
def _encode_affine(X, W, sub, nmax, smax, r0, dr, steps):
    nb = X.shape[0]
    nsub = QK_K // sub
    D = np.zeros(nb, np.float32)
    DM = np.zeros(nb, np.float32)
    LS = np.zeros((nb, nsub), np.uint8)
    LM = np.zeros((nb, nsub), np.uint8)
    LL = np.zeros((nb, QK_K), np.uint8)
    for b in range(nb):
        x = X[b].astype(np.float64)
        w = W[b % W.shape[0]].astype(np.float64)  # W: one weight row per column block
        L = np.zeros(QK_K)
        Lsub = np.zeros(sub)
        scratch = np.zeros(sub)
        sc = np.zeros(nsub)
        mn = np.zeros(nsub)
        for j in range(nsub):
            s, o = _fit_affine(x[j * sub:(j + 1) * sub], w[j * sub:(j + 1) * sub], nmax, r0, dr, steps, Lsub, scratch)
            sc[j] = max(s, 0.0)
            mn[j] = -o
        d = _f16(sc.max() / smax)
        dmin = _f16(mn.max() / smax)
        if d == 0.0 and sc.max() > 0.0:  # below fp16's normal range: its smallest step
            d = F16_TINY
        if dmin == 0.0 and mn.max() > 0.0:
            dmin = F16_TINY
        ls = np.zeros(nsub)
        lm = np.zeros(nsub)
        for j in range(nsub):
            ls[j] = min(max(np.rint(sc[j] / d), 0.0), smax) if d > 0 else 0.0
            lm[j] = min(max(np.rint(mn[j] / dmin), 0.0), smax) if dmin > 0 else 0.0
        best = _affine_err(x, w, sub, nmax, d, dmin, ls, lm, L)
        e0 = np.sum(w * x * x)
        if e0 < best:  # below fp16's reach the grid can do worse than zeros: store zeros
            d, dmin, best = 0.0, 0.0, e0
            ls[:] = 0
            lm[:] = 0
            L[:] = 0
        for it in range(DESCENT_STEPS):  # coordinate descent on the reconstruction error
            improved = False
            # (a) integer codes per sub-block given (d, dmin) and the levels
            if d != 0.0:
                ls2, lm2 = _refit_codes(x, w, L, ls, lm, d, dmin, sub, smax)
                Lt2 = np.zeros(QK_K)
                e = _affine_err(x, w, sub, nmax, d, dmin, ls2, lm2, Lt2)
                if e < best:
                    best, ls, lm, L, improved = e, ls2, lm2, Lt2, True
            # (b) the super-block scales (d, dmin) given the codes and levels, by least squares
            d2, dm2 = _refit_scales(x, w, L, ls, lm, d, dmin, sub)
            Lt3 = np.zeros(QK_K)
            e = _affine_err(x, w, sub, nmax, d2, dm2, ls, lm, Lt3)
            if e < best:
                best, d, dmin, L, improved = e, d2, dm2, Lt3, True
            if not improved:
                break
        D[b] = d
        DM[b] = dmin
        for j in range(nsub):
            LS[b, j] = np.uint8(ls[j])
            LM[b, j] = np.uint8(lm[j])
        for i in range(QK_K):
            LL[b, i] = np.uint8(L[i])
    return D, DM, LS, LM, LL


@njit(cache=True)
def _fit_symmetric(x, w, qlo, qhi, L, Lt):
    """Best scale with x ≈ scale·L, L ∈ qlo..qhi (|qlo| = qhi + 1); fills L. Weighted."""
    n = x.shape[0]
    k = np.argmax(np.abs(x))
    m = x[k]
    if m == 0.0:
        L[:] = 0
        return 0.0
    best = -1.0  # maximize (Σwxl)² / Σwl², i.e. minimize the error of the least-squares scale
    bs = 0.0
    s = 0.0
    for k in range(-12, 11 + 8):
        if k == -12:  # the largest magnitude on the long (qlo) end of the levels, exactly
            s = m / qlo
        elif k < 0:  # ... and near it
            s = m / (qlo - SYM_STEP * (k + 6))
        elif k < 11:  # ... or near the short (qhi) end
            s = m / (qhi + SYM_STEP * (k - 5))
        elif k == 11:  # then Lloyd steps from the best
            s = bs
        if s == 0.0:
            break
        sxl = 0.0
        sl2 = 0.0
        inv = 1.0 / s
        for i in range(n):
            q = min(max(np.rint(x[i] * inv), qlo), qhi)
            Lt[i] = q
            sxl += w[i] * x[i] * q
            sl2 += w[i] * q * q
        if sl2 <= 0.0:
            continue
        score = sxl * sxl / sl2
        if score > best:
            best = score
            bs = sxl / sl2
            L[:] = Lt
        elif k > 11:
            break
        s = sxl / sl2
    return bs


@njit(cache=True)
def _symmetric_err(x, w, sub, qlo, qhi, d, c, L):
    err = 0.0
    for j in range(c.shape[0]):
        s = np.float32(d) * np.float32(c[j])
        inv = 1.0 / s if s != 0.0 else 0.0
        for i in range(j * sub, (j + 1) * sub):
            q = min(max(np.rint(x[i] * inv), qlo), qhi)
            L[i] = q
            r = s * q - x[i]
            err += w[i] * r * r
    return err


@njit(cache=True, nogil=True)
def _encode_symmetric(X, W, sub, qlo, qhi, slo, shi):
    nb = X.shape[0]
    nsub = QK_K // sub
    D = np.zeros(nb, np.float32)
    SC = np.zeros((nb, nsub), np.int8)
    LL = np.zeros((nb, QK_K), np.int8)
    for b in range(nb):
        x = X[b].astype(np.float64)
        w = W[b % W.shape[0]].astype(np.float64)  # W: one weight row per column block
        Lsub = np.zeros(sub)
        scratch = np.zeros(sub)
        sc = np.zeros(nsub)
        for j in range(nsub):
            sc[j] = _fit_symmetric(x[j * sub:(j + 1) * sub], w[j * sub:(j + 1) * sub], qlo, qhi, Lsub, scratch)
        ms = sc[np.argmax(np.abs(sc))]
        best = np.inf
        d = 0.0
        c = np.zeros(nsub)
        L = np.zeros(QK_K)
        if ms != 0.0:
            for top in (slo, shi):  # the largest scale on either end of the code range
                d1 = _f16(ms / top)
                if d1 == 0.0:  # below fp16's normal range: its smallest step
                    d1 = math.copysign(F16_TINY, ms / top)
                c1 = np.zeros(nsub)
                for j in range(nsub):
                    c1[j] = min(max(np.rint(sc[j] / d1), slo), shi)
                L1 = np.zeros(QK_K)
                e = _symmetric_err(x, w, sub, qlo, qhi, d1, c1, L1)
                if e < best:
                    best, d, c, L = e, d1, c1, L1
        e0 = np.sum(w * x * x)
        if d == 0.0 or e0 < best:  # all zero, or below fp16's reach: store zeros
            d, best = 0.0, e0
            c[:] = 0
            L[:] = 0
        for it in range(DESCENT_STEPS):  # coordinate descent on the reconstruction error
            if d == 0.0:
                break
            improved = False
            c2 = c.copy()
            for j in range(nsub):  # (a) codes given d and the levels
                sxl = 0.0
                sl2 = 0.0
                for i in range(j * sub, (j + 1) * sub):
                    sxl += w[i] * x[i] * L[i]
                    sl2 += w[i] * L[i] * L[i]
                if sl2 > 0.0:
                    c2[j] = min(max(np.rint(sxl / sl2 / d), slo), shi)
            L2 = np.zeros(QK_K)
            e = _symmetric_err(x, w, sub, qlo, qhi, d, c2, L2)
            if e < best:
                best, c, L, improved = e, c2, L2, True
            sxp = 0.0  # (b) d given the codes and the levels, by least squares
            sp2 = 0.0
            for j in range(nsub):
                for i in range(j * sub, (j + 1) * sub):
                    p = c[j] * L[i]
                    sxp += w[i] * x[i] * p
                    sp2 += w[i] * p * p
            if sp2 > 0.0:
                d2 = _f16(sxp / sp2)
                L3 = np.zeros(QK_K)
                e = _symmetric_err(x, w, sub, qlo, qhi, d2, c, L3)
                if e < best:
                    best, d, L, improved = e, d2, L3, True
            if not improved:
                break
        D[b] = d
        for j in range(nsub):
            SC[b, j] = np.int8(c[j])
        for i in range(QK_K):
            LL[b, i] = np.int8(L[i])
    return D, SC, LL


# --- ggml block layouts (vectorized numpy) --------------------------------------------------


def _f16_bytes(v: np.ndarray) -> np.ndarray:
    return v.astype(np.float16).view(np.uint8).reshape(-1, 2)


def _pack_scales_k4(ls: np.ndarray, lm: np.ndarray) -> np.ndarray:
    """Eight 6-bit scales and mins -> ggml's 12-byte ``scales`` of Q4_K/Q5_K."""
    out = np.empty((ls.shape[0], 12), np.uint8)
    out[:, 0:4] = ls[:, :4] | ((ls[:, 4:] >> 4) << 6)
    out[:, 4:8] = lm[:, :4] | ((lm[:, 4:] >> 4) << 6)
    out[:, 8:12] = (ls[:, 4:] & 0xF) | ((lm[:, 4:] & 0xF) << 4)
    return out


def _nibbles_k4(L: np.ndarray) -> np.ndarray:
    """Levels (nb, 256) -> 128 bytes: per 64 values, value l in the low and l+32 in the high nibble."""
    q = (L & 0xF).reshape(-1, 4, 2, 32)
    return (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(-1, 128)


def _crumbs(u: np.ndarray) -> np.ndarray:
    """2-bit values (nb, 256) -> 64 bytes: per 128 values, four 32-value groups at shifts 0,2,4,6."""
    q = (u & 3).reshape(-1, 2, 4, 32)
    return (q[:, :, 0] | (q[:, :, 1] << 2) | (q[:, :, 2] << 4) | (q[:, :, 3] << 6)).reshape(-1, 64)


def _bitplane(bits: np.ndarray) -> np.ndarray:
    """One bit per value (nb, 256) -> 32 bytes: bit g of byte l is value 32·g + l."""
    b = bits.reshape(-1, 8, 32).astype(np.uint8)
    return np.bitwise_or.reduce(b << np.arange(8, dtype=np.uint8)[None, :, None], axis=1)


def _pack_q4_k(d, dmin, ls, lm, L) -> np.ndarray:
    return np.concatenate([_f16_bytes(d), _f16_bytes(dmin), _pack_scales_k4(ls, lm), _nibbles_k4(L)], axis=1)


def _pack_q5_k(d, dmin, ls, lm, L) -> np.ndarray:
    qh = _bitplane(L >> 4)
    return np.concatenate([_f16_bytes(d), _f16_bytes(dmin), _pack_scales_k4(ls, lm), qh, _nibbles_k4(L)], axis=1)


def _pack_q2_k(d, dmin, ls, lm, L) -> np.ndarray:
    return np.concatenate([ls | (lm << 4), _crumbs(L), _f16_bytes(d), _f16_bytes(dmin)], axis=1)


def _pack_q6_k(d, sc, L) -> np.ndarray:
    u = (L.astype(np.int16) + 32).astype(np.uint8)  # 0..63
    lo = (u & 0xF).reshape(-1, 2, 2, 64)  # value 128h + 64s + p -> ql[64h + p], nibble s
    ql = (lo[:, :, 0] | (lo[:, :, 1] << 4)).reshape(-1, 128)
    hi = (u >> 4).reshape(-1, 2, 4, 32)  # value 128h + 32g + l -> qh[32h + l], bits 2g
    qh = (hi[:, :, 0] | (hi[:, :, 1] << 2) | (hi[:, :, 2] << 4) | (hi[:, :, 3] << 6)).reshape(-1, 64)
    return np.concatenate([ql, qh, sc.view(np.uint8), _f16_bytes(d)], axis=1)


def _pack_q3_k(d, sc, L) -> np.ndarray:
    u = (L.astype(np.int16) + 4).astype(np.uint8)  # 0..7: high bit in hmask, low 2 bits in qs
    s = (sc.astype(np.int16) + 32).astype(np.uint8)  # 0..63
    scales = np.empty((s.shape[0], 12), np.uint8)
    scales[:, 0:8] = (s[:, 0:8] & 0xF) | ((s[:, 8:16] & 0xF) << 4)
    hi = (s >> 4) & 3
    scales[:, 8:12] = hi[:, 0:4] | (hi[:, 4:8] << 2) | (hi[:, 8:12] << 4) | (hi[:, 12:16] << 6)
    return np.concatenate([_bitplane(u >> 2), _crumbs(u), scales, _f16_bytes(d)], axis=1)


_PACK = {"q2_k": _pack_q2_k, "q3_k": _pack_q3_k, "q4_k": _pack_q4_k, "q5_k": _pack_q5_k, "q6_k": _pack_q6_k}


# --- llama.cpp's own encoder, for parity tests and the benchmark ---------------------------


def llama_cpp_quantize(x: np.ndarray, type_name: str, imatrix: np.ndarray | None = None) -> np.ndarray:
    """The same rows encoded by llama.cpp's ``ggml_quantize_chunk`` (the library bundled
    with llama-cpp-python), in the same (n_rows, row_bytes) layout as :func:`quantize`. Runs in
    a child process (``aios.reference.llamacpp``), like every use of llama.cpp as a reference."""
    from aios.reference import llamacpp

    x = np.ascontiguousarray(x, dtype=np.float32)
    return llamacpp.quantize_rows(x, type_name, int(quant.qtype(type_name)),
                                  row_bytes(x.shape[1], quant.outtype_name(type_name)), imatrix).value
