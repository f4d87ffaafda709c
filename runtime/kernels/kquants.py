"""ggml's K-quants, 256-value super-blocks (Q2_K 84 B, Q3_K 110 B, Q4_K 144 B, Q5_K 176 B,
Q6_K 210 B, IQ4_XS 136 B), in float arithmetic: the layouts, a super-block of a row decoded and
multiplied in registers, and the kernel ``mm_kq``.

Weights stay as the GGUF stores them (uint8 rows of super-blocks) and are decoded in registers,
so the bytes a kernel reads are the stored bytes the byte counter reports; each row is read
once per call whatever T. Affine types (Q2_K, Q4_K, Q5_K) compute d·s·Σ q·x − dmin·m·Σ x per
sub-block; the Σ x per sub-block (``xsum``, ``KQ_XSUM`` values each) is computed once per call
and shared by all rows. Under ``--arithmetic int8`` (the default) they run on llama.cpp's Q8_K
activations instead (runtime.kernels.kquants_int); ``mm_block`` is this float path.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from aios.quant import QK_K, block_size
from runtime.kernels.blocks32 import lookup16, nibbles
from runtime.kernels.groups import group4, row_count, store_group
from runtime.kernels.ir_helpers import (
    F32,
    FAST,
    I32,
    ROWS,
    V32F,
    V32I8,
    accumulate,
    array_data,
    bitfield,
    const,
    f16_at,
    hsum,
    ir_loop,
    prefetch_lines,
    splat,
    splat_halves,
    u8_at,
    vload,
)
from runtime.kernels.type_traits import TYPE_TRAITS, names

# --- K-quants: 256-value super-blocks (Q2_K 84 B, Q3_K 110 B, Q4_K 144 B, Q5_K 176 B, Q6_K 210 B,
# IQ4_XS 136 B per block) ----------------------------------------------------------------------
# Layouts as ggml's block_q2_K ... block_iq4_xs. Per super-block and row: the sub-block scales
# are unpacked with scalar integer ops, the quants 32 at a time as vectors. Affine types (Q2_K,
# Q4_K, Q5_K) add −dmin·m·Σx per sub-block from ``xs`` (Σx per sub-block, computed once per
# call and shared by every row).
KQ_TYPES = names("kq")  # rows of runtime.kernels.type_traits; their order is mm_kq's kind
KQ_BYTES = {t: TYPE_TRAITS[t].block_bytes for t in KQ_TYPES}  # bytes per super-block
assert all(block_size(t) == QK_K for t in KQ_TYPES)
# Byte offsets inside one super-block: layout facts of ggml's structs (ggml-common.h),
#   block_q4_K {half d; half dmin; uint8 scales[12]; uint8 qs[QK_K/2]}
#   block_q5_K {half d; half dmin; uint8 scales[12]; uint8 qh[QK_K/8]; uint8 qs[QK_K/2]}
#   block_q6_K {uint8 ql[QK_K/2]; uint8 qh[QK_K/4]; int8 scales[QK_K/16]; half d}
#   block_q2_K {uint8 scales[QK_K/16]; uint8 qs[QK_K/4]; half d; half dmin}
#   block_q3_K {uint8 hmask[QK_K/8]; uint8 qs[QK_K/4]; uint8 scales[12]; half d}
#   block_iq4_xs {half d; uint16 scales_h; uint8 scales_l[QK_K/64]; uint8 qs[QK_K/2]}
Q4K_SCALES = 4
Q4K_QS = Q4K_SCALES + 12
Q5K_QH = Q4K_QS
Q5K_QS = Q5K_QH + QK_K // 8
Q6K_QH = QK_K // 2
Q6K_SCALES = Q6K_QH + QK_K // 4
Q6K_D = Q6K_SCALES + QK_K // 16
Q2K_QS = QK_K // 16
Q2K_D = Q2K_QS + QK_K // 4
Q3K_QS = QK_K // 8
Q3K_SCALES = Q3K_QS + QK_K // 4
Q3K_D = Q3K_SCALES + 12
IQ4XS_SL = 4
IQ4XS_QS = IQ4XS_SL + QK_K // 64
# the layouts above and gguf-py's table agree on each type's bytes per super-block
assert KQ_BYTES == {"q4_k": Q4K_QS + QK_K // 2, "q6_k": Q6K_D + 2, "q2_k": Q2K_D + 4, "q5_k": Q5K_QS + QK_K // 2,
                    "q3_k": Q3K_D + 2, "iq4_xs": IQ4XS_QS + QK_K // 2}


def _q4_k_row(b, p, base, xv, xs, q5=False):
    """(Σ_j d·sc_j·Σ q·x as <16 x float>, Σ_j dmin·m_j·Σx_j) for one Q4_K super-block of a row
    (``q5``: a Q5_K one, whose value j·32 + l adds bit j of qh[l] as its fifth bit)."""
    d, dmin = f16_at(b, p, base), f16_at(b, p, b.add(base, const(base.type, 2)))
    s = [u8_at(b, p, b.add(base, const(base.type, Q4K_SCALES + i))) for i in range(12)]
    c = lambda v: const(I32, v)  # noqa: E731
    sc, m = [], []
    for j in range(8):  # ggml's get_scale_min_k4
        if j < 4:
            sc.append(b.and_(s[j], c(63)))
            m.append(b.and_(s[j + 4], c(63)))
        else:
            sc.append(b.or_(b.and_(s[j + 4], c(15)), b.shl(b.lshr(s[j - 4], c(6)), c(4))))
            m.append(b.or_(b.lshr(s[j + 4], c(4)), b.shl(b.lshr(s[j], c(6)), c(4))))
    acc = None
    lo16, hi16 = const(ir.VectorType(I32, 16), list(range(16))), const(ir.VectorType(I32, 16), list(range(16, 32)))
    undef = ir.Constant(V32F, ir.Undefined)
    H = vload(b, p, b.add(base, const(base.type, Q5K_QH)), V32I8, 1) if q5 else None
    for jj in range(4):  # 32 bytes: sub-block 2jj in the low nibbles, 2jj + 1 in the high ones
        q = vload(b, p, b.add(base, const(base.type, (Q5K_QS if q5 else Q4K_QS) + 32 * jj)), V32I8, 1)
        for half, qv in ((0, bitfield(b, q, 0, 15)), (1, bitfield(b, q, 4, None))):
            j = 2 * jj + half
            if q5:
                qv = b.or_(qv, b.shl(bitfield(b, H, j, 1), const(V32I8, [4] * 32)))
            # fold the sub-block's 32 products to 16 lanes first (a multiply and a fused
            # multiply-add), then one fused multiply-add by its scale: 3 vector ops, not 4
            pr = b.fmul(b.uitofp(qv, V32F), xv[j], flags=FAST)
            t = b.fadd(b.shuffle_vector(pr, undef, lo16), b.shuffle_vector(pr, undef, hi16), flags=FAST)
            t = b.fmul(t, splat(b, b.fmul(d, b.uitofp(sc[j], F32), flags=FAST), 16), flags=FAST)
            acc = t if acc is None else b.fadd(acc, t, flags=FAST)
    mins = None
    for j in range(8):
        t = b.fmul(b.fmul(dmin, b.uitofp(m[j], F32), flags=FAST), xs[j], flags=FAST)
        mins = t if mins is None else b.fadd(mins, t, flags=FAST)
    return acc, mins


def _q6_k_row(b, p, base, xv, xs):
    """Σ d·sc·q·x for one Q6_K super-block (ql[128], qh[64], int8 scales[16], fp16 d)."""
    off = lambda k: b.add(base, const(base.type, k))  # noqa: E731
    d = f16_at(b, p, off(Q6K_D))
    sc = [b.fmul(d, b.sitofp(b.load(b.gep(p, [off(Q6K_SCALES + i)])), F32), flags=FAST)
          for i in range(16)]
    acc = None
    for n in range(2):  # 128 values each
        A, B = vload(b, p, off(64 * n), V32I8, 1), vload(b, p, off(64 * n + 32), V32I8, 1)
        H = vload(b, p, off(Q6K_QH + 32 * n), V32I8, 1)
        for g, (low, hsh) in enumerate(((bitfield(b, A, 0, 15), 0), (bitfield(b, B, 0, 15), 2),
                                        (bitfield(b, A, 4, None), 4), (bitfield(b, B, 4, None), 6))):
            q = b.or_(low, b.shl(bitfield(b, H, hsh, 3), const(V32I8, [4] * 32)))
            qf = b.sitofp(b.sub(q, const(V32I8, [32] * 32)), V32F)
            s = splat_halves(b, sc[8 * n + 2 * g], sc[8 * n + 2 * g + 1])
            t = b.fmul(b.fmul(qf, xv[4 * n + g], flags=FAST), s, flags=FAST)
            acc = t if acc is None else b.fadd(acc, t, flags=FAST)
    return acc, None


def _q2_k_row(b, p, base, xv, xs):
    """Q2_K super-block: scales[16] (4-bit scale | 4-bit min), qs[64], fp16 d, fp16 dmin."""
    off = lambda k: b.add(base, const(base.type, k))  # noqa: E731
    d, dmin = f16_at(b, p, off(Q2K_D)), f16_at(b, p, off(Q2K_D + 2))
    s = [u8_at(b, p, off(i)) for i in range(16)]
    dl = [b.fmul(d, b.uitofp(b.and_(v, const(I32, 15)), F32), flags=FAST) for v in s]
    ml = [b.fmul(dmin, b.uitofp(b.lshr(v, const(I32, 4)), F32), flags=FAST) for v in s]
    acc = mins = None
    for n in range(2):
        Q = vload(b, p, off(Q2K_QS + 32 * n), V32I8, 1)
        for j in range(4):  # values 128n + 32j + l: bits 2j of qs[32n + l]
            qf = b.uitofp(bitfield(b, Q, 2 * j, 3), V32F)
            k = 8 * n + 2 * j
            t = b.fmul(b.fmul(qf, xv[4 * n + j], flags=FAST), splat_halves(b, dl[k], dl[k + 1]), flags=FAST)
            acc = t if acc is None else b.fadd(acc, t, flags=FAST)
            for u in (k, k + 1):
                t = b.fmul(ml[u], xs[u], flags=FAST)
                mins = t if mins is None else b.fadd(mins, t, flags=FAST)
    return acc, mins


def _q5_k_row(b, p, base, xv, xs):
    return _q4_k_row(b, p, base, xv, xs, q5=True)


def _q3_k_row(b, p, base, xv, xs):
    """Q3_K super-block: hmask[32], qs[64] (2 low bits), scales[12] (16 signed 6-bit), fp16 d."""
    off = lambda k: b.add(base, const(base.type, k))  # noqa: E731
    d = f16_at(b, p, off(Q3K_D))
    s = [u8_at(b, p, off(Q3K_SCALES + i)) for i in range(12)]
    dl = []
    for k in range(16):  # low 4 bits from bytes 0-7, high 2 bits from bytes 8-11 (gguf-py's Q3_K)
        lo = b.and_(b.lshr(s[k % 8], const(I32, 4 * (k // 8))), const(I32, 15))
        hi = b.and_(b.lshr(s[8 + k % 4], const(I32, 2 * (k // 4))), const(I32, 3))
        sc = b.sub(b.or_(lo, b.shl(hi, const(I32, 4))), const(I32, 32))
        dl.append(b.fmul(d, b.sitofp(sc, F32), flags=FAST))
    H = vload(b, p, off(0), V32I8, 1)
    acc = None
    for n in range(2):
        Q = vload(b, p, off(Q3K_QS + 32 * n), V32I8, 1)
        for j in range(4):  # values 128n + 32j + l: bits 2j of qs[32n + l], bit 4n + j of hmask[l]
            hb = b.shl(bitfield(b, H, 4 * n + j, 1), const(V32I8, [2] * 32))  # 4 when set, else the −4 offset
            q = b.sub(b.or_(bitfield(b, Q, 2 * j, 3), hb), const(V32I8, [4] * 32))
            k = 8 * n + 2 * j
            t = b.fmul(b.fmul(b.sitofp(q, V32F), xv[4 * n + j], flags=FAST), splat_halves(b, dl[k], dl[k + 1]),
                       flags=FAST)
            acc = t if acc is None else b.fadd(acc, t, flags=FAST)
    return acc, None


def _iq4_xs_row(b, p, base, xv, xs):
    """IQ4_XS super-block: fp16 d, scales_h (2 bits × 8), scales_l (4 bits × 8), qs[128] whose
    nibbles index kvalues_iq4nl; sub-block j: 16 bytes, low nibbles then high ones."""
    off = lambda k: b.add(base, const(base.type, k))  # noqa: E731
    d = f16_at(b, p, off(0))
    sh = b.or_(u8_at(b, p, off(2)), b.shl(u8_at(b, p, off(3)), const(I32, 8)))
    acc = None
    for j in range(8):
        lo = b.and_(b.lshr(u8_at(b, p, off(IQ4XS_SL + j // 2)), const(I32, 4 * (j % 2))), const(I32, 15))
        hi = b.and_(b.lshr(sh, const(I32, 2 * j)), const(I32, 3))
        sc = b.fmul(d, b.sitofp(b.sub(b.or_(lo, b.shl(hi, const(I32, 4))), const(I32, 32)), F32), flags=FAST)
        q = b.sitofp(lookup16(b, nibbles(b, p, off(IQ4XS_QS + 16 * j))), V32F)
        t = b.fmul(b.fmul(q, xv[j], flags=FAST), splat(b, sc, 32), flags=FAST)
        acc = t if acc is None else b.fadd(acc, t, flags=FAST)
    return acc, None


_KQ_ROW = {"q2_k": (_q2_k_row, 16), "q3_k": (_q3_k_row, 0), "q4_k": (_q4_k_row, 8), "q5_k": (_q5_k_row, 8),
           "q6_k": (_q6_k_row, 0), "iq4_xs": (_iq4_xs_row, 0)}  # row fn, Σx per super-block


def _dot4_kq_codegen(fmt):
    row_fn, nxs = _KQ_ROW[fmt]
    nbytes = KQ_BYTES[fmt]

    def codegen(context, builder, sig, args):
        # args: w0..w3, p0..p3 (uint8 rows), x, xs (Σx per sub-block; unused by Q6_K), nsb
        ws = [array_data(context, builder, sig.args[j], args[j]) for j in range(ROWS)]
        ps = [array_data(context, builder, sig.args[ROWS + j], args[ROWS + j]) for j in range(ROWS)]
        x = array_data(context, builder, sig.args[2 * ROWS], args[2 * ROWS])
        xsum = array_data(context, builder, sig.args[2 * ROWS + 1], args[2 * ROWS + 1])
        nsb = args[2 * ROWS + 2]
        ity = nsb.type
        VT = ir.VectorType(F32, 16 if fmt in ("q4_k", "q5_k") else 32)  # the row function's accumulator width
        ST = ir.LiteralStructType([VT] * ROWS + [F32] * ROWS)
        init = ir.Constant(ST, [const(VT, [0.0] * VT.count)] * ROWS + [const(F32, 0.0)] * ROWS)

        def body(sb, accs):
            base = builder.mul(sb, const(ity, nbytes))
            xo = builder.mul(sb, const(ity, QK_K))
            xv = [vload(builder, x, builder.add(xo, const(ity, 32 * u)), V32F, 4) for u in range(8)]
            xo = builder.mul(sb, const(ity, max(1, nxs)))
            xs = [builder.load(builder.gep(xsum, [builder.add(xo, const(ity, u))])) for u in range(nxs)]
            for r in range(ROWS):
                prefetch_lines(builder, ps[r], base, (nbytes + 63) // 64)
                vec, mins = row_fn(builder, ws[r], base, xv, xs)
                accs = accumulate(builder, accs, r, vec)
                if mins is not None:
                    accs = builder.insert_value(accs, builder.fsub(builder.extract_value(accs, ROWS + r), mins,
                                                                   flags=FAST), ROWS + r)
            return accs

        accs = ir_loop(builder, nsb, init, body)
        out = [builder.fadd(hsum(builder, builder.extract_value(accs, r)), builder.extract_value(accs, ROWS + r),
                            flags=FAST) for r in range(ROWS)]
        return context.make_tuple(builder, sig.return_type, out)

    return codegen


def _dot4_kq(fmt):
    gen = _dot4_kq_codegen(fmt)

    def typer(typingctx, w0, w1, w2, w3, p0, p1, p2, p3, x, xs, nsb):
        return types.UniTuple(types.float32, ROWS)(w0, w1, w2, w3, p0, p1, p2, p3, x, xs, nsb), gen

    typer.__name__ = f"dot4_{fmt}"
    return intrinsic(typer)


# four K-quant rows (raw GGUF super-block bytes) · x over nsb super-blocks; p0..p3 prefetched
dot4_q2_k, dot4_q3_k, dot4_q4_k = _dot4_kq("q2_k"), _dot4_kq("q3_k"), _dot4_kq("q4_k")
dot4_q5_k, dot4_q6_k, dot4_iq4_xs = _dot4_kq("q5_k"), _dot4_kq("q6_k"), _dot4_kq("iq4_xs")


KQ_KIND = {fmt: i for i, fmt in enumerate(KQ_TYPES)}  # the run-time ``kind`` of mm_kq
# values per Σx (the affine types': their sub-blocks' values)
KQ_XSUM = {t: TYPE_TRAITS[t].scale_values for t in KQ_TYPES if TYPE_TRAITS[t].affine}


@njit(parallel=True, fastmath=True, cache=True)
def mm_kq(W, X, xs, rows, Y, kind):  # W (n, k/QK_K · block bytes) uint8; xs Σx per sub-block
    T, k = X.shape
    nsb = k // QK_K
    n = row_count(rows, W)
    for g in prange((n + 3) // 4):
        i0, i1, i2, i3 = group4(rows, n, g)
        n0, n1, n2, n3 = group4(rows, n, g + 1)
        for t in range(T):
            if kind == 0:
                y = dot4_q2_k(W[i0], W[i1], W[i2], W[i3], W[n0], W[n1], W[n2], W[n3], X[t], xs[t], nsb)
            elif kind == 1:
                y = dot4_q3_k(W[i0], W[i1], W[i2], W[i3], W[n0], W[n1], W[n2], W[n3], X[t], xs[t], nsb)
            elif kind == 2:
                y = dot4_q4_k(W[i0], W[i1], W[i2], W[i3], W[n0], W[n1], W[n2], W[n3], X[t], xs[t], nsb)
            elif kind == 3:
                y = dot4_q5_k(W[i0], W[i1], W[i2], W[i3], W[n0], W[n1], W[n2], W[n3], X[t], xs[t], nsb)
            elif kind == 4:
                y = dot4_q6_k(W[i0], W[i1], W[i2], W[i3], W[n0], W[n1], W[n2], W[n3], X[t], xs[t], nsb)
            else:
                y = dot4_iq4_xs(W[i0], W[i1], W[i2], W[i3], W[n0], W[n1], W[n2], W[n3], X[t], xs[t], nsb)
            store_group(Y, t, rows, n, 4 * g, 1, y)


def xsum(X, sub):
    """(T, k) -> (T, k/sub) sums of each sub-block of the input."""
    return X.reshape(X.shape[0], -1, sub).sum(axis=2, dtype=np.float32)
