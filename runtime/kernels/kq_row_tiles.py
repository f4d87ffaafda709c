"""Many tokens times a K-quant matrix (Q4_K, Q5_K, Q6_K) in int8 with 16 rows in the lanes of one
vector, in the order of float operations of llama.cpp's batch path, so the sums are its own.

From 8 tokens a batch, llama.cpp (ggml-cpu/tiled, its VNNI microkernel) multiplies a K-quant
matrix by Q8_K activations as follows, per row r, token t and super-block b of 256 values: the
integer sums of each sub-block s (32 values for Q4_K/Q5_K, 16 for Q6_K), raw_s = Σ q·q_x with
the quants unsigned, are scaled in int32, s1 = Σ_s sc_s·(raw_s − bias·bsum_s) (Q6_K: bias 32),
and for the affine types s2 = Σ_s m_s·bsum_s; then, in float32,

    r = fnmadd(dmin, float(s2), float(s1)·d)        (one rounding for the product and the sum)
    y = fma(r, d_x(t, b), y)                        (super-block after super-block, y from 0)

The integer sums are exact whatever their order, so matching llama.cpp means these four float
steps (what GCC makes of its intrinsics: its product and sum into y are contracted into one
fma). ``runtime.kernels.kq_tiles`` (4 rows × 4 tokens, 16 sub-blocks of one row in the lanes)
adds its float terms per sub-block instead, a few ulps away; ``runtime.kernels.row_tiles`` does
this for the 32-value types. Tested bit for bit against llama.cpp's graph tensors on the real
Gemma 3 270M (tests/runtime/test_real_model.py).

Lane i holds row i of a group of 16: word j of super-block b of the 16 rows is one vector, the
token's word j broadcast to every lane, so one vpdpbusd makes 16 rows' partial sums of 4
products (weights the unsigned operand, activations the signed one, as llama.cpp's); the scales
sc_s and m_s, d and dmin are vectors of the 16 rows' values. Each group is moved into this
layout once per matmul (``group_kq``: a full group's Q4_K/Q6_K quants decoded in vector registers
and transposed 16 × 16) or kept across matmuls (``group_kq_rows``, through amx.kept_rows).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from aios.quant import QK_K
from runtime.kernels.ir_helpers import (
    V16F,
    V16I32,
    V32I8,
    V64I8,
    array_data,
    const,
    declare,
    idot_u8s8,
    int_dot_features,
    ir_loop,
    splat,
    vload,
    vstore,
)
from runtime.kernels.kq_tiles import f16_le, word_at
from runtime.kernels.kquants import (
    KQ_BYTES,
    Q4K_QS,
    Q4K_SCALES,
    Q5K_QH,
    Q5K_QS,
    Q6K_D,
    Q6K_QH,
    Q6K_SCALES,
)
from runtime.kernels.quantize import LO_STEPS, residual_plane
from runtime.kernels.type_traits import TYPE_TRAITS, names

KQ_ROW_TYPES = names("kq", tile="kq_rows")  # runtime.kernels.type_traits' rows taking these tiles
KQ_ROW_KIND = {t: i for i, t in enumerate(KQ_ROW_TYPES)}
# sub-blocks per super-block, by kind (one scale each)
SUBBLOCKS = tuple(TYPE_TRAITS[t].subblocks for t in KQ_ROW_TYPES)
LANES16 = 16  # rows per group: the lanes of a vector of int32 sums
KQ_TOKENS = 8  # tokens per tile: 8 int32 sums and 8 float accumulators in registers
SB_WORDS = QK_K // 4  # 4-byte words per super-block


def _kq_tile_codegen(kind, planes):
    """The tile of 16 rows × KQ_TOKENS tokens over every super-block: (QT, SC, MN, D, DM, XQ, XS,
    XQ2, XS2, XD, O, nsb, kw, nxs, nbx, t0) -> O (tokens, 16) float32. QT (nsb·64, 16) the rows'
    words (unsigned quants; lane i: row i), SC and MN (nsb·NS, 16) int32 sub-block scales and
    minimums, D and DM (nsb, 16) d and dmin; XQ (tokens, kw) the activations' words (signed
    bytes), XS (tokens, nxs) int32 per sub-block: the sum of its quants (affine types; the
    minimum's term) or −32 times it (Q6_K: where its integer sums start, which takes the 32 its
    quants are stored plus off), XD (tokens, nbx) each super-block's d.

    Two planes (``arranged_kq`` with X): per sub-block and token the first plane's sums (from
    XS) shifted left by 7, the second's (XQ2, from XS2) added: the 16-bit values' exact sums
    (< 2²⁴), converted to float32 and multiplied by the sub-block's scale into a float32 sum by
    one fma (its int32 sum could overflow); the affine types' XS then the 16-bit values' sums
    (128·Σq + Σq_lo), XD d/128. One plane keeps llama.cpp's int32 sums."""
    ns = SUBBLOCKS[kind]
    wps = SB_WORDS // ns  # words per sub-block
    affine = kind != 2
    ntok = KQ_TOKENS

    def codegen(context, builder, sig, args):
        how = int_dot_features()
        vnni = how in ("avx512vnni", "avxvnni")
        qt, sc, mn, d, dm, xq, xs, xq2, xs2, xd, o = (array_data(context, builder, sig.args[i], args[i]) for i in range(11))
        nsb, kw, nxs, nbx, t0 = args[11:16]
        ity = nsb.type
        toks = [builder.add(t0, const(ity, i)) for i in range(ntok)]
        xrows = [[builder.gep(p, [builder.mul(t, kw)]) for t in toks] for p in (xq, xq2)[:planes]]
        xsums = [[builder.gep(p, [builder.mul(t, nxs)]) for t in toks] for p in (xs, xs2)[:planes]]
        xds = [builder.gep(xd, [builder.mul(t, nbx)]) for t in toks]
        qt32 = builder.bitcast(qt, ir.IntType(32).as_pointer())
        fma = declare(builder, "llvm.fma.v16f32", V16F, [V16F] * 3)
        zero = const(V16I32, [0] * 16)
        seven = const(V16I32, [7] * 16)
        ST_ = ir.LiteralStructType([V16F] * ntok)
        init = ir.Constant(ST_, [const(V16F, [0.0] * 16)] * ntok)

        def xsum(p, t, b, s):  # plane p's XS entry of sub-block s of super-block b, token t
            return builder.load(builder.gep(xsums[p][t], [builder.add(builder.mul(b, const(ity, ns)), const(ity, s))]), align=4)

        def dot(raw, p, t, xo, wv):  # raw + the 16 rows' sums of this sub-block's words, plane p
            for j in range(wps):
                word = builder.load(builder.gep(xrows[p][t], [builder.add(xo, const(ity, j))]), align=4)
                xv = builder.bitcast(splat(builder, word, 16), V64I8)
                raw = idot_u8s8(builder, wv[j], xv, how, acc=raw) if vnni else builder.add(raw, idot_u8s8(builder, wv[j], xv, how))
            return raw

        def body(b, accs):
            s1 = [zero if planes == 1 else const(V16F, [0.0] * 16)] * ntok
            for s in range(ns):
                wo = builder.mul(b, const(ity, SB_WORDS * LANES16))
                wv = [builder.bitcast(vload(builder, qt32, builder.add(wo, const(ity, LANES16 * (s * wps + j))), V16I32, 4),
                                      V64I8) for j in range(wps)]
                sco = builder.add(builder.mul(b, const(ity, ns * LANES16)), const(ity, s * LANES16))
                scv = vload(builder, sc, sco, V16I32, 4)
                scf = builder.sitofp(scv, V16F) if planes == 2 else None
                xo = builder.add(builder.mul(b, const(ity, SB_WORDS)), const(ity, s * wps))
                for t in range(ntok):
                    raw = zero if affine else splat(builder, xsum(0, t, b, s), 16)  # Q6_K: −32·Σq_x
                    raw = dot(raw, 0, t, xo, wv)
                    if planes == 1:
                        s1[t] = builder.add(s1[t], builder.mul(raw, scv))
                        continue
                    raw = builder.shl(raw, seven)
                    if not affine:
                        raw = builder.add(raw, splat(builder, xsum(1, t, b, s), 16))
                    raw = dot(raw, 1, t, xo, wv)
                    s1[t] = builder.call(fma, [builder.sitofp(raw, V16F), scf, s1[t]])
            s2 = [zero] * ntok
            if affine:  # Σ m_s·bsum_s: apart from the dot products, as llama.cpp (fewer live vectors)
                for s in range(ns):
                    mo = builder.add(builder.mul(b, const(ity, ns * LANES16)), const(ity, s * LANES16))
                    mv = vload(builder, mn, mo, V16I32, 4)
                    for t in range(ntok):
                        s2[t] = builder.add(s2[t], builder.mul(mv, splat(builder, xsum(0, t, b, s), 16)))
            dv = vload(builder, d, builder.mul(b, const(ity, LANES16)), V16F, 4)
            dmv = builder.fneg(vload(builder, dm, builder.mul(b, const(ity, LANES16)), V16F, 4)) if affine else None
            for t in range(ntok):
                f1 = builder.sitofp(s1[t], V16F) if planes == 1 else s1[t]
                r = builder.fmul(f1, dv)  # no fast-math flags: each step rounds
                if affine:
                    r = builder.call(fma, [dmv, builder.sitofp(s2[t], V16F), r])
                dxs = splat(builder, builder.load(builder.gep(xds[t], [b]), align=4), 16)
                accs = builder.insert_value(accs, builder.call(fma, [r, dxs, builder.extract_value(accs, t)]), t)
            return accs

        accs = ir_loop(builder, nsb, init, body)
        for t in range(ntok):
            vstore(builder, builder.extract_value(accs, t), o, const(ity, 16 * t), 4)
        return context.get_dummy_value()

    return codegen


def _kq_tile(kind, planes):
    gen = _kq_tile_codegen(kind, planes)

    def typer(typingctx, qt, sc, mn, d, dm, xq, xs, xq2, xs2, xd, o, nsb, kw, nxs, nbx, t0):
        return types.void(qt, sc, mn, d, dm, xq, xs, xq2, xs2, xd, o, nsb, kw, nxs, nbx, t0), gen

    typer.__name__ = f"kq_row_tile_{KQ_ROW_TYPES[kind]}_{planes}"
    return intrinsic(typer)


_tile_q4, _tile_q5, _tile_q6 = (_kq_tile(i, 1) for i in range(3))
_tile2_q4, _tile2_q5, _tile2_q6 = (_kq_tile(i, 2) for i in range(3))


def _transpose16(b, rows):
    """16 <16 x i32> rows -> their 16 columns: four rounds of two-source shuffles swapping the
    off-diagonal blocks of 8, 4, 2, 1 (vpermt2d each)."""
    rows = list(rows)
    for s in (8, 4, 2, 1):
        lo = [(j // (2 * s)) * 2 * s + (j % (2 * s) if j % (2 * s) < s else 16 + j % (2 * s) - s) for j in range(16)]
        hi = [x + s for x in lo]
        for i in range(16):
            if (i // s) % 2 == 0:
                a, c = rows[i], rows[i + s]
                rows[i] = b.shuffle_vector(a, c, const(V16I32, lo))
                rows[i + s] = b.shuffle_vector(a, c, const(V16I32, hi))
    return rows


def _concat32(b, x, y):  # two <32 x i8> -> <64 x i8>
    return b.shuffle_vector(x, y, const(ir.VectorType(ir.IntType(32), 64), list(range(64))))


def _full_group_codegen(kind):
    """A full group's quants of one super-block in the tile's layout: (W, qt, r0, o, wq) -> the
    16 rows r0.. of W, super-block at byte o of each row, as four vectors of 16 words per row
    (unsigned quants in the values' order), transposed 16 × 16 into qt at word wq (word j of the
    super-block: 16 lanes, one per row). What ``group_kq`` does word by word, in vector registers."""
    def codegen(context, builder, sig, args):
        w = array_data(context, builder, sig.args[0], args[0])
        qt = array_data(context, builder, sig.args[1], args[1])
        r0, o, wq = args[2], args[3], args[4]
        ity = r0.type
        stride = context.make_array(sig.args[0])(context, builder, args[0]).strides
        rb = builder.extract_value(stride, 0)  # bytes per row
        bases = [builder.gep(w, [builder.add(builder.mul(builder.add(r0, const(ity, i)), rb), o)]) for i in range(16)]
        m15, m3 = const(V32I8, [15] * 32), const(V32I8, [3] * 32)

        def load32(p, off):
            return builder.load(builder.bitcast(builder.gep(p, [const(ity, off)]), V32I8.as_pointer()), align=1)

        def shr(v, k):
            return builder.lshr(v, const(V32I8, [k] * 32)) if k else v

        for wb in range(4):
            vecs = []
            for p in bases:
                if kind == 0:  # Q4_K: 32 bytes of qs, low nibbles then high: words 16wb..16wb + 15
                    q = load32(p, Q4K_QS + 32 * wb)
                    lo, hi = builder.and_(q, m15), shr(q, 4)
                else:  # Q6_K: half ``wb % 2`` of the 128 values at 128·(wb // 2)
                    nh, half = wb // 2, wb % 2
                    h = load32(p, Q6K_QH + 32 * nh)
                    parts = []
                    for part in (2 * half, 2 * half + 1):
                        lq = load32(p, 64 * nh + 32 * (part % 2))
                        nib = shr(lq, 4) if part // 2 else builder.and_(lq, m15)
                        parts.append(builder.or_(nib, builder.shl(builder.and_(shr(h, 2 * part), m3), const(V32I8, [4] * 32))))
                    lo, hi = parts
                vecs.append(builder.bitcast(_concat32(builder, lo, hi), V16I32))
            for j, col in enumerate(_transpose16(builder, vecs)):
                vstore(builder, col, builder.bitcast(qt, ir.IntType(32).as_pointer()),
                       builder.add(wq, const(ity, (16 * wb + j) * LANES16)), 4)
        return context.get_dummy_value()

    return codegen


def _full_group(kind):
    gen = _full_group_codegen(kind)

    def typer(typingctx, W, qt, r0, o, wq):
        return types.void(W, qt, r0, o, wq), gen

    typer.__name__ = f"kq_full_group_{KQ_ROW_TYPES[kind]}"
    return intrinsic(typer)


_full_q4, _full_q6 = _full_group(0), _full_group(2)


@njit(cache=True, inline="always")
def scale_min_k4(sc, j):  # ggml's getscale_min_k4: sub-block j's 6-bit scale and minimum
    if j < 4:
        return np.int32(sc[j] & 63), np.int32(sc[j + 4] & 63)
    return (np.int32((sc[j + 4] & 15) | ((sc[j - 4] >> 6) << 4)),
            np.int32((sc[j + 4] >> 4) | ((sc[j] >> 6) << 4)))


@njit(cache=True)
def group_kq(W, kind, r0, m, nsb, qt, sc, mn, d, dm):
    """Rows r0 .. r0 + m of W (the file's super-blocks of KQ_ROW_TYPES[kind]) into one group's
    layout (``_kq_tile_codegen``: lane i row r0 + i; lanes past m zero): unsigned quants in the
    values' order, the sub-blocks' integer scales and minimums, d and dmin as float32."""
    ns = SUBBLOCKS[kind]
    bpb = W.shape[1] // nsb
    lo4 = np.uint32(0x0F0F0F0F)
    two = np.uint32(0x03030303)
    if m < LANES16:  # lanes past m stay zero (a full group writes every lane: no pass over the buffer)
        qt[:] = 0
        sc[:] = 0
        mn[:] = 0
        d[:] = 0
        dm[:] = 0
    full = m == LANES16 and kind != 1  # Q4_K, Q6_K: the quants of a full group in vector registers
    for b in range(nsb):  # super-block by super-block: its 16 rows' 4 KB of words stay in L1
        o = b * bpb
        if full:
            if kind == 0:
                _full_q4(W, qt, r0, o, b * SB_WORDS * LANES16)
            else:
                _full_q6(W, qt, r0, o, b * SB_WORDS * LANES16)
        for i in range(m):
            p = W[r0 + i]
            wq = (b * SB_WORDS) * LANES16 + i
            if kind < 2:
                d[b * LANES16 + i], dm[b * LANES16 + i] = f16_le(p, o), f16_le(p, o + 2)
                scales = p[o + Q4K_SCALES: o + Q4K_SCALES + 12]
                for j in range(8):
                    s, mm = scale_min_k4(scales, j)
                    sc[(b * ns + j) * LANES16 + i] = s
                    mn[(b * ns + j) * LANES16 + i] = mm
                qs = o + (Q5K_QS if kind == 1 else Q4K_QS)
                for jj in range(0 if full else 4):  # 32 bytes: sub-block 2jj in the low nibbles, 2jj + 1 in the high
                    for w in range(8):
                        x = word_at(p, qs + 32 * jj + 4 * w)
                        lo, hi = x & lo4, (x >> 4) & lo4
                        if kind == 1:  # Q5_K: bit j of qh[l] is value l's fifth bit in sub-block j
                            h = word_at(p, o + Q5K_QH + 4 * w)
                            lo |= ((h >> (2 * jj)) & np.uint32(0x01010101)) << 4
                            hi |= ((h >> (2 * jj + 1)) & np.uint32(0x01010101)) << 4
                        qt[wq + (16 * jj + w) * LANES16] = lo
                        qt[wq + (16 * jj + 8 + w) * LANES16] = hi
            else:
                d[b * LANES16 + i] = f16_le(p, o + Q6K_D)
                for g in range(16):
                    sc[(b * ns + g) * LANES16 + i] = np.int32(np.int8(p[o + Q6K_SCALES + g]))
                for nh in range(0 if full else 2):  # 128 values each: ql[64], qh[32]
                    for part in range(4):  # 32 values: ql's low nibbles (0-31, 32-63), then high
                        for w in range(8):
                            src = word_at(p, o + 64 * nh + 32 * (part % 2) + 4 * w)
                            h = word_at(p, o + Q6K_QH + 32 * nh + 4 * w)
                            v = ((src >> np.uint32(4 * (part // 2))) & lo4) | (((h >> np.uint32(2 * part)) & two) << np.uint32(4))
                            qt[wq + (32 * nh + 8 * part + w) * LANES16] = v


@njit(parallel=True, cache=True)
def group_kq_all(W, kind, nsb, n, QT, SC, MN, D, DM):
    """Every group of 16 rows of W into the tile's layout, a row of (QT, SC, MN, D, DM) per group:
    what ``kept_kq_rows`` keeps."""
    for g in prange((n + LANES16 - 1) // LANES16):
        group_kq(W, kind, LANES16 * g, min(LANES16, n - LANES16 * g), nsb, QT[g], SC[g], MN[g], D[g], DM[g])


@njit(cache=True, inline="always")
def _run_tile(kind, two, qt, sc, mn, d, dm, XQ, XS, XQ2, XS2, XD, O, nsb, kw, nxs, nbx, t):
    a = (qt, sc, mn, d, dm, XQ, XS, XQ2, XS2, XD, O, nsb, kw, nxs, nbx, t)
    if two:
        if kind == 0:
            _tile2_q4(*a)
        elif kind == 1:
            _tile2_q5(*a)
        else:
            _tile2_q6(*a)
    elif kind == 0:
        _tile_q4(*a)
    elif kind == 1:
        _tile_q5(*a)
    else:
        _tile_q6(*a)


@njit(parallel=True, cache=True)
def kq_rows_tiles(W, kind, grouped, QT, SC, MN, D, DM, XQ, XS, XQ2, XS2, two, XD, nsb, n, T, Y):
    """Y[:T, :n] = W's rows times the T tokens of (XQ, XS, XD) (and the second plane (XQ2, XS2)
    where ``two``: ``arranged_kq``), the groups of 16 rows in parallel: each group moved into the
    tile's layout first (``group_kq``) or, with ``grouped``, taken from (QT, SC, MN, D, DM)
    (``group_kq_all``)."""
    ns = SUBBLOCKS[kind]
    Tp, kw = XQ.shape
    nxs = XS.shape[1]
    nbx = XD.shape[1]
    for g in prange((n + LANES16 - 1) // LANES16):
        r0 = LANES16 * g
        m = min(LANES16, n - r0)
        if grouped:
            qt, sc, mn, d, dm = QT[g], SC[g], MN[g], D[g], DM[g]
        else:
            qt = np.empty(nsb * SB_WORDS * LANES16, np.uint32)
            sc = np.empty(nsb * ns * LANES16, np.int32)
            mn = np.empty(nsb * ns * LANES16, np.int32)
            d = np.empty(nsb * LANES16, np.float32)
            dm = np.empty(nsb * LANES16, np.float32)
            group_kq(W, kind, r0, m, nsb, qt, sc, mn, d, dm)
        O = np.empty(KQ_TOKENS * LANES16, np.float32)
        for t in range(0, Tp, KQ_TOKENS):
            _run_tile(kind, two, qt, sc, mn, d, dm, XQ, XS, XQ2, XS2, XD, O, nsb, kw, nxs, nbx, t)
            for j in range(min(KQ_TOKENS, T - t)):
                for i in range(m):
                    Y[t + j, r0 + i] = O[j * LANES16 + i]


def kq_grouped_shapes(fmt: str, n: int, k: int):
    """The shapes of (QT), (SC, MN) and (D, DM) of n rows of k values in the tile's layout."""
    ng, nsb = -(-n // LANES16), k // QK_K
    ns = SUBBLOCKS[KQ_ROW_KIND[fmt]]
    return (ng, nsb * SB_WORDS * LANES16), (ng, nsb * ns * LANES16), (ng, nsb * LANES16)


def kq_rows_bytes(fmt: str, n: int, k: int) -> int:
    """What keeping n rows of k values in the tile's layout holds (4-byte elements)."""
    q, s, f = kq_grouped_shapes(fmt, n, k)
    return 4 * q[0] * (q[1] + 2 * s[1] + 2 * f[1])


def group_kq_rows(fmt: str, W: np.ndarray):
    """Every row of W (``fmt``, the file's bytes) in the tile's layout: (QT, SC, MN, D, DM)."""
    k = W.shape[1] // KQ_BYTES[fmt] * QK_K
    q, s, f = kq_grouped_shapes(fmt, W.shape[0], k)
    out = (np.empty(q, np.uint32), np.empty(s, np.int32), np.empty(s, np.int32), np.empty(f, np.float32),
           np.empty(f, np.float32))
    group_kq_all(W, KQ_ROW_KIND[fmt], k // QK_K, W.shape[0], *out)
    return out


@njit(parallel=True, cache=True)
def _fill_plane(q, per, factor, Q, S):  # Q[:T] = q, S[t, s] = factor · Σ q over sub-block s; the rest 0
    T, k = q.shape
    for t in prange(Q.shape[0]):
        for s in range(k // per):
            tot = 0
            for i in range(s * per, (s + 1) * per):
                v = q[t, i] if t < T else np.int8(0)
                Q[t, i] = v
                tot += np.int32(v)
            S[t, s] = factor * tot


def _plane(fmt: str, q: np.ndarray, Tp: int):  # (words, XS) of one plane q (T, k) int8
    k = q.shape[1]
    per = QK_K // SUBBLOCKS[KQ_ROW_KIND[fmt]]  # values per sub-block: 32 (Q4_K, Q5_K) or 16 (Q6_K)
    Q, S = np.empty((Tp, k), np.int8), np.empty((Tp, k // per), np.int32)
    _fill_plane(q, per, -32 if fmt == "q6_k" else 1, Q, S)
    return Q.view(np.uint32), S


def arranged_kq(fmt: str, xq: np.ndarray, xd: np.ndarray, X: np.ndarray | None = None):
    """Q8_K activation blocks (``quantize_activations_k``: xq (T, k) int8, xd (T, k/256)) as the
    tiles of ``fmt`` take them: (XQ words, XS sub-block sums int32, XQ2, XS2, XD), tokens padded
    with zeros to whole tiles; XQ2 is XQ itself (one plane) unless X (the float activations) is
    given: then the second plane (``quantize.residual_plane``) with XS and XS2 as
    ``_kq_tile_codegen`` takes them and XD in the 16-bit values' steps (d/128)."""
    T = xq.shape[0]
    Tp = -(-T // KQ_TOKENS) * KQ_TOKENS
    XQ, XS = _plane(fmt, xq, Tp)
    XD = np.zeros((Tp, xd.shape[1]), np.float32)
    XD[:T] = xd
    if X is None:
        return XQ, XS, XQ, XS, XD
    XQ2, XS2 = _plane(fmt, residual_plane(np.ascontiguousarray(X, np.float32), xq, xd, QK_K), Tp)
    if fmt != "q6_k":  # the minimum's term takes the 16-bit values' sums
        XS = XS * np.int32(LO_STEPS) + XS2
    return XQ, XS, XQ2, XS2, XD / np.float32(LO_STEPS)


def mm_kq_rows(fmt: str, W: np.ndarray, xs, Y: np.ndarray, kept=None) -> None:
    """Y (T, n) = the int8 products of every row of W (``fmt`` in KQ_ROW_TYPES, the file's bytes)
    with the tokens ``xs`` (``arranged_kq``; with one plane llama.cpp's batch sums, bit for bit).
    ``kept``: (QT, SC, MN, D, DM) of every row (``group_kq_rows``), else each group is moved per
    call."""
    XQ, XS, XQ2, XS2, XD = xs
    n = W.shape[0]
    nsb = W.shape[1] // KQ_BYTES[fmt]
    e32, ef = np.empty((1, 1), np.int32), np.empty((1, 1), np.float32)
    grouped = kept is not None
    QT, SC, MN, D, DM = kept if grouped else (np.empty((1, 1), np.uint32), e32, e32, ef, ef)
    kq_rows_tiles(W, KQ_ROW_KIND[fmt], grouped, QT, SC, MN, D, DM, XQ, XS, XQ2, XS2, XQ2 is not XQ, XD, nsb, n,
                  Y.shape[0], Y)
