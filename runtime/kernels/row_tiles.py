"""Many tokens times a matrix of signed 32-value blocks (Q8_0, Q4_0, Q5_0) in int8, with 16 rows
in the lanes of one vector: the register tiles for short rows.

``kq_tiles`` puts 16 *blocks of one row* side by side in a vector (a unit), so a row of k values
takes ⌈k/512⌉ units and the last is padded with zeros: a row of 640 values (the real Gemma 3
270M's Q5_0 matrices and its Q8_0 output head) is 20 blocks in two units of 16, 1.6× the
dot products of its values, and each pair (row, token) ends in a sum across the 16 lanes. Here
lane i holds *row i* of a group of 16 rows instead: word j of block b of the 16 rows is one
vector, and the token's word j of block b is broadcast to all lanes, so one vpdpbusd makes 16
rows' partial sums for one token, no block is padded (rows of any number of blocks), and the
vector of 16 sums is 16 outputs as it stands (no sums across lanes):

    y[r, t] = Σ_b d_w(r, b)·d_x(t, b)·(−128·Σq_w + Σ q_w·(q_x + 128))

the activations plus 128 (vpdpbusd takes one unsigned operand) and each sum started at the row's
−128·Σq_w, as in ``kq_tiles`` (its SIGNED types). Two activation planes ("int16": 16-bit values
128·q + q_lo, ``quantize.residual_plane``) shift the first plane's sums left by 7 and add the
second's, started again at −128·Σq_w: the exact sums of the 16-bit products. The integer sums
are the one-token kernels'; the float sums run in another order (float32 rounding).

Each group of 16 rows is moved into this layout (from the values' order ``unpack_b32_rows``
writes, as the AMX tiles keep it) once, in a buffer of the thread's (a row of 640 values: 10 KB,
in L1), and every token then passes it.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

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
    splat,
    vload,
    vstore,
)
from runtime.kernels.kq_tiles import TILE_KIND, reused_buffer, units, unpack_b32_rows
from runtime.kernels.quantize import LO_STEPS, residual_plane
from runtime.kernels.type_traits import names

ROW_TYPES = names(tile="rows")  # kq_tiles' SIGNED 32-value blocks (type_traits' "rows" form)
GROUP_ROWS = 16  # rows per group: the lanes of a vector of int32 sums
TOKENS = 8  # tokens per tile: 8 float accumulators, 8 weight vectors, scales and starts in registers
WORDS = 8  # 4-byte words per 32-value block


def _row_tile_codegen(planes):
    """The tile of 16 rows × TOKENS tokens over every block: (QT, ST, ZT, XQ, XD, XQ2, O, nb, kw,
    nbx, t0) -> O (TOKENS, 16) float32; QT (nb·8, 16) the rows' words (lane i: row i), ST and ZT
    (nb, 16) their blocks' d and −128·Σq, XQ/XQ2 (tokens, kw) the activations' words (bytes
    q + 128), XD (tokens, nbx) their blocks' d (of the 16-bit values' steps for two planes)."""
    def codegen(context, builder, sig, args):
        how = int_dot_features()
        vnni = how in ("avx512vnni", "avxvnni")
        qt, st, zt, xq, xd, xq2, o = (array_data(context, builder, sig.args[i], args[i]) for i in range(7))
        nb, kw, nbx, t0 = args[7:11]
        ity = nb.type
        toks = [builder.add(t0, const(ity, i)) for i in range(TOKENS)]
        xrows = [[builder.gep(p, [builder.mul(t, kw)]) for t in toks] for p in (xq, xq2)[:planes]]
        xds = [builder.gep(xd, [builder.mul(t, nbx)]) for t in toks]
        qt32 = builder.bitcast(qt, ir.IntType(32).as_pointer())
        zt32 = builder.bitcast(zt, ir.IntType(32).as_pointer())
        ST_ = ir.LiteralStructType([V16F] * TOKENS)
        init = ir.Constant(ST_, [const(V16F, [0.0] * 16)] * TOKENS)
        seven = const(V16I32, [7] * 16)

        def body(b, accs):
            wo = builder.mul(b, const(ity, WORDS * GROUP_ROWS))
            so = builder.mul(b, const(ity, GROUP_ROWS))
            wv = [builder.bitcast(vload(builder, qt32, builder.add(wo, const(ity, GROUP_ROWS * j)), V16I32, 4), V64I8)
                  for j in range(WORDS)]
            s = vload(builder, st, so, V16F, 4)
            z = vload(builder, zt32, so, V16I32, 4)
            xo = builder.mul(b, const(ity, WORDS))
            for t in range(TOKENS):
                isum = z
                for p in range(planes):
                    if p:
                        isum = builder.add(builder.shl(isum, seven), z)
                    for j in range(WORDS):
                        word = builder.load(builder.gep(xrows[p][t], [builder.add(xo, const(ity, j))]), align=4)
                        xv = builder.bitcast(splat(builder, word, 16), V64I8)  # the token's word in every lane
                        if vnni:
                            isum = idot_u8s8(builder, xv, wv[j], how, acc=isum)
                        else:
                            isum = builder.add(isum, idot_u8s8(builder, xv, wv[j], how))
                dxs = splat(builder, builder.load(builder.gep(xds[t], [b]), align=4), 16)
                a = builder.extract_value(accs, t)
                a = builder.fadd(a, builder.fmul(builder.sitofp(isum, V16F), builder.fmul(s, dxs, flags=FAST), flags=FAST),
                                 flags=FAST)
                accs = builder.insert_value(accs, a, t)
            return accs

        accs = ir_loop(builder, nb, init, body)
        for t in range(TOKENS):
            vstore(builder, builder.extract_value(accs, t), o, const(ity, 16 * t), 4)
        return context.get_dummy_value()

    return codegen


def _row_tile(planes):
    gen = _row_tile_codegen(planes)

    def typer(typingctx, qt, st, zt, xq, xd, xq2, o, nb, kw, nbx, t0):
        return types.void(qt, st, zt, xq, xd, xq2, o, nb, kw, nbx, t0), gen

    typer.__name__ = f"row_tile_{planes}"
    return intrinsic(typer)


_tile1, _tile2 = _row_tile(1), _row_tile(2)


@njit(parallel=True, fastmath=True, cache=True)
def row_tiles(Q, S, Z, grouped, XQ, XD, XQ2, two, nb, n, T, Y, y0):
    """Y[:T, y0 + r] = the products of rows r < n of (Q, S, Z) with the T tokens of (XQ, XD) (and
    the second plane XQ2 where ``two``), the groups of 16 rows in parallel. (Q, S, Z): the
    values' order (Q (rows, ≥ nb·8) words, S (rows, ≥ nb) the blocks' d, Z (rows, ≥ nb) int32
    −128·Σq; each group moved into the tile's layout in a buffer first) or, ``grouped``, already
    in it (``to_rows``: one row of Q, S, Z per group of 16 rows)."""
    Tp = XQ.shape[0]
    kw = XQ.shape[1]
    nbx = XD.shape[1]
    for g in prange((n + GROUP_ROWS - 1) // GROUP_ROWS):
        r0 = GROUP_ROWS * g
        m = min(GROUP_ROWS, n - r0)
        if grouped:
            qt, st, zt = Q[g], S[g], Z[g]
        else:
            qt = np.zeros(nb * WORDS * GROUP_ROWS, np.uint32)
            st = np.zeros(nb * GROUP_ROWS, np.float32)
            zt = np.zeros(nb * GROUP_ROWS, np.int32)
            _group(Q, S, Z, r0, m, nb, qt, st, zt)
        O = np.empty(TOKENS * GROUP_ROWS, np.float32)
        for t in range(0, Tp, TOKENS):
            if two:
                _tile2(qt, st, zt, XQ, XD, XQ2, O, nb, kw, nbx, t)
            else:
                _tile1(qt, st, zt, XQ, XD, XQ2, O, nb, kw, nbx, t)
            for j in range(min(TOKENS, T - t)):
                for i in range(m):
                    Y[t + j, y0 + r0 + i] = O[j * GROUP_ROWS + i]


@njit(cache=True, inline="always")
def _group(Q, S, Z, r0, m, nb, qt, st, zt):  # rows r0 .. r0 + m of the values' order into lanes
    for i in range(m):
        for w in range(nb * WORDS):
            qt[w * GROUP_ROWS + i] = Q[r0 + i, w]
        for b in range(nb):
            st[b * GROUP_ROWS + i] = S[r0 + i, b]
            zt[b * GROUP_ROWS + i] = Z[r0 + i, b]


@njit(parallel=True, cache=True)
def to_rows(Q, S, Z, nb, n, QT, ST, ZT):
    """Rows of the values' order (``row_tiles``) into the tile's layout, a row of (QT, ST, ZT) per
    group of 16 rows (zeros past n): what ``kept_rows`` keeps for the row tiles."""
    for g in prange((n + GROUP_ROWS - 1) // GROUP_ROWS):
        QT[g] = 0
        ST[g] = 0
        ZT[g] = 0
        _group(Q, S, Z, GROUP_ROWS * g, min(GROUP_ROWS, n - GROUP_ROWS * g), nb, QT[g], ST[g], ZT[g])


def grouped_shapes(n: int, nb: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """The shapes of (QT) and (ST, ZT) of n rows of nb blocks in the tile's layout."""
    ng = -(-n // GROUP_ROWS)
    return (ng, nb * WORDS * GROUP_ROWS), (ng, nb * GROUP_ROWS)


def pads_lanes(k: int) -> bool:
    """Whether a row of k values fills the lane tiles' last unit of 16 blocks to 7/8 or less
    (runtime.kernels.kq_tiles.units), i.e. an eighth or more of their dot products are padding."""
    nb = k // QK
    lanes = -(-nb // 16) * 16
    return 8 * (lanes - nb) >= lanes


def arranged_rows(xq: np.ndarray, xd: np.ndarray, X: np.ndarray | None = None):
    """Q8_0 activation blocks (xq (T, k) int8, xd (T, k/32)) as ``row_tiles`` takes them: (XQ, XD,
    XQ2) with XQ2 XQ itself, tokens padded with zeros to whole tiles; with X (the float
    activations) XQ2 the second plane (``residual_plane``), XD then in the 16-bit values' steps
    (d/128)."""
    T, k = xq.shape
    Tp = -(-T // TOKENS) * TOKENS
    XQ = np.zeros((Tp, k), np.uint8)
    XQ[:T] = xq.view(np.uint8) ^ np.uint8(0x80)
    XD = np.zeros((Tp, xd.shape[1]), np.float32)
    XD[:T] = xd
    if X is None:
        words = XQ.view(np.uint32)
        return words, XD, words  # one object: ``mm_rows`` reads one plane
    lo = residual_plane(np.ascontiguousarray(X, np.float32), xq, xd, k // xd.shape[1])
    XQ2 = np.zeros((Tp, k), np.uint8)
    XQ2[:T] = lo.view(np.uint8) ^ np.uint8(0x80)
    XD /= np.float32(LO_STEPS)
    return XQ.view(np.uint32), XD, XQ2.view(np.uint32)


def mm_rows(fmt: str, W: np.ndarray, xs, Y: np.ndarray, chunk_values: int, kept=None) -> None:
    """Y (T, n) = the int8 products of every row of W (``fmt`` in ROW_TYPES, the file's bytes) with
    the tokens ``xs`` (``arranged_rows``), the rows unpacked in chunks of at most ``chunk_values``
    values (each chunk then meets every token), or taken from ``kept`` ((QT, ST, ZT), ``to_rows``)."""
    XQ, XD, XQ2 = xs
    T, n = Y.shape[0], W.shape[0]
    nb = W.shape[1] // B32_BYTES[fmt]
    two = XQ2 is not XQ
    if kept is not None:
        row_tiles(*kept[:3], True, XQ, XD, XQ2, two, nb, n, T, Y, 0)
        return
    step = max(GROUP_ROWS, min(n, chunk_values // (nb * QK)) // GROUP_ROWS * GROUP_ROWS)
    nu = units(fmt, nb * QK)
    Q = reused_buffer("rows_q", step * nb * WORDS, np.uint32).reshape(step, nb * WORDS)
    S = reused_buffer("rows_s", step * nu * 16, np.float32).reshape(step, nu * 16)
    C = reused_buffer("rows_c", step * nu * 16, np.float32).reshape(step, nu * 16)
    for r0 in range(0, n, step):
        m = min(n, r0 + step) - r0
        unpack_b32_rows(W[r0:r0 + m], TILE_KIND[fmt], B32_BYTES[fmt], nu, Q[:m], S[:m], C[:m], C[:m].view(np.int32), True)
        row_tiles(Q[:m], S[:m], C[:m].view(np.int32), False, XQ, XD, XQ2, two, nb, m, T, Y, r0)
