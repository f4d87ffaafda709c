"""The lane layout of runtime.kernels.kq_tiles (its docstring describes it): the tiled types'
tables, the units of a row, the weights' blocks unpacked into the layout once per matmul (with
``natural``: into the values' own order, what runtime.kernels.amx's tiles load), and the
activations' int8 blocks arranged the same way; the word, fp16 and signed-byte helpers the
other tiles (runtime.kernels.amx, kq_row_tiles, row_tiles) load with too.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from aios.quant import QK_K
from runtime.kernels.blocks32 import B32_BYTES, QK
from runtime.kernels.ir_helpers import array_data
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
from runtime.kernels.type_traits import TYPE_TRAITS, names

# the types whose rows in runtime.kernels.type_traits take the "lanes" tile form
KQ_TILES = names("kq", tile="lanes")
B32_TILES = names("b32", tile="lanes")  # a lane per block (IQ4_NL: the float32 GEMM)
TILE_TYPES = KQ_TILES + B32_TILES
LANE_VALUES = {t: TYPE_TRAITS[t].scale_values for t in TILE_TYPES}  # G: values per lane (per scale)
TILE_KIND = {t: i for i, t in enumerate(TILE_TYPES)}
TILE_BYTES = {**KQ_BYTES, **B32_BYTES}  # bytes per (super-)block
# quants stored signed, activations plus 128 (no offset term in floats); the rest are affine
SIGNED = frozenset(t for t in TILE_TYPES if not TYPE_TRAITS[t].affine)

LANES = 16  # lanes per unit (one 64-byte vector of 32-bit words)


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
    blocks of 18, 22 or 34 bytes put words anywhere; four byte loads and shifts were slower)."""
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
