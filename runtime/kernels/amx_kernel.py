"""The AMX tile kernel (runtime.kernels.amx runs it): the LDTILECFG operand, the LLVM IR of one
row tile's pass over a token block (TDPBUSD/TDPBSSD per group into 16 × 16 int32 sums, then the
group's scales in AVX-512 floats, the 16 × 16 float sums transposed in registers and stored as 16
tokens' rows of Y), and the compiled loops that run it over a chunk's row tiles and token blocks.
The formula and the tile shapes are in runtime.kernels.amx's docstring.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from runtime.kernels.ir_helpers import (
    FAST,
    V16F,
    V16I32,
    array_data,
    const,
    declare,
    ir_loop,
    vload,
)

AMX_ROWS = 16  # weight rows per tile (the A tile's rows, the C tile's rows)
AMX_TOKENS = 16  # tokens per tile (the B tile's 64 bytes, the C tile's 16 int32 columns)
# groups whose tiles are multiplied and stored ahead of the group whose floats run (groups per row:
# a multiple of AMX_AHEAD + 1). None ahead: 1 or 3 ahead gained nothing measurable
# (docs/benchmarks.md, "AMX tiles").
AMX_AHEAD = 0
AMX_ROW_TILES = 4  # row tiles one thread runs per token block (its activations stay in L1/L2 for them)


def amx_tile_config(group_bytes: int) -> np.ndarray:
    """The 64-byte LDTILECFG operand: palette 1; tiles 0-3 the 16 × 16 int32 sums of the groups in
    flight, 4 and 6 the weights (16 rows × G bytes), 5 and 7 the activations (G/4 rows × 64
    bytes)."""
    cfg = np.zeros(64, np.uint8)
    cfg[0] = 1
    c, a, b = (AMX_ROWS, 4 * AMX_TOKENS), (AMX_ROWS, group_bytes), (group_bytes // 4, 4 * AMX_TOKENS)
    for t, (rows, colsb) in enumerate((c, c, c, c, a, b, a, b)):
        cfg[16 + 2 * t: 18 + 2 * t] = np.frombuffer(np.uint16(colsb).tobytes(), np.uint8)
        cfg[48 + t] = rows
    return cfg


# --- the tile kernel -------------------------------------------------------------------------------
def _transpose16(b, vs):
    """The 16 × 16 transpose of 16 <16 x float> (vector i lane j -> vector j lane i): four stages,
    each swapping one bit of the vector index with the same bit of the lane index by
    two-source shuffles."""
    for h in (1, 2, 4, 8):
        out = []
        for i in range(16):
            lo, hi = vs[i & ~h], vs[i | h]
            ih = (i & h) != 0
            # lane j of the new vector i: from lo if bit h of j is clear, else from hi; at the lane
            # of j with bit h set to bit h of i
            mask = [(j & ~h | (h if ih else 0)) + (16 if j & h else 0) for j in range(16)]
            out.append(b.shuffle_vector(lo, hi, const(ir.VectorType(ir.IntType(32), 16), mask)))
        vs = out
    return vs


def _amx_codegen(group_bytes, signed, planes=1):
    """The tile kernel's IR; ``planes`` 2: a second activation plane (``residual_plane``, its
    words at the argument after xa) multiplied by the same weight tile into tile 1 (its B tile 7),
    the sums added as 128·first + second before the float step (AMX_AHEAD must be 0)."""
    assert planes == 1 or AMX_AHEAD == 0
    na = 8 + (planes == 2)

    def codegen(context, builder, sig, args):
        i8 = ir.IntType(8)
        i64 = ir.IntType(64)
        p8 = i8.as_pointer()
        void = ir.VoidType()
        arrays = [array_data(context, builder, sig.args[i], args[i]) for i in range(na)]
        cfg, q, s, c, xa, *rest = arrays
        xa_lo = rest.pop(0) if planes == 2 else None
        xd, xb, y = rest
        kbytes, sl, ng, tp, T, ldy, r0, tb, nrows = (builder.sext(a, i64) if a.type.width < 64 else a
                                                     for a in args[na:na + 9])
        builder.call(declare(builder, "llvm.x86.ldtilecfg", void, [p8]), [builder.bitcast(cfg, p8)])
        load = declare(builder, "llvm.x86.tileloadd64", void, [i8, p8, i64])
        dot = declare(builder, "llvm.x86.tdpbssd" if signed else "llvm.x86.tdpbusd", void, [i8, i8, i8])
        zero = declare(builder, "llvm.x86.tilezero", void, [i8])
        store = declare(builder, "llvm.x86.tilestored64", void, [i8, p8, i64])
        cbuf = [cgutils.alloca_once(builder, ir.ArrayType(ir.IntType(32), AMX_ROWS * AMX_TOKENS)) for _ in range(AMX_AHEAD + 1)]
        for cb in cbuf:
            cb.align = 64
        cb8 = [builder.bitcast(cb, p8) for cb in cbuf]
        c32 = [builder.bitcast(cb, ir.IntType(32).as_pointer()) for cb in cbuf]
        a_base = builder.gep(builder.bitcast(q, p8), [builder.mul(r0, kbytes)])
        tile_bytes = const(i64, AMX_TOKENS * group_bytes)
        x_base = builder.gep(builder.bitcast(xa, p8), [builder.mul(builder.mul(tb, ng), tile_bytes)])
        if planes == 2:
            lobuf = cgutils.alloca_once(builder, ir.ArrayType(ir.IntType(32), AMX_ROWS * AMX_TOKENS))
            lobuf.align = 64
            lo8, lo32 = builder.bitcast(lobuf, p8), builder.bitcast(lobuf, ir.IntType(32).as_pointer())
            xlo_base = builder.gep(builder.bitcast(xa_lo, p8), [builder.mul(builder.mul(tb, ng), tile_bytes)])
            shift = const(V16I32, [7] * 16)  # ×LO_STEPS (128)
        t0 = builder.mul(tb, const(i64, AMX_TOKENS))
        srow = [builder.gep(s, [builder.mul(builder.add(r0, const(i64, i)), sl)]) for i in range(AMX_ROWS)]
        crow = [builder.gep(c, [builder.mul(builder.add(r0, const(i64, i)), sl)]) for i in range(AMX_ROWS)]
        ST = ir.LiteralStructType([V16F] * AMX_ROWS)
        init = ir.Constant(ST, [const(V16F, [0.0] * 16)] * AMX_ROWS)

        def issue(g, slot):  # group g's integer sums into tile ``slot``, stored to cbuf[slot]
            c_t, a_t, b_t = const(i8, slot), const(i8, 4 + 2 * (slot % 2)), const(i8, 5 + 2 * (slot % 2))
            c_lo, b_lo = const(i8, 1), const(i8, 7)  # planes 2: the second plane's sums and activations
            builder.call(zero, [c_t])
            if planes == 2:
                builder.call(zero, [c_lo])
            builder.call(load, [a_t, builder.gep(a_base, [builder.mul(g, const(i64, group_bytes))]), kbytes])
            builder.call(load, [b_t, builder.gep(x_base, [builder.mul(g, tile_bytes)]), const(i64, 4 * AMX_TOKENS)])
            if planes == 2:
                builder.call(load, [b_lo, builder.gep(xlo_base, [builder.mul(g, tile_bytes)]), const(i64, 4 * AMX_TOKENS)])
            builder.call(dot, [c_t, a_t, b_t])
            if planes == 2:  # the same weight tile times the second plane: both products in flight
                builder.call(dot, [c_lo, a_t, b_lo])
            builder.call(store, [c_t, cb8[slot], const(i64, 4 * AMX_TOKENS)])
            if planes == 2:
                builder.call(store, [c_lo, lo8, const(i64, 4 * AMX_TOKENS)])

        def post(g, par, accs):  # group g's sums (cbuf[par]) times the scales, into the accumulators
            go = builder.add(builder.mul(g, tp), t0)
            dx = vload(builder, xd, go, V16F, 4)
            bx = None if signed else vload(builder, xb, go, V16F, 4)
            for i in range(AMX_ROWS):
                sv = builder.load(builder.gep(srow[i], [g]))
                scale = builder.fmul(_splat(builder, sv), dx, flags=FAST)
                isum = vload(builder, c32[par], const(i64, AMX_TOKENS * i), V16I32, 64)
                if planes == 2:
                    lo = vload(builder, lo32, const(i64, AMX_TOKENS * i), V16I32, 64)
                    isum = builder.add(builder.shl(isum, shift), lo)
                a = builder.extract_value(accs, i)
                a = builder.fadd(a, builder.fmul(builder.sitofp(isum, V16F), scale, flags=FAST), flags=FAST)
                if not signed:
                    cv = builder.load(builder.gep(crow[i], [g]))
                    a = builder.fsub(a, builder.fmul(_splat(builder, cv), bx, flags=FAST), flags=FAST)
                accs = builder.insert_value(accs, a, i)
            return accs

        def body(p, accs):
            # AMX_AHEAD groups in flight: a group's tile is multiplied and stored AMX_AHEAD groups before
            # its floats read the stored sums
            for j in range(AMX_AHEAD + 1):
                g = builder.add(builder.mul(p, const(i64, AMX_AHEAD + 1)), const(i64, j))
                nxt = builder.add(g, const(i64, AMX_AHEAD))
                with builder.if_then(builder.icmp_signed("<", nxt, ng)):
                    issue(nxt, (j + AMX_AHEAD) % (AMX_AHEAD + 1))
                accs = post(g, j, accs)
            return accs

        for j in range(AMX_AHEAD):
            issue(const(i64, j), j)
        accs = ir_loop(builder, builder.sdiv(ng, const(i64, AMX_AHEAD + 1)), init, body)
        builder.call(declare(builder, "llvm.x86.tilerelease", void, []), [])
        cols = _transpose16(builder, [builder.extract_value(accs, i) for i in range(AMX_ROWS)])
        lanes = const(ir.VectorType(i64, 16), list(range(16)))
        rmask = builder.icmp_signed("<", lanes, _splat(builder, nrows))
        mstore = declare(builder, "llvm.masked.store.v16f32.p0", void,
                         [V16F, V16F.as_pointer(), ir.IntType(32), ir.VectorType(ir.IntType(1), 16)])
        for t in range(AMX_TOKENS):  # token t of the block: its row tile's 16 outputs, where t < T
            tok = builder.add(t0, const(i64, t))
            with builder.if_then(builder.icmp_signed("<", tok, T)):
                dst = builder.bitcast(builder.gep(y, [builder.add(builder.mul(tok, ldy), r0)]), V16F.as_pointer())
                builder.call(mstore, [cols[t], dst, const(ir.IntType(32), 4), rmask])
        return context.get_dummy_value()

    return codegen


def _splat(b, s):
    vt = ir.VectorType(s.type, 16)
    v = b.insert_element(ir.Constant(vt, ir.Undefined), s, const(ir.IntType(32), 0))
    return b.shuffle_vector(v, ir.Constant(vt, ir.Undefined), const(ir.VectorType(ir.IntType(32), 16), [0] * 16))


def _amx(group_bytes, signed):
    gen = _amx_codegen(group_bytes, signed)

    def typer(typingctx, cfg, q, s, c, xa, xd, xb, y, kbytes, sl, ng, tp, T, ldy, r0, tb, nrows):
        return types.void(cfg, q, s, c, xa, xd, xb, y, kbytes, sl, ng, tp, T, ldy, r0, tb, nrows), gen

    typer.__name__ = f"amx_tile_{group_bytes}{'s' if signed else 'u'}"
    return intrinsic(typer)


def _amx2(group_bytes, signed):
    gen = _amx_codegen(group_bytes, signed, planes=2)

    def typer(typingctx, cfg, q, s, c, xa, xa_lo, xd, xb, y, kbytes, sl, ng, tp, T, ldy, r0, tb, nrows):
        return types.void(cfg, q, s, c, xa, xa_lo, xd, xb, y, kbytes, sl, ng, tp, T, ldy, r0, tb, nrows), gen

    typer.__name__ = f"amx_tile2_{group_bytes}{'s' if signed else 'u'}"
    return intrinsic(typer)


_amx32u, _amx32s, _amx16s = _amx(32, False), _amx(32, True), _amx(16, True)
_amx2_32u, _amx2_32s, _amx2_16s = _amx2(32, False), _amx2(32, True), _amx2(16, True)


@njit(parallel=True, cache=True)
def amx_tiles(cfg, Q, S, C, XA, XD, XB, Y, G, signed, n, rows_p, kbytes, sl, ng, tp, y0):
    """Y[:T, y0 + r] for the rows r < n of the unpacked (Q, S, C) (flat; Q rows_p rows of kbytes
    bytes, S and C rows of sl scales), by 16 × 16 AMX tiles: groups of AMX_ROW_TILES row tiles in
    parallel, each group's row tiles meeting one token block after another."""
    ntiles = rows_p // AMX_ROWS
    nblocks = XA.size * 4 // (ng * AMX_TOKENS * G)
    T, ldy = Y.shape
    yflat = Y.reshape(-1)
    for gi in prange((ntiles + AMX_ROW_TILES - 1) // AMX_ROW_TILES):
        for tb in range(nblocks):
            for rt in range(gi * AMX_ROW_TILES, min(ntiles, gi * AMX_ROW_TILES + AMX_ROW_TILES)):
                r0 = rt * AMX_ROWS
                nr = min(AMX_ROWS, n - r0)
                if G == 16:
                    _amx16s(cfg, Q, S, C, XA, XD, XB, yflat[y0:], kbytes, sl, ng, tp, T, ldy, r0, tb, nr)
                elif signed:
                    _amx32s(cfg, Q, S, C, XA, XD, XB, yflat[y0:], kbytes, sl, ng, tp, T, ldy, r0, tb, nr)
                else:
                    _amx32u(cfg, Q, S, C, XA, XD, XB, yflat[y0:], kbytes, sl, ng, tp, T, ldy, r0, tb, nr)


@njit(parallel=True, cache=True)
def amx_tiles2(cfg, Q, S, C, XA, XA_lo, XD, XB, Y, G, signed, n, rows_p, kbytes, sl, ng, tp, y0):
    """``amx_tiles`` with the second activation plane XA_lo (``arrange_amx_lo``): its own compiled
    function, so the int8 arithmetic's cold start does not compile it."""
    ntiles = rows_p // AMX_ROWS
    nblocks = XA.size * 4 // (ng * AMX_TOKENS * G)
    T, ldy = Y.shape
    yflat = Y.reshape(-1)
    for gi in prange((ntiles + AMX_ROW_TILES - 1) // AMX_ROW_TILES):
        for tb in range(nblocks):
            for rt in range(gi * AMX_ROW_TILES, min(ntiles, gi * AMX_ROW_TILES + AMX_ROW_TILES)):
                r0 = rt * AMX_ROWS
                nr = min(AMX_ROWS, n - r0)
                if G == 16:
                    _amx2_16s(cfg, Q, S, C, XA, XA_lo, XD, XB, yflat[y0:], kbytes, sl, ng, tp, T, ldy, r0, tb, nr)
                elif signed:
                    _amx2_32s(cfg, Q, S, C, XA, XA_lo, XD, XB, yflat[y0:], kbytes, sl, ng, tp, T, ldy, r0, tb, nr)
                else:
                    _amx2_32u(cfg, Q, S, C, XA, XA_lo, XD, XB, yflat[y0:], kbytes, sl, ng, tp, T, ldy, r0, tb, nr)
