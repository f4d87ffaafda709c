"""The 4 × 4 register tile of runtime.kernels.kq_tiles (its docstring gives the sums): the LLVM IR
of one tile (RT rows × TT tokens over a slab of units: vpdpbusd per word, then the scales in
float, the 16 lanes of each sum reduced by one transpose) and the compiled loop that runs the
tiles over token blocks, row tiles and slabs.
"""

from __future__ import annotations

from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

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
from runtime.kernels.kq_lanes import LANES

RT = 4  # rows per tile
TT = 4  # tokens per tile
SLAB_VALUES = 4096  # values of a row per slab: four rows' (16 KB of quants) stay in L1


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
