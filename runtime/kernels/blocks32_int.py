"""The 32-value blocks times int8 activations ("int8" arithmetic): the integer block dot
products (two blocks per step on every CPU, four with AVX-512 VNNI) and their kernel
``mm_b32_int8`` (the activations quantized by runtime.kernels.quantize). How the blocks' bytes,
scales and activations reach the vectors is runtime.kernels.blocks32_int_operands."""

from __future__ import annotations

from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from runtime.kernels.blocks32 import (
    B32_AFFINE,
    B32_BYTES,
    B32_OFFSET,
    B32_SIGNED,
    BLOCKWISE,
    QK,
    b32_quants,
)
from runtime.kernels.blocks32_int_operands import (  # noqa: F401  (this module's API)
    PAIR_ORDER,
    QUAD_INSERT,
    STRIDED_WORDS_MAX,
    lookup16_pshufb,
    pair_quants,
    quad_quants,
    quad_x,
    strided_words,
)
from runtime.kernels.groups import AHEAD, group4, row_count, store_group
from runtime.kernels.ir_helpers import (
    F32,
    FAST,
    HALF,
    I16,
    I32,
    ROWS,
    V8F,
    V16F,
    V16I32,
    V32I8,
    V64I8,
    array_data,
    concat_vec,
    const,
    declare,
    f16_at,
    hsum,
    idot_u8s8,
    int_dot_features,
    ir_loop,
    prefetch_lines,
    splat,
    vload,
    zeros_f32,
)
from runtime.kernels.type_traits import names

# --- the same blocks times 8-bit activations: integer block dot products ("int8" arithmetic) ----
# llama.cpp's scheme: each activation row is quantized once per matmul to int8 blocks of 32 with
# one fp16 scale d_x per block (ggml's quantize_row_q8_0; ``quantize_activations``), so a block's
# contribution is d_w·d_x·Σ q_w·q_x with Σ q_w·q_x exact in int32. The integer dot multiplies
# unsigned by signed bytes (the shape of x86's vpdpbusd / pmaddubsw): Q8_0 and IQ4_NL as
# (q_w+128)·q_x − 128·q_x with VNNI, |q_w| · (sign(q_w)·q_x) with pmaddubsw, which saturates (q_x
# is never −128); Q4_0 / Q5_0 with VNNI as their stored unsigned n = q_w + offset (8, 16) times
# q_x less offset·q_x in the integer lanes, with pmaddubsw by the sign trick on n − offset; the
# affine types (Q4_1/Q5_1) as n · q_x with the minimum added once per block as m_w·s_x,
# s_x = d_x·Σ q_x (ggml's Q8_1 sum). Two blocks go through one 64-byte integer dot, giving
# <16 x i32> (each lane four products of one block) and one int → float conversion. BLOCKWISE
# types (Q8_0) then sum as ggml: per block one fma by d_w·d_x into 8 float lanes,
# block after block (AVX-512: two rows' 8 lanes in one zmm); the others multiply the 16 lanes
# by the pair's d_w·d_x and add (AVX-512: four blocks per step, ``quad_quants``).


INT_DOT_NAMES = {"avx512vnni": "AVX-512 VNNI vpdpbusd", "avxvnni": "AVX-VNNI vpdpbusd",
                 "avx2": "AVX2 pmaddubsw", "generic": "portable integer IR"}


def _dot4_b32_int_codegen(fmt, blockwise=None):
    nbytes = B32_BYTES[fmt]
    affine = fmt in B32_AFFINE
    # the Q8_0 partners as ggml sums them (BLOCKWISE): each block's signed integer dot in 8 lanes,
    # fma'd block after block; the affine types: the minimum a per-block float term m_w·s_x
    blockwise = fmt in BLOCKWISE if blockwise is None else blockwise
    signed = fmt in B32_SIGNED
    # Q4_0 / Q5_0: the stored n is the value + offset, taken off in the integer lanes (BLOCKWISE)
    # or as a per-block float term −offset·d_w·s_x (otherwise)
    offset = B32_OFFSET.get(fmt, 0) if blockwise else 0
    shifted = affine or (fmt in B32_OFFSET and not blockwise)  # a per-block term m_w·s_x or −offset·d_w·s_x
    chunk_blocks = 16  # as _dot4_b32_codegen: 16 blocks' scales converted at once
    nacc = 2 * ROWS if shifted else ROWS  # ROWS × Σ d_w·d_x·(int sums), then ROWS × the shift terms

    def codegen(context, builder, sig, args):
        # args: w0..w3, p0..p3 (uint8 rows of blocks), xq (int8, nb·32), xd (d_x per block),
        # xs (s_x per block; read by the shifted types only), nb
        how = int_dot_features()
        ws = [array_data(context, builder, sig.args[j], args[j]) for j in range(ROWS)]
        ps = [array_data(context, builder, sig.args[ROWS + j], args[ROWS + j]) for j in range(ROWS)]
        xq, xd, xs = (array_data(context, builder, sig.args[2 * ROWS + u], args[2 * ROWS + u]) for u in range(3))
        nb = args[2 * ROWS + 3]
        ity = nb.type

        def operands(w, x):  # (unsigned, signed) bytes whose products are q_w·q_x
            if offset:  # the stored unsigned n to the signed value n − offset
                w = builder.sub(w, const(w.type, [offset] * w.type.count))
            elif not signed:
                return w, x
            neg = builder.icmp_signed("<", w, const(w.type, [0] * w.type.count))
            zero = const(w.type, [0] * w.type.count)
            return builder.select(neg, builder.sub(zero, w), w), builder.select(neg, builder.sub(zero, x), x)

        def add_to(accs, j, v):
            return builder.insert_value(accs, builder.fadd(builder.extract_value(accs, j), v, flags=FAST), j)

        def shift_w(j, base):  # the field multiplying s_x: m_w (affine) or −offset·d_w
            if affine:
                return f16_at(builder, ws[j], builder.add(base, const(ity, 2)))
            return builder.fmul(f16_at(builder, ws[j], base), const(F32, -float(B32_OFFSET[fmt])), flags=FAST)

        # with VNNI (vpdpbusd: unsigned · signed bytes, no saturation), the signed weights as
        # unsigned n = q_w + bias (Q8_0 / IQ4_NL q_w xor 0x80, Q4_0 / Q5_0 their stored n) and
        # each lane started from −bias·Σ₄q_x: Σ₄ n·q_x − bias·Σ₄q_x = Σ₄ q_w·q_x exactly
        bias = 128 if signed else offset
        biased = bias and how in ("avx512vnni", "avxvnni")
        m128 = const(V64I8, [-128] * 64)
        mbias = const(V64I8, [bias - 256 if bias > 127 else bias] * 64)

        def unsigned_w(w):
            return builder.xor(w, m128) if signed else w

        # AVX-512: two rows' 8-lane accumulators side by side in one <16 x float> (rows 2k, 2k+1:
        # accs[k]), so a pair of blocks costs two rows one 16-lane fma per block, after one
        # 256-bit shuffle that puts the two rows' lanes of the block side by side
        packed = blockwise and how == "avx512vnni"
        natural = blockwise  # quants and x in value order: a pair's int lanes 0-7 block a's, 8-15 b's
        units = ((0, 1), (2, 3))  # where block a's / b's int lanes 0-3 and 4-7 sit, in 4-lane units

        def get8(accs, j):  # row j's 8 accumulator lanes
            if not packed:
                return builder.extract_value(accs, j)
            v = builder.extract_value(accs, j // 2)
            return builder.shuffle_vector(v, v, const(ir.VectorType(I32, 8), list(range(8 * (j % 2), 8 * (j % 2) + 8))))

        def set8(accs, j, a8):
            if not packed:
                return builder.insert_value(accs, a8, j)
            v = builder.extract_value(accs, j // 2)
            w16 = builder.shuffle_vector(a8, a8, const(V16I32, list(range(8)) * 2))
            idx = [16 + i if (i // 8) == j % 2 else i for i in range(16)]
            return builder.insert_value(accs, builder.shuffle_vector(v, w16, const(V16I32, idx)), j // 2)

        def pair_x(b0, u):
            # x for blocks b0+u, b0+u+1 of the chunk, in pair_quants' order (permuted once for
            # the four rows), and for signed weights with VNNI (no pmaddubsw saturation)
            # −128·Σ₄q_x: each row's vpdpbusd starts from it and sums Σ₄(q_w+128)·q_x, one
            # vpdpbusd and one xor per row. (Biasing x instead needs −128·Σ₄q_w per row: two
            # vpdpbusd, two zeroed accumulators and a subtraction: slower.)
            blk = builder.add(b0, const(ity, u))
            x = vload(builder, xq, builder.mul(blk, const(ity, QK)), V64I8, 1)
            if fmt != "q8_0" and not natural:
                x = builder.shuffle_vector(x, x, const(ir.VectorType(I32, 64), PAIR_ORDER))
            corr = builder.sub(const(V16I32, [0] * 16), idot_u8s8(builder, mbias, x, how)) if biased else None
            return x, corr

        def pair(b0, u, j, x, corr, accs, sv):
            # row j's blocks b0+u, b0+u+1; sv[j]: the chunk's d_w·d_x of row j
            blk = builder.add(b0, const(ity, u))
            lanes = [u] * 8 + [u + 1] * 8 if blockwise else ([u] * 4 + [u + 1] * 4) * 2
            w = pair_quants(builder, fmt, ws[j], builder.mul(blk, const(ity, nbytes)), how, natural=natural)
            if biased:
                isum = idot_u8s8(builder, unsigned_w(w), x, how, acc=corr)
            else:
                isum = idot_u8s8(builder, *operands(w, x), how)
            sc = builder.shuffle_vector(sv[j], sv[j], const(V16I32, lanes))
            if blockwise:  # ggml's order: block u, then u+1, fused into the same 8 lanes
                return fma8_blocks(accs, j, builder.sitofp(isum, V16F), sc, 2)
            return add_to(accs, j, builder.fmul(builder.sitofp(isum, V16F), sc, flags=FAST))

        def pair_isum(b0, u, j, x, corr):  # row j's <16 x i32> for blocks b0+u, b0+u+1
            blk = builder.add(b0, const(ity, u))
            w = pair_quants(builder, fmt, ws[j], builder.mul(blk, const(ity, nbytes)), how, natural=natural)
            return idot_u8s8(builder, unsigned_w(w), x, how, acc=corr)

        def pair2(b0, u, k, x, corr, accs, sv):
            # rows 2k, 2k+1, blocks b0+u, b0+u+1 (packed): per block the two rows' int lanes side by
            # side (one vshuff32x4), converted, one fma by [d_w·d_x of row 2k ×8, of row 2k+1 ×8]
            fma = declare(builder, "llvm.fma.v16f32", V16F, [V16F] * 3)
            p0, p1 = (builder.sitofp(pair_isum(b0, u, 2 * k + r, x, corr), V16F) for r in (0, 1))
            a = builder.extract_value(accs, k)
            for blk in (0, 1):
                lo, hi = units[blk]
                idx = [4 * lo + i for i in range(4)] + [4 * hi + i for i in range(4)]
                v = builder.shuffle_vector(p0, p1, const(V16I32, idx + [16 + i for i in idx]))
                sc = builder.shuffle_vector(sv[2 * k], sv[2 * k + 1], const(V16I32, [u + blk] * 8 + [16 + u + blk] * 8))
                a = builder.call(fma, [sc, v, a])
            return builder.insert_value(accs, a, k)

        def fma8_blocks(accs, j, p, sc, nblocks):
            # Q8_0 as ggml sums it (vec_dot_q8_0_q8_0 and tinyBLAS alike): per block, 8 lanes of
            # 4-product integer sums, acc = fma(d_w·d_x, lanes, acc) block after block, one 8-lane
            # accumulator (Q8_0's accumulators are <8 x float>), reduced by hsum's tree as
            # hsum_float_8 does. Pairs summed 16 lanes wide gave another rounding.
            mod = builder.module
            fma = mod.globals.get("llvm.fma.v8f32") or ir.Function(mod, ir.FunctionType(V8F, [V8F] * 3), "llvm.fma.v8f32")
            a8 = get8(accs, j)
            for k in range(nblocks):
                idx = const(ir.VectorType(I32, 8), list(range(8 * k, 8 * k + 8)))
                a8 = builder.call(fma, [builder.shuffle_vector(p, p, idx), builder.shuffle_vector(sc, sc, idx), a8])
            return set8(accs, j, a8)

        def chunk(c, accs):
            return chunk_at(builder.mul(c, const(ity, chunk_blocks)), accs)

        def chunk_at(b0, accs, first=None):
            # blocks b0 .. b0+15; with ``first``, those before it count zero (their scales and
            # shift terms selected to 0: fma(0, p, acc) and acc + 0 leave acc as it was)
            if first is None:
                keep = None
            else:
                keep = builder.icmp_signed(">=", builder.add(splat(builder, b0, chunk_blocks),
                                                             const(ir.VectorType(ity, chunk_blocks), list(range(chunk_blocks)))),
                                           splat(builder, first, chunk_blocks))

            def masked(v):
                return v if keep is None else builder.select(keep, v, const(V16F, [0.0] * 16))
            # the rows passed as p (the group AHEAD on) at this chunk's offset, into L2 (prefetcht1):
            # faster than into L1, and than each row's own lines some bytes on (the float kernels'
            # pattern; docs/benchmarks.md, "Measurements behind code choices")
            for j in range(ROWS):
                prefetch_lines(builder, ps[j], builder.mul(b0, const(ity, nbytes)), (chunk_blocks * nbytes + 63) // 64, 2)
            v16h = ir.VectorType(I16, chunk_blocks)

            def f16s(j, k):  # the chunk's 16 fp16 field k (0: d, 1: m) of row j, one conversion
                if how == "avx512vnni" and nbytes <= STRIDED_WORDS_MAX:
                    return builder.fpext(builder.bitcast(strided_words(builder, ws[j], builder.add(
                        builder.mul(b0, const(ity, nbytes)), const(ity, 2 * k)), nbytes, chunk_blocks), ir.VectorType(HALF, chunk_blocks)), V16F)
                v = ir.Constant(v16h, ir.Undefined)
                for u in range(chunk_blocks):
                    off = builder.add(builder.mul(builder.add(b0, const(ity, u)), const(ity, nbytes)), const(ity, 2 * k))
                    v = builder.insert_element(v, builder.load(builder.bitcast(builder.gep(ws[j], [off]),
                                                                               I16.as_pointer()), align=1), const(I32, u))
                return builder.fpext(builder.bitcast(v, ir.VectorType(HALF, chunk_blocks)), V16F)

            dw = [f16s(j, 0) for j in range(ROWS)]
            dx = vload(builder, xd, b0, V16F, 4)
            sv = [masked(builder.fmul(dw[j], dx, flags=FAST)) for j in range(ROWS)]
            if shifted:  # lane u: block u's m_w·s_x or −offset·d_w·s_x
                sx = vload(builder, xs, b0, V16F, 4)
                for j in range(ROWS):
                    f = f16s(j, 1) if affine else builder.fmul(dw[j], const(V16F, [-float(B32_OFFSET[fmt])] * 16),
                                                               flags=FAST)
                    accs = add_to(accs, ROWS + j, masked(builder.fmul(f, sx, flags=FAST)))
            if quads:
                return quads_of(b0, accs, sv)
            # x (and its −128·Σ₄q_x) for the chunk's pairs once, then row after row: fewer live
            # registers than pair after pair across the rows (and faster for Q8_0)
            xpairs = {u: pair_x(b0, u) for u in range(0, chunk_blocks, 2)}
            if packed:
                for k in range(ROWS // 2):
                    for u in range(0, chunk_blocks, 2):
                        accs = pair2(b0, u, k, *xpairs[u], accs, sv)
                return accs
            for j in range(ROWS):
                for u in range(0, chunk_blocks, 2):
                    accs = pair(b0, u, j, *xpairs[u], accs, sv)
            return accs

        quads = how == "avx512vnni" and not blockwise

        def quads_of(b0, accs, sv):
            # the chunk as four quads of blocks: per row and quad two vpdpbusd into the same
            # lanes (low nibbles, then high), so one conversion, one scale permute and one FMA
            # per 128 values instead of per 64
            xs4 = []
            for q in range(0, chunk_blocks, 4):
                xl, xh = quad_x(builder, xq, builder.add(b0, const(ity, q)), ity)
                corr = None
                if biased:
                    c = idot_u8s8(builder, m128, xl, how)
                    corr = builder.sub(const(V16I32, [0] * 16), idot_u8s8(builder, m128, xh, how, acc=c))
                xs4.append((xl, xh, corr))
            for j in range(ROWS):
                for qi, q in enumerate(range(0, chunk_blocks, 4)):
                    xl, xh, corr = xs4[qi]
                    blk = builder.add(b0, const(ity, q))
                    wl, wh = quad_quants(builder, fmt, ws[j], builder.mul(blk, const(ity, nbytes)))
                    if biased:
                        isum = idot_u8s8(builder, builder.xor(wl, m128), xl, how, acc=corr)
                        isum = idot_u8s8(builder, builder.xor(wh, m128), xh, how, acc=isum)
                    else:
                        isum = idot_u8s8(builder, wh, xh, how, acc=idot_u8s8(builder, wl, xl, how))
                    sc = builder.shuffle_vector(sv[j], sv[j], const(V16I32, [q + u for u in range(4) for _ in range(4)]))
                    accs = add_to(accs, j, builder.fmul(builder.sitofp(isum, V16F), sc, flags=FAST))
            return accs

        def tail(blk, accs):  # one block, its bytes in the first half of a pair (the rest zero)
            base = builder.mul(blk, const(ity, nbytes))
            z32 = const(V32I8, [0] * 32)
            x = concat_vec(builder, vload(builder, xq, builder.mul(blk, const(ity, QK)), V32I8, 1), z32)
            dx = builder.load(builder.gep(xd, [blk]))
            zero16 = const(V16F, [0.0] * 16)
            for j in range(ROWS):
                w = concat_vec(builder, b32_quants(builder, fmt, ws[j], base, offset=False), z32)
                isum = idot_u8s8(builder, *operands(w, x), how)
                sc = splat(builder, builder.fmul(f16_at(builder, ws[j], base), dx, flags=FAST), 16)
                if blockwise:
                    accs = fma8_blocks(accs, j, builder.sitofp(isum, V16F), sc, 1)
                else:
                    accs = add_to(accs, j, builder.fmul(builder.sitofp(isum, V16F), sc, flags=FAST))
                if shifted:
                    t = builder.fmul(shift_w(j, base), builder.load(builder.gep(xs, [blk])), flags=FAST)
                    accs = add_to(accs, ROWS + j, builder.insert_element(zero16, t, const(I32, 0)))
            return accs

        def tail_pair(q, accs):
            # blocks b, b+1 past the last whole chunk (b = first such block + 2q) by the pair
            # step, their scales loaded one by one: faster than a one-block step for each
            b = builder.add(builder.mul(nchunk, const(ity, chunk_blocks)), builder.mul(q, const(ity, 2)))
            x, corr = pair_x(b, 0)
            dx = [builder.load(builder.gep(xd, [builder.add(b, const(ity, u))])) for u in (0, 1)]
            zero16 = const(V16F, [0.0] * 16)
            sv = []
            for j in range(ROWS):
                v = zero16
                for u in (0, 1):
                    base = builder.mul(builder.add(b, const(ity, u)), const(ity, nbytes))
                    v = builder.insert_element(v, builder.fmul(f16_at(builder, ws[j], base), dx[u], flags=FAST),
                                               const(I32, u))
                    if shifted:
                        t = builder.fmul(shift_w(j, base), builder.load(builder.gep(xs, [builder.add(b, const(ity, u))])),
                                         flags=FAST)
                        accs = add_to(accs, ROWS + j, builder.insert_element(zero16, t, const(I32, u)))
                sv.append(v)
            if packed:
                for k in range(ROWS // 2):
                    accs = pair2(b, 0, k, x, corr, accs, sv)
                return accs
            for j in range(ROWS):
                accs = pair(b, 0, j, x, corr, accs, sv)
            return accs

        nchunk = builder.sdiv(nb, const(ity, chunk_blocks))
        accs = ir_loop(builder, nchunk, zeros_f32(ROWS // 2, 16) if packed else zeros_f32(nacc, 8 if blockwise else 16),
                     chunk)
        # blocks past the last whole chunk: with nb >= 16, one more chunk ending at the row's
        # end, its blocks already counted masked (Falcon-7B's rows of 142 blocks: 8 chunks and
        # 14 blocks; for the 4/5-bit types faster than 7 pairs); shorter rows by pairs, then one block
        done = builder.mul(nchunk, const(ity, chunk_blocks))
        whole = builder.icmp_signed(">=", nb, const(ity, chunk_blocks))
        ragged = builder.and_(whole, builder.icmp_signed("<", done, nb))
        accs = ir_loop(builder, builder.zext(ragged, ity), accs,
                     lambda i, a: chunk_at(builder.sub(nb, const(ity, chunk_blocks)), a, first=done))
        npair = builder.select(whole, const(ity, 0), builder.sdiv(builder.sub(nb, done), const(ity, 2)))
        accs = ir_loop(builder, npair, accs, tail_pair)
        start = builder.add(done, builder.mul(npair, const(ity, 2)))
        accs = ir_loop(builder, builder.select(whole, start, nb), accs, tail, start=start)
        out = []
        for j in range(ROWS):
            v = get8(accs, j) if blockwise else builder.extract_value(accs, j)
            if shifted:
                v = builder.fadd(v, builder.extract_value(accs, ROWS + j), flags=FAST)
            out.append(hsum(builder, v))
        return context.make_tuple(builder, sig.return_type, out)

    return codegen


def dot4_b32_int(fmt, blockwise=None):
    """The four-row int8 dot product of ``fmt`` as an intrinsic; ``blockwise``: summed in ggml's
    order (BLOCKWISE) or not (None: as BLOCKWISE lists ``fmt``)."""
    gen = _dot4_b32_int_codegen(fmt, blockwise)

    def typer(typingctx, w0, w1, w2, w3, p0, p1, p2, p3, xq, xd, xs, nb):
        return types.UniTuple(types.float32, ROWS)(w0, w1, w2, w3, p0, p1, p2, p3, xq, xd, xs, nb), gen

    typer.__name__ = f"dot4i_{fmt}" + ("_ggml" if blockwise and fmt not in BLOCKWISE else "")
    return intrinsic(typer)


# four rows of 32-value blocks · an int8-quantized x (quants, d_x, s_x per block) over nb blocks
dot4i_q8_0, dot4i_q4_0, dot4i_q4_1 = dot4_b32_int("q8_0"), dot4_b32_int("q4_0"), dot4_b32_int("q4_1")
dot4i_q5_0, dot4i_q5_1, dot4i_iq4_nl = dot4_b32_int("q5_0"), dot4_b32_int("q5_1"), dot4_b32_int("iq4_nl")


# block types whose ggml dot products take Q8_1 activations (type_traits: their ``activations``)
AFFINE_B32 = frozenset(names("b32", where=lambda t: t.activations == "q8_1"))


# (runtime.decode_block calls it from inside its own compiled function too)
@njit(parallel=True, fastmath=True, cache=True)
def mm_b32_int8(W, xq, xd, xs, rows, Y, kind):  # W (n, k/32 · block bytes) uint8; x quantized
    T = xq.shape[0]
    nb = xd.shape[1]
    n = row_count(rows, W)
    for g in prange((n + 3) // 4):
        i0, i1, i2, i3 = group4(rows, n, g)
        n0, n1, n2, n3 = group4(rows, n, g + AHEAD)
        for t in range(T):
            if kind == 0:
                y = dot4i_q8_0(W[i0], W[i1], W[i2], W[i3], W[n0], W[n1], W[n2], W[n3], xq[t], xd[t], xs[t], nb)
            elif kind == 1:
                y = dot4i_q4_0(W[i0], W[i1], W[i2], W[i3], W[n0], W[n1], W[n2], W[n3], xq[t], xd[t], xs[t], nb)
            elif kind == 2:
                y = dot4i_q4_1(W[i0], W[i1], W[i2], W[i3], W[n0], W[n1], W[n2], W[n3], xq[t], xd[t], xs[t], nb)
            elif kind == 3:
                y = dot4i_q5_0(W[i0], W[i1], W[i2], W[i3], W[n0], W[n1], W[n2], W[n3], xq[t], xd[t], xs[t], nb)
            elif kind == 4:
                y = dot4i_q5_1(W[i0], W[i1], W[i2], W[i3], W[n0], W[n1], W[n2], W[n3], xq[t], xd[t], xs[t], nb)
            else:
                y = dot4i_iq4_nl(W[i0], W[i1], W[i2], W[i3], W[n0], W[n1], W[n2], W[n3], xq[t], xd[t], xs[t], nb)
            store_group(Y, t, rows, n, 4 * g, 1, y)
