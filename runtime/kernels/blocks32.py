"""The 32-value block formats (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL), read in place: their
layouts, a block decoded to its quant values, and the float kernel (``mm_b32``: four rows of
blocks times float activations)."""

from __future__ import annotations

from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from aios.quant import block_size
from runtime.kernels.groups import group4, row_count, store_group
from runtime.kernels.ir_helpers import (
    F32,
    FAST,
    HALF,
    I8,
    I16,
    I32,
    ROWS,
    V32F,
    V32I8,
    accumulate,
    array_data,
    const,
    f16_at,
    hsum,
    ir_loop,
    prefetch_lines,
    splat,
    splat_lane,
    vload,
    zeros_struct,
)
from runtime.kernels.type_traits import TYPE_TRAITS, names

QK = block_size("Q8_0")  # elements per Q8_0 / Q4_0 block (gguf-py's table, like every block size)
assert block_size("Q4_0") == QK


# --- 32-value block formats, read in place: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL -------------
# A row is the file's bytes: nb interleaved ggml blocks, each an fp16 d (and Q4_1/Q5_1 an fp16
# minimum m) before its quants, so nothing is copied at load. A block decodes to one
# <32 x float> of quant values q; its contribution is d·Σ q·x (+ m·Σ x for the affine types).
# Layouts as ggml-common.h / gguf-py's gguf.quants:
#   block_q8_0 {half d; int8 qs[32]}                 value l = qs[l]
#   block_q4_0 {half d; uint8 qs[16]}                value l < 16: qs[l] & 15, else qs[l-16] >> 4; − 8
#   block_q4_1 {half d; half m; uint8 qs[16]}        as Q4_0 without the offset
#   block_q5_0 {half d; uint32 qh; uint8 qs[16]}     Q4_0's nibble | bit l of qh << 4; − 16
#   block_q5_1 {half d; half m; uint32 qh; uint8 qs[16]}  as Q5_0 without the offset
#   block_iq4_nl {half d; uint8 qs[16]}              kvalues_iq4nl[Q4_0's nibble]
# The types and their quants' facts: rows of runtime.kernels.type_traits (B32's order: mm_b32's
# kind)
B32 = names("b32")
B32_BYTES = {t: TYPE_TRAITS[t].block_bytes for t in B32}  # bytes per block (gguf-py's table)
assert all(block_size(t) == QK for t in B32) and QK == V32F.count  # one block, one <32 x float>
# where the quants start (a layout fact of this module) and whether a block has a minimum m
# (fp16 right after d)
B32_QS = {"q8_0": 2, "q4_0": 2, "q4_1": 4, "q5_0": 6, "q5_1": 8, "iq4_nl": 2}
B32_AFFINE = {t for t in B32 if TYPE_TRAITS[t].affine}
# subtracted from the stored unsigned quants
B32_OFFSET = {t: TYPE_TRAITS[t].offset for t in B32 if TYPE_TRAITS[t].offset}
B32_SIGNED = {t for t in B32 if TYPE_TRAITS[t].signed}  # quants stored as signed values
# the types whose int8 kernel sums as ggml's does, bit for bit (its vec_dot_*_q8_0 for one token
# and llamafile's tinyBLAS_Q0_AVX for a batch, on x86 alike): each block's signed Σ q_w·q_x in 8
# int32 lanes of 4 products (lane l: values 4l..4l+3), converted, fma'd with f32(d_w·d_x) into 8
# float lanes, one block after another, then hsum. IQ4_NL is not: ggml's one-token dot keeps
# two accumulators (even and odd blocks) where its batch keeps one.
# Q4_0 and Q5_0 can sum so too (their offset taken off in the integer lanes: set their rows'
# ``blockwise``), but that kernel took 1.15x (Q5_0) and 1.27x (Q4_0) the time of the quad kernel
# on the 2-core Xeon (2026-11-27), for top-1 agreement with llama.cpp on the real Gemma 3 270M
# of 0.9277 instead of 0.9233: decode speed at or above llama.cpp's is worth more, so they keep
# the quad kernel.
BLOCKWISE = names("b32", where=lambda t: t.blockwise)
assert B32_BYTES == {t: B32_QS[t] + (QK if t == "q8_0" else QK // 2) for t in B32}
# ggml's non-linear 4-bit value table (ggml-common.h kvalues_iq4nl; gguf-py's IQ4_NL.kvalues)
KVALUES_IQ4NL = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)


def nibbles(b, p, off):
    """<32 x i8>: the 16 bytes at p[off], low nibbles then high nibbles (values 0-15, 16-31)."""
    packed = vload(b, p, off, ir.VectorType(I8, 16), 1)
    lo = b.and_(packed, const(packed.type, [15] * 16))
    hi = b.lshr(packed, const(packed.type, [4] * 16))
    return b.shuffle_vector(lo, hi, const(ir.VectorType(I32, 32), list(range(32))))


def lookup16(b, n):
    """kvalues_iq4nl[n] for a <32 x i8> of nibbles: a select tree over the 16 constants, one
    level per bit (generic vector selects, which every SIMD target lowers)."""
    vals = [const(V32I8, [v] * 32) for v in KVALUES_IQ4NL]
    for bit in range(4):
        m = b.icmp_unsigned("!=", b.and_(n, const(V32I8, [1 << bit] * 32)), const(V32I8, [0] * 32))
        vals = [b.select(m, vals[2 * i + 1], vals[2 * i]) for i in range(len(vals) // 2)]
    return vals[0]


def _qh_bits(b, p, off):
    """<32 x i8>: bit l of the little-endian uint32 at p[off], shifted to bit 4 (Q5_0/Q5_1)."""
    qh = b.load(b.bitcast(b.gep(p, [off]), I32.as_pointer()), align=1)
    v = b.lshr(splat(b, qh, 32), const(ir.VectorType(I32, 32), list(range(32))))
    v = b.and_(v, const(ir.VectorType(I32, 32), [1] * 32))
    return b.shl(b.trunc(v, V32I8), const(V32I8, [4] * 32))


def b32_quants(b, fmt, p, base, offset=True):
    """The block's 32 quant values as <32 x i8> (before d and m). With ``offset=False`` Q4_0 and
    Q5_0 give their stored unsigned 0..15 / 0..31 (the value is that minus B32_OFFSET); the
    affine types' values are unsigned either way (0..15 / 0..31), Q8_0 and IQ4_NL's signed."""
    qs = b.add(base, const(base.type, B32_QS[fmt]))
    if fmt == "q8_0":
        return vload(b, p, qs, V32I8, 1)
    n = nibbles(b, p, qs)
    if fmt == "iq4_nl":
        return lookup16(b, n)
    if fmt in ("q5_0", "q5_1"):
        n = b.or_(n, _qh_bits(b, p, b.add(base, const(base.type, B32_QS[fmt] - 4))))
    if fmt in B32_AFFINE or not offset:
        return n
    return b.sub(n, const(V32I8, [B32_OFFSET[fmt]] * 32))


def b32_values(b, fmt, p, base):
    """The block's 32 quant values as <32 x float> (before d and m)."""
    q = b32_quants(b, fmt, p, base)
    return b.uitofp(q, V32F) if fmt in B32_AFFINE else b.sitofp(q, V32F)


def _dot4_b32_codegen(fmt):
    nbytes = B32_BYTES[fmt]
    affine = fmt in B32_AFFINE
    chunk_blocks = 16  # blocks per loop step: one prefetch run per row, the rest unrolled

    def codegen(context, builder, sig, args):
        # args: w0..w3, p0..p3 (uint8 rows of blocks), x, nb
        ws = [array_data(context, builder, sig.args[j], args[j]) for j in range(ROWS)]
        ps = [array_data(context, builder, sig.args[ROWS + j], args[ROWS + j]) for j in range(ROWS)]
        x = array_data(context, builder, sig.args[2 * ROWS], args[2 * ROWS])
        nb = args[2 * ROWS + 1]
        ity = nb.type

        def step(blk, accs, scale=None):
            # scale(j, k): row j's fp16 field k (0: d, 1: m) as <32 x float>; else loaded here
            base = builder.mul(blk, const(ity, nbytes))
            xv = vload(builder, x, builder.mul(blk, const(ity, QK)), V32F, 4)
            if scale is None:
                def scale(j, k):
                    return splat(builder, f16_at(builder, ws[j], builder.add(base, const(ity, 2 * k))), 32)
            for j in range(ROWS):
                t = builder.fmul(builder.fmul(b32_values(builder, fmt, ws[j], base), xv, flags=FAST), scale(j, 0),
                                 flags=FAST)
                if affine:
                    t = builder.fadd(t, builder.fmul(scale(j, 1), xv, flags=FAST), flags=FAST)
                accs = accumulate(builder, accs, j, t)
            return accs

        def chunk(c, accs):
            b0 = builder.mul(c, const(ity, chunk_blocks))
            for j in range(ROWS):
                prefetch_lines(builder, ps[j], builder.mul(b0, const(ity, nbytes)), (chunk_blocks * nbytes + 63) // 64)
            # the chunk's 16 fp16 scales of a row, gathered into one vector and converted by
            # one instruction (then one lane broadcast per block)
            v16h, v16f = ir.VectorType(I16, chunk_blocks), ir.VectorType(F32, chunk_blocks)
            sv = {}
            for j in range(ROWS):
                for k in range(2 if affine else 1):
                    v = ir.Constant(v16h, ir.Undefined)
                    for u in range(chunk_blocks):
                        off = builder.add(builder.mul(builder.add(b0, const(ity, u)), const(ity, nbytes)), const(ity, 2 * k))
                        h = builder.load(builder.bitcast(builder.gep(ws[j], [off]), I16.as_pointer()), align=1)
                        v = builder.insert_element(v, h, const(I32, u))
                    sv[j, k] = builder.fpext(builder.bitcast(v, ir.VectorType(HALF, chunk_blocks)), v16f)
            for u in range(chunk_blocks):
                accs = step(builder.add(b0, const(ity, u)), accs, lambda j, k, u=u: splat_lane(builder, sv[j, k], u, 32))
            return accs

        nchunk = builder.sdiv(nb, const(ity, chunk_blocks))
        accs = ir_loop(builder, nchunk, zeros_struct(ROWS), chunk)
        accs = ir_loop(builder, nb, accs, step, start=builder.mul(nchunk, const(ity, chunk_blocks)))
        return context.make_tuple(builder, sig.return_type,
                                  [hsum(builder, builder.extract_value(accs, j)) for j in range(ROWS)])

    return codegen


def _dot4_b32(fmt):
    gen = _dot4_b32_codegen(fmt)

    def typer(typingctx, w0, w1, w2, w3, p0, p1, p2, p3, x, nb):
        return types.UniTuple(types.float32, ROWS)(w0, w1, w2, w3, p0, p1, p2, p3, x, nb), gen

    typer.__name__ = f"dot4_{fmt}"
    return intrinsic(typer)


# four rows of 32-value blocks (the file's bytes) · x over nb blocks; rows p0..p3 prefetched
dot4_q8_0, dot4_q4_0, dot4_q4_1 = _dot4_b32("q8_0"), _dot4_b32("q4_0"), _dot4_b32("q4_1")
dot4_q5_0, dot4_q5_1, dot4_iq4_nl = _dot4_b32("q5_0"), _dot4_b32("q5_1"), _dot4_b32("iq4_nl")


# --- block formats: W is uint8 (n, bytes per row), each row the file's blocks as stored ------------
B32_KIND = {fmt: i for i, fmt in enumerate(B32)}  # the run-time ``kind`` of mm_b32


@njit(parallel=True, fastmath=True, cache=True)
def mm_b32(W, X, rows, Y, kind):  # W (n, k/32 · block bytes) uint8
    T, k = X.shape
    nb = k // QK
    n = row_count(rows, W)
    for g in prange((n + 3) // 4):
        i0, i1, i2, i3 = group4(rows, n, g)
        n0, n1, n2, n3 = group4(rows, n, g + 1)
        for t in range(T):
            if kind == 0:
                y = dot4_q8_0(W[i0], W[i1], W[i2], W[i3], W[n0], W[n1], W[n2], W[n3], X[t], nb)
            elif kind == 1:
                y = dot4_q4_0(W[i0], W[i1], W[i2], W[i3], W[n0], W[n1], W[n2], W[n3], X[t], nb)
            elif kind == 2:
                y = dot4_q4_1(W[i0], W[i1], W[i2], W[i3], W[n0], W[n1], W[n2], W[n3], X[t], nb)
            elif kind == 3:
                y = dot4_q5_0(W[i0], W[i1], W[i2], W[i3], W[n0], W[n1], W[n2], W[n3], X[t], nb)
            elif kind == 4:
                y = dot4_q5_1(W[i0], W[i1], W[i2], W[i3], W[n0], W[n1], W[n2], W[n3], X[t], nb)
            else:
                y = dot4_iq4_nl(W[i0], W[i1], W[i2], W[i3], W[n0], W[n1], W[n2], W[n3], X[t], nb)
            store_group(Y, t, rows, n, 4 * g, 1, y)
