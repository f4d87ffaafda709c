"""Many tokens times a block-quantized matrix in int8: Q4_K, Q5_K, Q6_K times llama.cpp's Q8_K
activations, Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 times its Q8_0 activations. The integer sums are the
one-token kernels' (runtime.kernels.kquants_int, blocks32_int), computed as a matrix-matrix
product in register tiles of 4 rows × 4 tokens. (Q8_0, Q4_0 and Q5_0 take runtime.kernels.row_tiles,
16 rows in the lanes, where their rows are kept or this layout would pad them: dispatch._rows.)

The one-token kernels unpack every super-block's nibbles and six-bit scales again for each token
(about 45 instructions per row, super-block and token); at 8B dimensions that ran 50 G
multiply-adds/s on this project's Xeon against llama.cpp's ~220 G. Here each chunk of rows is
unpacked once per matmul into a lane layout, and the product is then G/4 integer dot
instructions (vpdpbusd) per unit and pair (row, token), plus two or three float operations.

The lane layout: a *unit* is 16 lanes of G values, G the values that share one scale: 32 for
Q4_K/Q5_K (a unit is two super-blocks) and for the 32-value blocks (a unit is 16 blocks), 16 for
Q6_K (a unit is one super-block). Lane l of a unit holds its G values in G/4 words of 4 bytes,
word j of every lane side by side in one 64-byte vector. vpdpbusd of the weights' vector j with
the activations' vector j (arranged the same way) adds each lane's four products into that
lane's int32, so after the G/4 vectors lane l holds Σ q_w·q_x over its group, exact, and float
multiply-adds apply the scales:

    y[r, t] = Σ_units Σ_l d_x(l)·(ws[r, l]·Σ q_w·q_x − c[r, l]·bsum_x(l))

ws is the group's scale (d·sc, or the block's d). The affine types (Q4_K, Q5_K, Q4_1, Q5_1)
store their quants unsigned with c their minimum term (dmin·m, or −m) and bsum_x the
activations' sum over the group (Q8_K's group sums of 16, two for G = 32). The SIGNED types
(Q6_K: q − 32, Q8_0, Q4_0: q − 8, Q5_0: q − 16) store their quants signed and the activations
plus 128 (vpdpbusd takes one unsigned operand): each pair's integer sums start at the row's
−128·Σq_w, which takes the 128 off exactly, and no float offset term is left. What differs from
llama.cpp is the order of the float sums (to float32 rounding, as the float32 GEMM form).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from aios.quant import QK_K
from runtime.kernels.blocks32 import B32_BYTES, QK
from runtime.kernels.ir_helpers import (
    FAST,
    V16F,
    V16I32,
    V64I8,
    array_data,
    const,
    idot_u8s8,
    int_dot_features,
    ir_loop,
    vload,
)
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

KQ_TILES = ("q4_k", "q5_k", "q6_k")
B32_TILES = ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1")  # a lane per block (IQ4_NL: the float32 GEMM)
TILE_TYPES = KQ_TILES + B32_TILES
LANE_VALUES = {"q4_k": 32, "q5_k": 32, "q6_k": 16, **{t: 32 for t in B32_TILES}}  # G: values per lane (per scale)
TILE_KIND = {t: i for i, t in enumerate(TILE_TYPES)}
TILE_BYTES = {**KQ_BYTES, **B32_BYTES}  # bytes per (super-)block
# quants stored signed, activations plus 128 (no offset term in floats); the rest are affine
SIGNED = frozenset({"q6_k", "q8_0", "q4_0", "q5_0"})


def tiled(fmt: str) -> bool:
    """Whether ``fmt`` runs in the tiles on the CPU the kernels are compiled for. The activations
    plus 128 (up to 255) times Q8_0's quants (down to −128) overflow the 16-bit pair sums of
    AVX2's pmaddubsw (saturating): without VNNI's vpdpbusd (32-bit sums) Q8_0 keeps the float32
    GEMM."""
    return fmt in TILE_TYPES and (fmt != "q8_0" or int_dot_features() in ("avx512vnni", "avxvnni", "generic"))


LANES = 16
RT = 4  # rows per tile
TT = 4  # tokens per tile
TOKEN_BLOCK = 64  # tokens whose activations stay in L2 while every row tile passes them, at most
TOKEN_BLOCK_BYTES = 1 << 18  # and at most this many bytes of their quants (L2 holds the block)
SLAB_VALUES = 4096  # values of a row per slab: four rows' (16 KB of quants) stay in L1


def units(fmt: str, k: int) -> int:
    """Units of the lane layout in a row of k values: 16 blocks of 32 (B32_TILES), two
    super-blocks (Q4_K, Q5_K) or one (Q6_K); the last one padded with zeros."""
    if fmt in B32_TILES:
        return (k // QK + LANES - 1) // LANES
    nsb = k // QK_K
    return (nsb + 1) // 2 if LANE_VALUES[fmt] == 32 else nsb


# --- the weights, unpacked once per matmul -------------------------------------------------------
@intrinsic
def word_at(typingctx, p, o):
    """The little-endian 32-bit word at byte o of the uint8 row p: one unaligned load (the
    blocks of 18, 22 or 34 bytes put words anywhere; four byte loads and shifts took 2x)."""
    def codegen(context, builder, sig, args):
        data = array_data(context, builder, sig.args[0], args[0])
        ptr = builder.bitcast(builder.gep(data, [args[1]]), ir.IntType(32).as_pointer())
        return builder.load(ptr, align=1)

    return types.uint32(p, o), codegen


word_at_i8 = word_at  # the same load from an int8 row


@intrinsic
def _half(typingctx, bits):
    """The fp16 number whose bits are ``bits`` (uint16), as float32 (numba has no float16)."""
    def codegen(context, builder, sig, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())

    return types.float32(types.uint16), codegen


@njit(cache=True, inline="always")
def _f16(p, o):  # the little-endian fp16 at byte o of the uint8 row p
    return _half(np.uint16(p[o]) | (np.uint16(p[o + 1]) << 8))


f16_le = _f16  # the same, for the other tiles (runtime.kernels.kq_row_tiles)


@njit(cache=True, inline="always")
def _minus(x, off):
    """The four unsigned bytes of x (each < 128) minus ``off`` (≤ 128) each, as signed bytes: the
    high bits set first so that no byte borrows from the next."""
    m = np.uint32(0x80808080)
    return np.uint32((np.uint32(x) | m) - np.uint32(off * 0x01010101)) ^ m


@njit(cache=True, inline="always")
def byte_sum4(x):  # the sum of the four signed bytes of x (as unsigned bytes plus 128, minus 512)
    u = np.uint32(x) ^ np.uint32(0x80808080)
    s = (u & np.uint32(0x00FF00FF)) + ((u >> np.uint32(8)) & np.uint32(0x00FF00FF))
    return np.int32((s & np.uint32(0xFFFF)) + (s >> np.uint32(16))) - 512


@njit(cache=True, inline="always")
def _word(u, lane, w, words, natural):
    """Where word w of lane ``lane`` of unit u goes in a row of Q: the lane layout (word j of the
    unit's 16 lanes side by side), or with ``natural`` the values' own order (group u·16 + lane's
    words consecutive: what runtime.kernels.amx's tiles load)."""
    if natural:
        return (u * LANES + lane) * words + w
    return (u * words + w) * LANES + lane


# bit i of a 4-bit value moved to bit 4 of byte i: Q5_0/Q5_1's fifth bits, four values at a time
SPREAD4 = np.array([sum(((v >> i) & 1) << (8 * i + 4) for i in range(4)) for v in range(16)], np.uint32)


@njit(parallel=True, cache=True)
def unpack_rows(W, kind, bpb, nunits, Q, S, C, Z, natural=False):
    """W (n, super-blocks · bpb bytes) of TILE_TYPES[kind] -> Q (n, nunits·16·G/4) uint32 words in the
    lane layout (``natural``: (n, k/4) words in the values' order, ``_word``), S (n, nunits·16) float32 each lane's scale, and for the affine Q4_K/Q5_K C
    (float32) each lane's minimum term dmin·m, for Q6_K (SIGNED: its quants stored as q − 32) Z
    (int32, C's memory) each lane's −128·Σ(q − 32), the start of its integer sums."""
    n = W.shape[0]
    g32 = kind != 2
    nsb = W.shape[1] // bpb
    words = 8 if g32 else 4  # words per lane
    lo4 = np.uint32(0x0F0F0F0F)
    for r in prange(n):
        p = W[r]
        q = Q[r]
        for s in range(2 * nunits if g32 else nunits):
            u = s // 2 if g32 else s
            lbase = u * LANES
            if s >= nsb:  # the zero super-block that pads an odd count
                for sb in range(8):
                    lane = 8 * (s % 2) + sb
                    if not natural:
                        for w in range(words):
                            q[_word(u, lane, w, words, False)] = 0
                    S[r, lbase + lane] = 0.0
                    C[r, lbase + lane] = 0.0
                continue
            o = s * bpb
            if g32:
                d, dmin = _f16(p, o), _f16(p, o + 2)
                sc = p[o + Q4K_SCALES: o + Q4K_SCALES + 12]
                for j in range(8):  # ggml's get_scale_min_k4
                    if j < 4:
                        scj, mj = np.int32(sc[j] & 63), np.int32(sc[j + 4] & 63)
                    else:
                        scj = np.int32((sc[j + 4] & 15) | ((sc[j - 4] >> 6) << 4))
                        mj = np.int32((sc[j + 4] >> 4) | ((sc[j] >> 6) << 4))
                    lane = 8 * (s % 2) + j
                    S[r, lbase + lane] = d * np.float32(scj)
                    C[r, lbase + lane] = dmin * np.float32(mj)
                qs = o + (Q5K_QS if kind == 1 else Q4K_QS)
                for jj in range(4):  # 32 bytes: sub-block 2jj in the low nibbles, 2jj + 1 in the high
                    for w in range(8):
                        x = word_at(p, qs + 32 * jj + 4 * w)
                        lo, hi = x & lo4, (x >> 4) & lo4
                        if kind == 1:  # Q5_K: bit j of qh[l] is value l's fifth bit in sub-block j
                            h = word_at(p, o + Q5K_QH + 4 * w)
                            lo |= ((h >> (2 * jj)) & np.uint32(0x01010101)) << 4
                            hi |= ((h >> (2 * jj + 1)) & np.uint32(0x01010101)) << 4
                        q[_word(u, 8 * (s % 2) + 2 * jj, w, 8, natural)] = lo
                        q[_word(u, 8 * (s % 2) + 2 * jj + 1, w, 8, natural)] = hi
            else:
                d = _f16(p, o + Q6K_D)
                for g in range(16):
                    S[r, lbase + g] = d * np.float32(np.int8(p[o + Q6K_SCALES + g]))
                    Z[r, lbase + g] = 0
                two = np.uint32(0x03030303)
                for nh in range(2):  # 128 values each: ql[64], qh[32]
                    for part in range(4):  # quarters: ql[0:32] low nibbles, ql[32:64] low, then high
                        for half in range(2):  # values 0-15 of the quarter (lane 8nh + part·2), 16-31
                            lane = 8 * nh + 2 * part + half
                            total = np.int32(0)
                            for w4 in range(4):
                                w = 4 * half + w4
                                src = word_at(p, o + 64 * nh + 32 * (part % 2) + 4 * w)
                                h = word_at(p, o + Q6K_QH + 32 * nh + 4 * w)
                                v = _minus(((src >> np.uint32(4 * (part // 2))) & lo4)
                                           | (((h >> np.uint32(2 * part)) & two) << np.uint32(4)), 32)
                                q[_word(u, lane, w4, 4, natural)] = v
                                total += byte_sum4(v)
                            Z[r, lbase + lane] = -128 * total


# --- the activations, arranged the same way --------------------------------------------------
@njit(parallel=True, cache=True)
def arrange_x(xq, xd, xb, g32, nunits, XQ, XD, XB):  # Q6_K (not g32): the quants plus 128
    """Q8_K activations (xq (T, k) int8, xd (T, k/256), xb (T, k/16) group sums) in the lane
    layout: XQ (T, nunits·16·G/4) uint32 words, XD (T, nunits·16) each lane's d_x, XB each
    lane's d_x·(its group's Σq_x)."""
    T, k = xq.shape
    nsb = k // QK_K
    words = 8 if g32 else 4
    flip = np.uint32(0) if g32 else np.uint32(0x80808080)
    for t in prange(T):
        row = xq[t]
        out = XQ[t]
        for s in range(2 * nunits if g32 else nunits):
            u = s // 2 if g32 else s
            wbase = u * LANES * words
            lbase = u * LANES
            ngroups = 8 if g32 else 16
            for g in range(ngroups):
                lane = 8 * (s % 2) + g if g32 else g
                if s >= nsb:
                    for w in range(words):
                        out[wbase + w * LANES + lane] = 0
                    XD[t, lbase + lane] = 0.0
                    XB[t, lbase + lane] = 0.0
                    continue
                v0 = s * QK_K + g * (4 * words)
                for w in range(words):
                    out[wbase + w * LANES + lane] = word_at_i8(row, v0 + 4 * w) ^ flip
                dx = xd[t, s]
                bs = np.int32(xb[t, s * 16 + 2 * g]) + np.int32(xb[t, s * 16 + 2 * g + 1]) if g32 else np.int32(xb[t, s * 16 + g])
                XD[t, lbase + lane] = dx
                XB[t, lbase + lane] = dx * np.float32(bs)


@njit(parallel=True, cache=True)
def unpack_b32_rows(W, kind, bpb, nunits, Q, S, C, Z, natural=False):
    """``unpack_rows`` for the 32-value blocks (B32_TILES[kind − len(KQ_TILES)]): lane l of unit
    u is block 16u + l, S its d (``natural``: Q (n, k/4) words in the values' order). Q8_0, Q4_0 and Q5_0 (SIGNED) store their signed quants (Q4_0's
    minus 8, Q5_0's minus 16) and Z (int32, C's memory) −128·Σq per block; Q4_1 and Q5_1 their
    unsigned quants and C the minimum term −m."""
    n = W.shape[0]
    nb = W.shape[1] // bpb
    t = kind - len(KQ_TILES)  # 0 q8_0, 1 q4_0, 2 q4_1, 3 q5_0, 4 q5_1
    lo4 = np.uint32(0x0F0F0F0F)
    for r in prange(n):
        p = W[r]
        q = Q[r]
        for bi in range(nunits * LANES):
            u, lane = bi // LANES, bi % LANES
            if bi >= nb:
                if not natural:
                    for w in range(8):
                        q[_word(u, lane, w, 8, False)] = 0
                S[r, bi] = 0.0
                C[r, bi] = 0.0
                continue
            o = bi * bpb
            d = _f16(p, o)
            S[r, bi] = d
            total = np.int32(0)
            if t == 0:
                for w in range(8):
                    v = word_at(p, o + 2 + 4 * w)
                    q[_word(u, lane, w, 8, natural)] = v
                    total += byte_sum4(v)
                Z[r, bi] = -128 * total
                continue
            qs = o + (2 if t == 1 else 4 if t == 2 else 6 if t == 3 else 8)
            qh = word_at(p, o + (2 if t == 3 else 4)) if t >= 3 else np.uint32(0)
            for w in range(8):
                x = word_at(p, qs + 4 * (w % 4))
                v = x & lo4 if w < 4 else (x >> np.uint32(4)) & lo4
                if t >= 3:  # bit l of qh is value l's fifth bit
                    v |= SPREAD4[(qh >> np.uint32(4 * w)) & np.uint32(15)]
                if t == 1 or t == 3:
                    v = _minus(v, 8 if t == 1 else 16)
                    total += byte_sum4(v)
                q[_word(u, lane, w, 8, natural)] = v
            if t == 1 or t == 3:
                Z[r, bi] = -128 * total
            else:
                C[r, bi] = -_f16(p, o + 2)


@njit(parallel=True, cache=True)
def arrange_x32(xq, xd, signed, nunits, XQ, XD, XB):
    """Q8_0 activations (xq (T, k) int8, xd (T, k/32) their fp16-rounded d) in the 32-value
    blocks' lane layout: XQ words (plus 128 for the SIGNED weights), XD each lane's d_x, XB
    d_x·Σq_x of its block."""
    T, k = xq.shape
    nb = k // QK
    flip = np.uint32(0x80808080) if signed else np.uint32(0)
    for t in prange(T):
        row = xq[t]
        out = XQ[t]
        for bi in range(nunits * LANES):
            wbase = (bi // LANES) * LANES * 8 + bi % LANES
            if bi >= nb:
                for w in range(8):
                    out[wbase + w * LANES] = 0
                XD[t, bi] = 0.0
                XB[t, bi] = 0.0
                continue
            total = np.int32(0)
            for w in range(8):
                v = word_at_i8(row, bi * QK + 4 * w)
                out[wbase + w * LANES] = v ^ flip
                total += byte_sum4(v)
            XD[t, bi] = xd[t, bi]
            XB[t, bi] = xd[t, bi] * np.float32(total)


# --- the register tile ---------------------------------------------------------------------------
def _transpose_sums(b, vs):
    """One <16 x float> whose lane i is the sum of vs[i]'s 16 lanes (16 vectors): four levels of
    two shuffles and an add per pair, each halving the lanes per vector (45 operations where
    16 separate horizontal sums took 128; with short rows, K = 640, they had cost as much as
    the tile's dot products)."""
    seg = 16
    while len(vs) > 1:
        half = seg // 2
        m = 16 // seg
        lo = [k * seg + i for k in range(m) for i in range(half)]
        hi = [k * seg + half + i for k in range(m) for i in range(half)]
        idx_lo = const(ir.VectorType(ir.IntType(32), 16), lo + [16 + x for x in lo])
        idx_hi = const(ir.VectorType(ir.IntType(32), 16), hi + [16 + x for x in hi])
        vs = [b.fadd(b.shuffle_vector(vs[i], vs[i + 1], idx_lo), b.shuffle_vector(vs[i], vs[i + 1], idx_hi), flags=FAST)
              for i in range(0, len(vs), 2)]
        seg = half
    return vs[0]


def _tile_codegen(words, signed, planes=1):
    """The 4 × 4 tile of G = 4·words values per lane. ``signed``: the weights' quants are signed
    and the activations' unsigned (q_x + 128), each pair's integer sums start from the row's
    −128·Σq_w (``c`` holds it as int32) and no offset term is left for the floats; otherwise
    the weights' quants are unsigned, the activations signed, and c·(d_x·bsum) comes off.
    ``planes`` 2 ("int16"): a second activation array after xb, the first plane's remainder in
    steps of 1/128 of its (quantize.residual_plane); the int32 sums of the first plane are
    shifted left by 7 and the second's added (from the row's start again where ``signed``): the
    exact sums of the 16-bit activations 128·q + q_lo, whose d (xd) and sums (xb) the caller
    gave in steps of d/128 (``arranged_two``)."""
    def codegen(context, builder, sig, args):
        how = int_dot_features()
        na = 6 + planes - 1  # arrays before the integers
        q, s, c, xq, xd, xb = (array_data(context, builder, sig.args[i], args[i]) for i in range(6))
        xq2 = array_data(context, builder, sig.args[6], args[6]) if planes == 2 else xq
        r0, t0, nu, u0, u1 = args[na:na + 5]  # the tile's first row and token; the slab's units
        rows = [builder.add(r0, const(r0.type, i)) for i in range(RT)]  # consecutive (padded to 4)
        toks = [builder.add(t0, const(t0.type, i)) for i in range(TT)]
        ity = nu.type
        qlen = builder.mul(nu, const(ity, LANES * words * 4))  # bytes per row of Q / XQ
        slen = builder.mul(nu, const(ity, LANES))
        i8p = ir.IntType(8).as_pointer()
        qb = builder.bitcast(q, i8p)
        xqb = builder.bitcast(xq, i8p)
        wq = [builder.gep(qb, [builder.mul(r, qlen)]) for r in rows]
        ws = [builder.gep(s, [builder.mul(r, slen)]) for r in rows]
        wc = [builder.gep(c, [builder.mul(r, slen)]) for r in rows]
        xqs = [builder.gep(xqb, [builder.mul(t, qlen)]) for t in toks]
        xqb2 = builder.bitcast(xq2, i8p)
        planes_x = [xqs, [builder.gep(xqb2, [builder.mul(t, qlen)]) for t in toks]][:planes]
        xds = [builder.gep(xd, [builder.mul(t, slen)]) for t in toks]
        xbs = [builder.gep(xb, [builder.mul(t, slen)]) for t in toks]
        ST = ir.LiteralStructType([V16F] * (RT * TT))
        init = ir.Constant(ST, [const(V16F, [0.0] * 16)] * (RT * TT))
        vnni = how in ("avx512vnni", "avxvnni")

        def body(u, accs):
            qo = builder.mul(u, const(ity, LANES * words * 4))
            so = builder.mul(u, const(ity, LANES))
            # word j of every row and token, then the tile's RT·TT integer dots of it: each
            # vector is loaded once per unit and dies after its TT (RT) uses, so the RT·TT int32
            # sums and the float accumulators are what stays in registers (two tokens at a time,
            # fewer registers, spilled more in numba's asm)
            if signed:
                start = [builder.bitcast(vload(builder, wc[r], so, V16F, 4), V16I32) for r in range(RT)]
                isum = [[start[r]] * TT for r in range(RT)]
            else:
                isum = [[None] * TT for _ in range(RT)]
            for p, xrows in enumerate(planes_x):
                if p:  # the first plane's sums × 128, then the second's from the row's start again
                    seven = const(V16I32, [7] * 16)
                    isum = [[builder.add(builder.shl(isum[r][t], seven), start[r]) if signed else builder.shl(isum[r][t], seven)
                             for t in range(TT)] for r in range(RT)]
                for j in range(words):
                    off = builder.add(qo, const(ity, 64 * j))
                    wv = [vload(builder, wq[r], off, V64I8, 1) for r in range(RT)]
                    xv = [vload(builder, xrows[t], off, V64I8, 1) for t in range(TT)]
                    for r in range(RT):
                        for t in range(TT):
                            u8, s8 = (xv[t], wv[r]) if signed else (wv[r], xv[t])
                            if vnni:
                                isum[r][t] = idot_u8s8(builder, u8, s8, how, acc=isum[r][t])
                            else:
                                part = idot_u8s8(builder, u8, s8, how)
                                isum[r][t] = part if isum[r][t] is None else builder.add(isum[r][t], part)
            sr = [vload(builder, ws[r], so, V16F, 4) for r in range(RT)]
            cr = None if signed else [vload(builder, wc[r], so, V16F, 4) for r in range(RT)]
            for t in range(TT):
                dx = vload(builder, xds[t], so, V16F, 4)
                bx = None if signed else vload(builder, xbs[t], so, V16F, 4)
                for r in range(RT):
                    a = builder.extract_value(accs, r * TT + t)
                    a = builder.fadd(a, builder.fmul(builder.sitofp(isum[r][t], V16F), builder.fmul(sr[r], dx, flags=FAST),
                                                     flags=FAST), flags=FAST)
                    if not signed:
                        a = builder.fsub(a, builder.fmul(cr[r], bx, flags=FAST), flags=FAST)
                    accs = builder.insert_value(accs, a, r * TT + t)
            return accs

        accs = ir_loop(builder, u1, init, body, start=u0)
        sums = _transpose_sums(builder, [builder.extract_value(accs, i) for i in range(RT * TT)])
        out = [builder.extract_element(sums, const(ir.IntType(32), i)) for i in range(RT * TT)]
        return context.make_tuple(builder, sig.return_type, out)

    return codegen


def _tile(words, signed, planes=1):
    gen = _tile_codegen(words, signed, planes)
    out = types.UniTuple(types.float32, RT * TT)

    if planes == 1:
        def typer(typingctx, q, s, c, xq, xd, xb, r0, t0, nu, u0, u1):
            return out(q, s, c, xq, xd, xb, r0, t0, nu, u0, u1), gen
    else:
        def typer(typingctx, q, s, c, xq, xd, xb, xq2, r0, t0, nu, u0, u1):
            return out(q, s, c, xq, xd, xb, xq2, r0, t0, nu, u0, u1), gen

    typer.__name__ = f"kq_tile_{words}{'s' if signed else ''}{'_2' if planes == 2 else ''}"
    return intrinsic(typer)


_tile8, _tile8s, _tile4s = _tile(8, False), _tile(8, True), _tile(4, True)
_tile8_2, _tile8s_2, _tile4s_2 = _tile(8, False, 2), _tile(8, True, 2), _tile(4, True, 2)


@njit(parallel=True, fastmath=True, cache=True)
def tiles(Q, S, C, XQ, XD, XB, XQ2, two, g32, signed, nunits, n, T, tblock, Y, y0):
    """Y[:T, y0 + r] = the products of the lane-layout rows r < n of (Q, S, C) with the tokens of
    (XQ, XD, XB) (``two``: and the second plane XQ2, ``_tile_codegen``), by 4 × 4 register
    tiles (rows and tokens padded with zeros to multiples of 4): token blocks of ``tblock``
    (their activations stay in L2), row tiles in parallel, each row tile's units in slabs of
    about SLAB_VALUES values (four rows' slab stays in L1 while the block's tokens pass it)."""
    slab = max(1, SLAB_VALUES // (LANES * (32 if g32 else 16)))
    for tb in range(0, T, tblock):
        te = min(T, tb + tblock)
        for g in prange((n + RT - 1) // RT):
            r = RT * g
            for u0 in range(0, nunits, slab):
                u1 = min(nunits, u0 + slab)
                for t in range(tb, te, TT):
                    if two:
                        if not g32:
                            y = _tile4s_2(Q, S, C, XQ, XD, XB, XQ2, r, t, nunits, u0, u1)
                        elif signed:
                            y = _tile8s_2(Q, S, C, XQ, XD, XB, XQ2, r, t, nunits, u0, u1)
                        else:
                            y = _tile8_2(Q, S, C, XQ, XD, XB, XQ2, r, t, nunits, u0, u1)
                    elif not g32:
                        y = _tile4s(Q, S, C, XQ, XD, XB, r, t, nunits, u0, u1)
                    elif signed:
                        y = _tile8s(Q, S, C, XQ, XD, XB, r, t, nunits, u0, u1)
                    else:
                        y = _tile8(Q, S, C, XQ, XD, XB, r, t, nunits, u0, u1)
                    for i in range(RT):
                        if r + i < n:
                            for j in range(TT):
                                if t + j < te:
                                    if u0 == 0:
                                        Y[t + j, y0 + r + i] = y[i * TT + j]
                                    else:
                                        Y[t + j, y0 + r + i] += y[i * TT + j]


# --- a whole matrix ---------------------------------------------------------------------------
_BUFS: dict = {}  # reused buffers by name: fresh pages per matmul are page-faulted in each time


def reused_buffer(name: str, n: int, dtype) -> np.ndarray:
    """n elements of ``dtype`` from the buffer kept under ``name`` (grown when too small): the
    tiles' unpacked chunks, here and in runtime.kernels.amx."""
    b = _BUFS.get(name)
    if b is None or b.size < n or b.dtype != dtype:
        b = _BUFS[name] = np.empty(n, dtype)
    return b[:n]


def arranged(fmt: str, xq: np.ndarray, xd: np.ndarray, xb: np.ndarray | None = None):
    """The activations' int8 blocks in ``fmt``'s lane layout: (XQ, XD, XB); Q8_K blocks
    (``quantize_activations_k``: xq, xd, xb) for the K-quants, Q8_0 blocks (xq, xd) for the
    32-value types."""
    T, k = xq.shape
    nu = units(fmt, k)
    words = LANE_VALUES[fmt] // 4
    Tp = -(-T // TT) * TT  # tokens padded with zeros to whole tiles
    XQ = np.empty((Tp, nu * LANES * words), np.uint32)
    XD = np.empty((Tp, nu * LANES), np.float32)
    XB = np.empty((Tp, nu * LANES), np.float32)
    for a in (XQ, XD, XB):
        a[T:] = 0
    if fmt in B32_TILES:
        arrange_x32(xq, xd, fmt in SIGNED, nu, XQ[:T], XD[:T], XB[:T])
    else:
        arrange_x(xq, xd, xb, LANE_VALUES[fmt] == 32, nu, XQ[:T], XD[:T], XB[:T])
    return XQ, XD, XB


def arranged_two(fmt: str, X: np.ndarray, xq: np.ndarray, xd: np.ndarray, xb: np.ndarray | None = None):
    """``arranged`` of X's int8 blocks (xq, xd[, xb]) plus their second plane
    (quantize.residual_plane) in the same layout: (XQ, XD, XB, XQ2) with XD each lane's d/128
    and XB the lane's d/128·Σ(128·q + q_lo), what the two-plane tiles multiply."""
    XQ, XD, XB = arranged(fmt, xq, xd, xb)
    lo = residual_plane(np.ascontiguousarray(X, np.float32), xq, xd, xq.shape[1] // xd.shape[1])
    lo_sums = None if fmt in B32_TILES else lo.reshape(lo.shape[0], -1, 16).sum(axis=2, dtype=np.int16)
    XQ2, _, XB2 = arranged(fmt, lo, xd, lo_sums)
    XD /= np.float32(LO_STEPS)
    XB += XB2 / np.float32(LO_STEPS)
    return XQ, XD, XB, XQ2


def mm_tiles(fmt: str, W: np.ndarray, xs, Y: np.ndarray, chunk_values: int, kept=None) -> None:
    """Y (T, n) = the int8 products of every row of W (``fmt`` in TILE_TYPES, the file's bytes)
    with the tokens ``xs`` (``arranged``; ``arranged_two``: 16-bit activations in two planes),
    the rows unpacked in chunks of at most ``chunk_values`` values (each chunk then meets every
    token), or taken unpacked from ``kept`` ((Q, S, C, rows padded) of every row: amx.kept_rows)."""
    XQ, XD, XB = xs[:3]
    XQ2 = xs[3] if len(xs) == 4 else XQ
    T = Y.shape[0]
    n = W.shape[0]
    k = W.shape[1] // TILE_BYTES[fmt] * (QK if fmt in B32_TILES else QK_K)
    nu = units(fmt, k)
    words = LANE_VALUES[fmt] // 4
    g32 = LANE_VALUES[fmt] == 32
    tblock = max(TT, min(TOKEN_BLOCK, TOKEN_BLOCK_BYTES // (4 * XQ.shape[1] * (len(xs) - 2))) // TT * TT)
    if kept is not None:
        Q, S, C = kept[:3]
        tiles(Q, S, C, XQ, XD, XB, XQ2, len(xs) == 4, g32, fmt in SIGNED, nu, n, T, tblock, Y, 0)
        return
    step = max(RT, min(n, chunk_values // max(1, nu * LANES * LANE_VALUES[fmt])) // RT * RT)
    rows = step + RT  # whole tiles, the last one's padding rows zero
    Q = reused_buffer("q", rows * nu * LANES * words, np.uint32).reshape(rows, -1)
    S = reused_buffer("s", rows * nu * LANES, np.float32).reshape(rows, -1)
    C = reused_buffer("c", rows * nu * LANES, np.float32).reshape(rows, -1)
    for r0 in range(0, n, step):
        r1 = min(n, r0 + step)
        m = r1 - r0
        unpack = unpack_b32_rows if fmt in B32_TILES else unpack_rows
        unpack(W[r0:r1], TILE_KIND[fmt], TILE_BYTES[fmt], nu, Q[:m], S[:m], C[:m], C[:m].view(np.int32))
        mp = -(-m // RT) * RT
        for a in (Q, S, C):
            a[m:mp] = 0
        tiles(Q, S, C, XQ, XD, XB, XQ2, len(xs) == 4, g32, fmt in SIGNED, nu, m, T, tblock, Y, r0)
