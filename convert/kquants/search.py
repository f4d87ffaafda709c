"""The K-quant encoders' search (numba): float32 super-blocks -> the integer fields of ggml's
K-quant blocks (fp16 super-scales, sub-block scale/min codes, levels), which ``pack`` lays out.

In the spirit of ggml's make_qkx/make_qx but minimizing plain — or importance-weighted —
squared error rather than a heuristic weight:

1. per sub-block, a sweep of candidate step sizes around max−min / nmax, each followed by a
   weighted least-squares fit of (scale, offset) to the rounded levels, then Lloyd steps
   (re-round, re-fit) while the error falls;
2. per super-block, the sub-block scales/mins are quantized to their integer codes under
   fp16 super-scales, then coordinate descent on the *reconstruction* error: refit the
   integer codes given (d, dmin), refit (d, dmin) by least squares given the codes, re-round
   the levels — each move kept only when the super-block's error drops.

Magnitudes beyond what fp16 super-scales can express saturate (d = 65504) instead of producing
inf; values far below fp16's smallest subnormal (6e-8 per level step) decode to zero, as in ggml.
Hand-written because no maintained library fits ggml's two-level scale structure.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from aios.quant import QK_K

F16_MAX = 65504.0
F16_TINY = 2.0**-24  # smallest fp16 subnormal
SYM_STEP = 0.2  # symmetric sweep: the largest value mapped to its end level ± 0..1 in these steps
DESCENT_STEPS = 12  # super-block coordinate-descent rounds (most stop after 2-4)

# affine types: (sub-block length, level max, scale-code max, sweep start, step, steps)
AFFINE = {"q2_k": (16, 3, 15, -0.5, 0.1, 20), "q4_k": (32, 15, 63, -1.0, 0.1, 20),
           "q5_k": (32, 31, 63, -1.0, 0.1, 20)}
# symmetric types: (sub-block length, level min, level max, scale-code min, scale-code max)
SYMMETRIC = {"q3_k": (16, -4, 3, -32, 31), "q6_k": (16, -32, 31, -128, 127)}


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
def encode_affine(X, W, sub, nmax, smax, r0, dr, steps):
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
def encode_symmetric(X, W, sub, qlo, qhi, slo, shi):
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
