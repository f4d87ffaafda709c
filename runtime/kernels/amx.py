"""Many tokens times a block-quantized matrix on Intel AMX: the int8 tile instructions (TDPBUSD,
TDPBSSD) for the integer sums, AVX-512 for the scales. The same types, activation blocks and
integer sums as runtime.kernels.kq_tiles (Q4_K, Q5_K, Q6_K times Q8_K; Q8_0, Q4_0, Q4_1, Q5_0,
Q5_1 times Q8_0); what differs is the instruction that forms them.

One TDPBUSD multiplies a tile of 16 weight rows × G bytes (G the values that share one scale: 32,
16 for Q6_K) by G/4 rows × 64 bytes of activations (16 tokens, four values per token and row of
the tile) into 16 × 16 int32 sums: 8,192 multiply-adds in one instruction, where vpdpbusd does
64. Each group's sums then meet the scales in float, as in the register tiles:

    y[r, t] = Σ_g ws[r, g]·d_x[t, g]·Σ q_w·q_x − c[r, g]·d_x[t, g]·bsum_x[t, g]

(16 vector loads, conversions and multiply-adds per group and tile: the float part now costs more
than the integer part; docs/benchmarks.md, "AMX tiles", has the variants that did not help). The signed types (Q6_K, Q8_0, Q4_0, Q5_0) use TDPBSSD on their signed
quants and signed activations, so no +128 and no start term; the affine types (Q4_K, Q5_K, Q4_1,
Q5_1) TDPBUSD on unsigned quants, with the minimum term c in float.

The weights are unpacked per chunk of rows in the values' own order (kq_tiles' unpackers with
``natural``), a row's G values of one group consecutive, so a tile is 16 rows at the row stride.
The activations are arranged per 16 tokens and group as the B tile wants them: word j (values
4j..4j+3) of the 16 tokens side by side. The 16 × 16 float sums are transposed in registers and
stored as 16 tokens' rows of Y.

Linux lets a process use the AMX registers only after it asks (arch_prctl ARCH_REQ_XCOMP_PERM);
``amx_available`` asks once and says whether the tiles run here: the CPU numba compiles for has
AMX-INT8, the kernel granted it, and AIOS_AMX is not "0" (set it to compare with the register
tiles). Where not, kq_tiles runs.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
import weakref

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from aios.quant import QK_K
from runtime.kernels.blocks32 import QK
from runtime.kernels.ir_helpers import (
    FAST,
    V16F,
    V16I32,
    array_data,
    compile_features,
    const,
    declare,
    ir_loop,
    vload,
)
from runtime.kernels.kq_tiles import (
    B32_TILES,
    LANE_VALUES,
    RT,
    SIGNED,
    TILE_BYTES,
    TILE_KIND,
    TILE_TYPES,
    byte_sum4,
    reused_buffer,
    tiled,
    units,
    unpack_b32_rows,
    unpack_rows,
    word_at_i8,
)
from runtime.kernels.quantize import LO_STEPS, residual_plane
from runtime.kernels.kq_row_tiles import KQ_ROW_TYPES, group_kq_rows, kq_rows_bytes
from runtime.kernels.row_tiles import ROW_TYPES, grouped_shapes, to_rows

AMX_TYPES = TILE_TYPES
AMX_ROWS = 16  # weight rows per tile (the A tile's rows, the C tile's rows)
AMX_TOKENS = 16  # tokens per tile (the B tile's 64 bytes, the C tile's 16 int32 columns)
# groups whose tiles are multiplied and stored ahead of the group whose floats run (groups per row:
# a multiple of AMX_AHEAD + 1). Measured on the Xeon (Q4_K 4096 × 4096 × 512 tokens, medians of 15
# alternated with the register tiles, three runs each): 0 ahead 1.35-1.63× the register tiles,
# 1 ahead 1.23-1.50×, 3 ahead 1.11-1.25×; the VM's noise hides any gain, so none ahead.
AMX_AHEAD = 0
AMX_ROW_TILES = 4  # row tiles one thread runs per token block (its activations stay in L1/L2 for them)

_STATE: dict = {"ok": None}
_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA = 158, 0x1023, 18  # x86-64 Linux


def amx_available() -> bool:
    """Whether the AMX tiles run here (asked of the kernel once per process)."""
    if _STATE["ok"] is None:
        _STATE["ok"] = _request()
    return _STATE["ok"]


def _request() -> bool:
    if os.environ.get("AIOS_AMX", "1") == "0":
        return False
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return False
    from numba.core import config

    if config.CPU_NAME not in (None, "host") and config.CPU_FEATURES is None:
        return False  # compiling for a named CPU whose features are not listed: no AMX assumed
    if not {"amx-tile", "amx-int8", "avx512f"} <= compile_features():
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.syscall(_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA) == 0
    except (OSError, AttributeError):
        return False


def amx_runs(fmt: str, k: int) -> bool:
    """Whether a matrix of ``fmt`` rows of k values runs on the AMX tiles here: a tiled type whose
    groups per row are a multiple of AMX_AHEAD + 1 (with none ahead, any count), on a CPU and
    kernel that allow AMX."""
    return fmt in AMX_TYPES and (k // LANE_VALUES[fmt]) % (AMX_AHEAD + 1) == 0 and amx_available()


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


# --- the activations, as the B tile loads them -----------------------------------------------------
@njit(cache=True, inline="always")
def _group_words(row, XA, tb, g, G, t16, count):
    """Group g of one token's int8 ``row`` into XA[tb, g, :, t16] (word j: values 4j..4j+3);
    with ``count`` the sum of its values (else 0)."""
    total = np.int32(0)
    for j in range(G // 4):
        w = word_at_i8(row, g * G + 4 * j)
        XA[tb, g, j, t16] = w
        if count:
            total += byte_sum4(w)
    return total


@njit(cache=True, inline="always")
def _pad_token(XA, tb, t16, ng, G):
    """A token slot past T: zero words (its sums come out 0 and are never stored)."""
    for g in range(ng):
        for j in range(G // 4):
            XA[tb, g, j, t16] = 0


@njit(parallel=True, cache=True)
def arrange_amx(xq, xd, xb, G, kq, XA, XD, XB):
    """The activations' int8 blocks (xq (T, k) int8; Q8_K: ``kq``, xd (T, k/256), xb (T, k/16)
    group sums; Q8_0: xd (T, k/32)) for the tiles: XA (T/16, groups, G/4, 16) uint32, word j of
    group g for the block's 16 tokens side by side; XD (groups, T) each group's d_x; XB
    (groups, T) d_x·Σq_x over the group (the affine types' minimum term). T padded to 16."""
    T, k = xq.shape
    ng = k // G
    for tb in prange(XA.shape[0]):
        for t16 in range(AMX_TOKENS):
            t = tb * AMX_TOKENS + t16
            if t >= T:
                _pad_token(XA, tb, t16, ng, G)
                for g in range(ng):
                    XD[g, t] = 0.0
                    XB[g, t] = 0.0
                continue
            row = xq[t]
            for g in range(ng):
                total = _group_words(row, XA, tb, g, G, t16, not kq)
                if kq:
                    dx = xd[t, (g * G) // QK_K]
                    for h in range(G // 16):
                        total += np.int32(xb[t, (g * G) // 16 + h])
                else:
                    dx = xd[t, g]
                XD[g, t] = dx
                XB[g, t] = dx * np.float32(total)


@njit(parallel=True, cache=True)
def arrange_amx_lo(xq_lo, G, XA_lo, XD, XB):
    """The second plane for the tiles, after ``arrange_amx`` arranged the first into (XA, XD, XB):
    XA_lo its words as XA holds the first's; XD (each group's d) becomes d/128, the step of the
    16-bit quants 128·q + q_lo, and XB (d·Σq) d·Σq + (d/128)·Σq_lo, their minimum term's sum."""
    T, k = xq_lo.shape
    ng = k // G
    for tb in prange(XA_lo.shape[0]):
        for t16 in range(AMX_TOKENS):
            t = tb * AMX_TOKENS + t16
            if t >= T:
                _pad_token(XA_lo, tb, t16, ng, G)
                continue
            row = xq_lo[t]
            for g in range(ng):
                total = _group_words(row, XA_lo, tb, g, G, t16, True)
                d = XD[g, t] / np.float32(LO_STEPS)
                XD[g, t] = d
                XB[g, t] += d * np.float32(total)


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


# --- a whole matrix ---------------------------------------------------------------------------
def arranged_amx(fmt: str, xq: np.ndarray, xd: np.ndarray, xb: np.ndarray | None = None):
    """The activations' int8 blocks (Q8_K for the K-quants: xq, xd, xb; Q8_0 for the 32-value
    types: xq, xd) as the tiles load them: (XA, XD, XB, T)."""
    T, k = xq.shape
    G = LANE_VALUES[fmt]
    ng = k // G
    nb = -(-T // AMX_TOKENS)
    XA = np.empty((nb, ng, G // 4, AMX_TOKENS), np.uint32)
    XD = np.empty((ng, nb * AMX_TOKENS), np.float32)
    XB = np.empty((ng, nb * AMX_TOKENS), np.float32)
    kq = fmt not in B32_TILES
    arrange_amx(xq, xd, xb if kq else xd, G, kq, XA, XD, XB)
    return XA, XD, XB, T


def arranged_amx2(fmt: str, X: np.ndarray, xq: np.ndarray, xd: np.ndarray, xb: np.ndarray | None = None):
    """``arranged_amx`` of X's int8 blocks (xq, xd[, xb]) plus their second plane
    (``residual_plane``): (XA, XD, XB, T, XA_lo), which ``mm_amx`` multiplies as 16-bit
    activations."""
    XA, XD, XB, T = arranged_amx(fmt, xq, xd, xb)
    lo = residual_plane(np.ascontiguousarray(X, np.float32), xq, xd, xq.shape[1] // xd.shape[1])
    XA_lo = np.empty_like(XA)
    arrange_amx_lo(lo, LANE_VALUES[fmt], XA_lo, XD, XB)
    return XA, XD, XB, T, XA_lo


# --- unpacked weights kept across passes -----------------------------------------------------
# A caller that runs the same matrices many times (R1's calibration passes, a perplexity run)
# keeps their unpacked form for the next pass inside ``kept_unpacked()``, up to a budget of bytes
# (llama.cpp's AMX buffers repack the weights once at load, for the file's whole life); a prompt
# or a single pass unpacks per matmul and keeps nothing. 384 MB holds the real Gemma 3 270M's
# whole unpacked form (its output head in the row tiles' layout, 210 MB, with its layers): int16
# perplexity windows 5-10 % faster than with 256 MB (head unpacked per pass; AMD EPYC, 2026-11-28).
KEEP_BYTES = int(os.environ.get("AIOS_KEEP_UNPACKED_MB", "384")) << 20
_KEPT: dict = {"on": False, "bytes": 0, "mats": {}}


@contextlib.contextmanager
def kept_unpacked(budget: int | None = None, matrices=None):
    """Within: each matrix's unpacked rows are kept after its first matmul (until ``budget``
    bytes, KEEP_BYTES by default, are held) and reused; on exit they are freed. The AMX tiles
    keep them in the values' order, the register tiles (runtime.kernels.kq_tiles, CPUs without
    AMX) in theirs (``kept_layout``).

    ``matrices``: the (fmt, rows, values per row) of every matrix the passes will multiply, in
    any order. Passes go through them in a cycle, so kept rows save unpacking in proportion to
    the share of them that fits: when less than half of their unpacked bytes fit the budget,
    nothing is kept (a 32-layer Falcon-7B-dims Q4_K_M: 256 MB held for 2.5 % of its ~10 GB
    unpacked saved ~2.5 % of the unpacking and put peak RSS at 1.23x the file)."""
    budget = KEEP_BYTES if budget is None else budget
    need = sum(unpacked_bytes(f, n, k, kept_layout(f, k)) for f, n, k in matrices or () if amx_runs(f, k) or tiled(f))
    _KEPT.update(on=2 * budget >= need, bytes=0, mats={}, budget=budget)
    try:
        yield
    finally:
        _KEPT.update(on=False, bytes=0, mats={})


def kept_layout(fmt: str, k: int) -> str:
    """How ``fmt``'s many-token matmuls keep its rows: "values" (their order: the AMX tiles),
    "rows" (16 rows in a vector's lanes: runtime.kernels.row_tiles, kq_row_tiles) or "lanes" (the register
    tiles' lane layout, runtime.kernels.kq_tiles)."""
    return "values" if amx_runs(fmt, k) else "rows" if fmt in ROW_TYPES + KQ_ROW_TYPES else "lanes"


def unpacked_bytes(fmt: str, n: int, k: int, layout: str = "values") -> int:
    """What keeping one matrix of ``fmt`` (n rows of k values) unpacked holds in ``layout``
    (``kept_layout``): quants, scales and minimums, rows padded to the AMX tiles' 16 ("values"),
    to groups of 16 ("rows") or to the register tiles' 4 ("lanes")."""
    if layout == "lanes":
        mp = -(-n // RT) * RT + RT
        return mp * 4 * units(fmt, k) * 16 * (LANE_VALUES[fmt] // 4 + 2)
    if layout == "rows" and fmt in KQ_ROW_TYPES:
        return kq_rows_bytes(fmt, n, k)
    if layout == "rows":
        q, s = grouped_shapes(n, k // QK)
        return 4 * q[0] * (q[1] + 2 * s[1])
    mp = -(-n // AMX_ROWS) * AMX_ROWS
    return mp * (4 * (k // 4 + 16) + 8 * units(fmt, k) * 16)


def _root(a: np.ndarray):  # the object that owns an array's memory (the file's mmap, usually)
    while isinstance(a, np.ndarray) and a.base is not None:
        a = a.base
    return a


def kept_rows(fmt: str, W: np.ndarray, k: int, layout: str = "values"):
    """Inside ``kept_unpacked``: the matrix's kept (Q, S, C, rows padded), unpacked now if the
    budget allows; else (and outside) None. ``layout`` (``kept_layout``): "values" the values'
    order (the AMX tiles'), "lanes" the register tiles' lane layout (``kq_tiles.mm_tiles``'
    ``kept``), "rows" the row tiles' groups ((QT, ST, ZT, groups): ``row_tiles.mm_rows``)."""
    if not _KEPT["on"]:
        return None
    key = (fmt, layout, W.__array_interface__["data"][0], W.shape, W.strides)
    hit = _KEPT["mats"].get(key)
    if hit is not None and hit[0]() is not None:  # the memory's owner alive: the same bytes
        return hit[1]
    n = W.shape[0]
    nbytes = unpacked_bytes(fmt, n, k, layout)
    if _KEPT["bytes"] + nbytes > _KEPT["budget"]:
        return None
    try:
        ref = weakref.ref(_root(W))
    except TypeError:  # an owner without weak references: not kept
        return None
    if layout == "rows" and fmt in KQ_ROW_TYPES:  # (QT, SC, MN, D, DM): kq_row_tiles.mm_kq_rows' kept
        _KEPT["bytes"] += nbytes
        _KEPT["mats"][key] = (ref, group_kq_rows(fmt, W))
        return _KEPT["mats"][key][1]
    nu = units(fmt, k)
    lanes = layout == "lanes"
    if lanes:  # rows padded to whole tiles of RT, plus the RT the last tile may read past them
        mp = -(-n // RT) * RT
        shape = (mp + RT, nu * 16 * (LANE_VALUES[fmt] // 4))
    else:
        mp = -(-n // AMX_ROWS) * AMX_ROWS
        shape = (mp, k // 4 + 16)
    Q = np.zeros(shape, np.uint32)
    S, C = np.zeros((shape[0], nu * 16), np.float32), np.zeros((shape[0], nu * 16), np.float32)
    unpack = unpack_b32_rows if fmt in B32_TILES else unpack_rows
    unpack(W, TILE_KIND[fmt], TILE_BYTES[fmt], nu, Q[:n], S[:n], C[:n], C[:n].view(np.int32), not lanes)
    kept = (Q, S, C, mp)
    if layout == "rows":  # the values' order moved into groups of 16 rows; the first form freed
        shape_q, shape_s = grouped_shapes(n, k // QK)
        kept = (np.empty(shape_q, np.uint32), np.empty(shape_s, np.float32), np.empty(shape_s, np.int32), shape_q[0])
        to_rows(Q, S, C.view(np.int32), k // QK, n, *kept[:3])
    _KEPT["bytes"] += nbytes
    _KEPT["mats"][key] = (ref, kept)
    return kept


def mm_amx(fmt: str, W: np.ndarray, xs, Y: np.ndarray, chunk_values: int) -> None:
    """Y (T, n) = the int8 products of every row of W (``fmt`` in AMX_TYPES, the file's bytes)
    with the tokens ``xs`` (``arranged_amx``), the rows unpacked in chunks of at most
    ``chunk_values`` values. Only where ``amx_available()`` (which asks Linux for the registers)."""
    if not amx_available():
        raise RuntimeError("AMX tiles are not available on this CPU or kernel")
    if not Y.flags.c_contiguous:  # the tiles store whole rows of 16 outputs into a dense Y
        out = np.empty(Y.shape, np.float32)
        mm_amx(fmt, W, xs, out, chunk_values)
        Y[...] = out
        return
    XA, XD, XB = xs[:3]
    lo = xs[4] if len(xs) > 4 else None  # the second plane (``arranged_amx2``)
    n = W.shape[0]
    b32 = fmt in B32_TILES
    k = W.shape[1] // TILE_BYTES[fmt] * (QK if b32 else QK_K)
    G = LANE_VALUES[fmt]
    nu = units(fmt, k)
    sl = nu * 16
    cfg = amx_tile_config(G)
    kept = kept_rows(fmt, W, k)
    if kept is not None:
        Q, S, C, mp = kept
        _tiles(cfg, Q, S, C, XA, lo, XD, XB, Y, G, fmt in SIGNED, n, mp, 4 * Q.shape[1], sl, k // G, 0)
        return
    step = max(AMX_ROWS, min(n, chunk_values // k) // AMX_ROWS * AMX_ROWS)
    rows = step + AMX_ROWS
    # a row's bytes plus one line: at a stride of 4,096 bytes the 16 rows of a tile would all
    # fall in one L1 set (12 ways) and evict each other
    qw = k // 4 + 16
    Q = reused_buffer("amx_q", rows * qw, np.uint32).reshape(rows, qw)
    S = reused_buffer("amx_s", rows * sl, np.float32).reshape(rows, sl)
    C = reused_buffer("amx_c", rows * sl, np.float32).reshape(rows, sl)
    unpack = unpack_b32_rows if b32 else unpack_rows
    for r0 in range(0, n, step):
        m = min(n, r0 + step) - r0
        unpack(W[r0:r0 + m], TILE_KIND[fmt], TILE_BYTES[fmt], nu, Q[:m], S[:m], C[:m], C[:m].view(np.int32), True)
        mp = -(-m // AMX_ROWS) * AMX_ROWS
        for a in (Q, S, C):
            a[m:mp] = 0
        _tiles(cfg, Q, S, C, XA, lo, XD, XB, Y, G, fmt in SIGNED, m, mp, 4 * qw, sl, k // G, r0)


def _tiles(cfg, Q, S, C, XA, lo, XD, XB, Y, G, signed, n, mp, kbytes, sl, ng, y0) -> None:
    """``amx_tiles`` (one plane) or ``amx_tiles2`` (``lo``, the second plane's words) on flat views."""
    flat = [a.reshape(-1) for a in (Q, S, C, XA)]
    if lo is None:
        amx_tiles(cfg, *flat, XD.reshape(-1), XB.reshape(-1), Y, G, signed, n, mp, kbytes, sl, ng, XD.shape[1], y0)
    else:
        amx_tiles2(cfg, *flat, lo.reshape(-1), XD.reshape(-1), XB.reshape(-1), Y, G, signed, n, mp, kbytes, sl, ng,
                   XD.shape[1], y0)
