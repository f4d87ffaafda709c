"""The K-quants times llama.cpp's Q8_K activations ("int8" arithmetic): integer sums by
pmaddubsw and vpdpwssd, the minimum / offset terms from the activation blocks' group sums, and
the kernel ``mm_kq_int8`` (the activations quantized by runtime.kernels.quantize)."""

from __future__ import annotations

from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from aios.quant import QK_K
from runtime.kernels.blocks32 import KVALUES_IQ4NL
from runtime.kernels.blocks32_int import PAIR_ORDER, lookup16_pshufb
from runtime.kernels.groups import AHEAD, group4, row_count, store_group
from runtime.kernels.ir_helpers import (
    FAST,
    I8,
    I16,
    I32,
    ROWS,
    V8F,
    V8I32,
    V16F,
    V16I16,
    V16I32,
    V32I8,
    V32I16,
    V64I8,
    array_data,
    bitfield,
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
    split_vec,
    u8_at,
    vload,
)
from runtime.kernels.kquants import (
    IQ4XS_QS,
    IQ4XS_SL,
    KQ_BYTES,
    Q2K_D,
    Q2K_QS,
    Q3K_D,
    Q3K_QS,
    Q3K_SCALES,
    Q4K_QS,
    Q4K_SCALES,
    Q5K_QH,
    Q5K_QS,
    Q6K_D,
    Q6K_QH,
    Q6K_SCALES,
)
from runtime.kernels.type_traits import names

# --- K-quants with int8 activations (Q2_K, Q4_K, Q5_K, Q6_K, IQ4_XS): llama.cpp's Q8_K scheme --
# Each activation row is quantized once per matmul to 256-value blocks (``quantize_q8_k``, ggml's
# quantize_row_q8_K: float d, int8 q[256], the 16 sums of each 16-value group ``bsums``). A row's
# super-block then contributes d_x·(d·Σ_j sc_j·Σ q_w·q_x − dmin·Σ_j m_j·Σ_{group} q_x) (Q4_K)
# (Q5_K alike, its quants 0..31; Q2_K per 16-value group, quants 0..3) or d_x·d·Σ_g sc_g·(Σ q_w·q_x − 32·bsum_g) (Q6_K, its stored
# 6-bit value is q_w + 32), every inner sum exact in int32. The stored quants are unsigned (Q4_K
# 0..15, Q5_K 0..31, Q6_K 0..63), so they are
# the unsigned operand of pmaddubsw directly (|products| ≤ 2·63·127, no saturation), and the
# 16-bit pair sums meet the sub-block scales in one multiply-add to int32 (AVX-512 VNNI
# vpdpwssd; pmaddwd + add elsewhere). One int → float conversion and multiply-add per
# super-block and row; the minimum / offset terms come from the bsums (one pmaddwd).


KQ_INT = names("kq", by="int8_kind")  # K-quants with an int8-activation kernel (mm_kq_int8's kinds)
KQ_DOT_NAMES = {"avx512vnni": "AVX-512 pmaddubsw + VNNI vpdpwssd", "avxvnni": "AVX2 pmaddubsw + pmaddwd",
                "avx2": "AVX2 pmaddubsw + pmaddwd", "generic": "portable integer IR"}  # as arithmetic_label says


def _maddubs(b, u, s, how):
    """<32 x i16>: lane l = u[2l]·s[2l] + u[2l+1]·s[2l+1], <64 x i8> u unsigned, s signed."""
    if how == "avx512vnni":
        return b.call(declare(b, "llvm.x86.avx512.pmaddubs.w.512", V32I16, [V64I8, V64I8]), [u, s])
    if how in ("avxvnni", "avx2"):
        fn = declare(b, "llvm.x86.avx2.pmadd.ub.sw", V16I16, [V32I8, V32I8])
        return concat_vec(b, b.call(fn, [split_vec(b, u, 0, 32), split_vec(b, s, 0, 32)]),
                       b.call(fn, [split_vec(b, u, 32, 32), split_vec(b, s, 32, 32)]))
    V64I16 = ir.VectorType(I16, 64)
    prod = b.mul(b.zext(u, V64I16), b.sext(s, V64I16))
    return b.add(_evens(b, prod), _odds(b, prod))


def _evens(b, v):
    n = v.type.count
    return b.shuffle_vector(v, v, const(ir.VectorType(I32, n // 2), list(range(0, n, 2))))


def _odds(b, v):
    n = v.type.count
    return b.shuffle_vector(v, v, const(ir.VectorType(I32, n // 2), list(range(1, n, 2))))


def _madd_wd(b, a, s, how):
    """<n/2 x i32>: lane l = a[2l]·s[2l] + a[2l+1]·s[2l+1] for <n x i16> a, s (n 16 or 32)."""
    n = a.type.count
    if how != "generic":
        if n == 32 and how == "avx512vnni":
            return b.call(declare(b, "llvm.x86.avx512.pmaddw.d.512", V16I32, [V32I16, V32I16]), [a, s])
        fn = declare(b, "llvm.x86.avx2.pmadd.wd", V8I32, [V16I16, V16I16])
        parts = [b.call(fn, [split_vec(b, a, h, 16), split_vec(b, s, h, 16)]) for h in range(0, n, 16)]
        return parts[0] if len(parts) == 1 else concat_vec(b, parts[0], parts[1])
    VT = ir.VectorType(I32, n)
    prod = b.mul(b.sext(a, VT), b.sext(s, VT))
    return b.add(_evens(b, prod), _odds(b, prod))


def _madd_acc(b, acc, a, s, how):
    """acc (<16 x i32>) + _madd_wd(a, s): one vpdpwssd with AVX-512 VNNI."""
    if how == "avx512vnni":
        fn = declare(b, "llvm.x86.avx512.vpdpwssd.512", V16I32, [V16I32] * 3)
        return b.call(fn, [acc, b.bitcast(a, V16I32), b.bitcast(s, V16I32)])
    return b.add(acc, _madd_wd(b, a, s, how))


def _i32_at(b, p, idx):
    return b.load(b.bitcast(b.gep(p, [idx]), I32.as_pointer()), align=1)


def _q4_k_scales_mins(b, p, base):
    """<16 x i8>: the 8 six-bit scales then the 8 six-bit mins of a Q4_K super-block (ggml's
    utmp unpacking of scales[12]: three 32-bit words, masks 0x3f3f3f3f/0x0f0f0f0f/0x03030303)."""
    s0, s1, s2 = (_i32_at(b, p, b.add(base, const(base.type, Q4K_SCALES + 4 * i))) for i in range(3))
    k1, k2, k3 = const(I32, 0x3F3F3F3F), const(I32, 0x0F0F0F0F), const(I32, 0x03030303)
    u3 = b.or_(b.and_(b.lshr(s2, const(I32, 4)), k2), b.shl(b.and_(b.lshr(s1, const(I32, 6)), k3), const(I32, 4)))
    u2 = b.and_(s1, k1)
    u1 = b.or_(b.and_(s2, k2), b.shl(b.and_(b.lshr(s0, const(I32, 6)), k3), const(I32, 4)))
    u0 = b.and_(s0, k1)
    v = ir.Constant(ir.VectorType(I32, 4), ir.Undefined)
    for i, u in enumerate((u0, u1, u2, u3)):
        v = b.insert_element(v, u, const(I32, i))
    return b.bitcast(v, ir.VectorType(I8, 16))


def _spread(b, v16, lanes, ext):
    """<len(lanes) x i16>: bytes v16[lanes[i]] widened (ext: b.zext or b.sext)."""
    n = len(lanes)
    return ext(b.shuffle_vector(v16, v16, const(ir.VectorType(I32, n), lanes)), ir.VectorType(I16, n))


def _q4_k_row_int(b, p, base, xv, bs, how, q5=False):
    """(Σ_j sc_j·Σ q·q_x as <16 x i32>, Σ_j m_j·(its two bsums) as <8 x i32>) for one Q4_K
    super-block (``q5``: Q5_K, value j·32 + l adding bit j of qh[l] as its fifth bit, 0..31);
    xv: the block's 256 q_x as four <64 x i8>, bs: its bsums <16 x i16>."""
    sm = _q4_k_scales_mins(b, p, base)
    acc = const(V16I32, [0] * 16)
    if how == "avx512vnni":
        # xv as the caller arranged it for Q4_K/Q5_K. 64 bytes at a time: the low nibbles are
        # sub-blocks 4h and 4h + 2, the high ones 4h + 1 and 4h + 3; each sub-block's scale
        # spread by one word permute of the eight scales widened once. Q5_K's fifth bits: qh
        # twice in one vector, bit j of byte l tested per lane (vptestmb) and added as 16
        s16 = b.zext(b.shuffle_vector(sm, sm, const(ir.VectorType(I32, 8), list(range(8)))), ir.VectorType(I16, 8))
        if q5:
            h32 = vload(b, p, b.add(base, const(base.type, Q5K_QH)), V32I8, 1)
            H64 = concat_vec(b, h32, h32)
            zero, sixteen = const(V64I8, [0] * 64), const(V64I8, [16] * 64)
        for h in range(2):
            q = vload(b, p, b.add(base, const(base.type, (Q5K_QS if q5 else Q4K_QS) + 64 * h)), V64I8, 1)
            for part, w in enumerate((b.and_(q, const(V64I8, [15] * 64)), b.lshr(q, const(V64I8, [4] * 64)))):
                j = 4 * h + part
                if q5:
                    bit = b.icmp_unsigned("!=", b.and_(H64, const(V64I8, [1 << j] * 32 + [1 << (j + 2)] * 32)), zero)
                    w = b.or_(w, b.select(bit, sixteen, zero))
                sc = b.shuffle_vector(s16, s16, const(ir.VectorType(I32, 32), [j] * 16 + [j + 2] * 16))
                acc = _madd_acc(b, acc, _maddubs(b, w, xv[2 * h + part], how), sc, how)
        mins = _madd_wd(b, _spread(b, sm, [8 + i // 2 for i in range(16)], b.zext), bs, how)
        return acc, mins
    H = vload(b, p, b.add(base, const(base.type, Q5K_QH)), V32I8, 1) if q5 else None
    sixteen = const(V32I8, [16] * 32)
    for jj in range(4):  # 32 bytes: sub-block 2jj in the low nibbles, 2jj + 1 in the high ones
        q = vload(b, p, b.add(base, const(base.type, (Q5K_QS if q5 else Q4K_QS) + 32 * jj)), V32I8, 1)
        lo, hi = bitfield(b, q, 0, 15), bitfield(b, q, 4, None)
        if q5:
            lo = b.or_(lo, b.and_(b.shl(bitfield(b, H, 2 * jj, None), const(V32I8, [4] * 32)), sixteen))
            hi = b.or_(hi, b.and_(b.shl(bitfield(b, H, 2 * jj + 1, None), const(V32I8, [4] * 32)), sixteen))
        w = concat_vec(b, lo, hi)
        sc = _spread(b, sm, [2 * jj] * 16 + [2 * jj + 1] * 16, b.zext)
        acc = _madd_acc(b, acc, _maddubs(b, w, xv[jj], how), sc, how)
    mins = _madd_wd(b, _spread(b, sm, [8 + i // 2 for i in range(16)], b.zext), bs, how)
    return acc, mins


def _q6_k_row_int(b, p, base, xv, bs, how):
    """(Σ_g sc_g·(Σ q·q_x − 32·bsum_g) as <16 x i32>, None) for one Q6_K super-block."""
    off = lambda k: b.add(base, const(base.type, k))  # noqa: E731
    sc = vload(b, p, off(Q6K_SCALES), ir.VectorType(I8, 16), 1)
    acc = const(V16I32, [0] * 16)
    for n in range(2):  # 128 values each: units u = 2n (values 0-63 of the half), 2n + 1 (64-127)
        A, B = vload(b, p, off(64 * n), V32I8, 1), vload(b, p, off(64 * n + 32), V32I8, 1)
        H = vload(b, p, off(Q6K_QH + 32 * n), V32I8, 1)
        four = const(V32I8, [4] * 32)
        q = [b.or_(low, b.shl(bitfield(b, H, hsh, 3), four))
             for low, hsh in ((bitfield(b, A, 0, 15), 0), (bitfield(b, B, 0, 15), 2),
                              (bitfield(b, A, 4, None), 4), (bitfield(b, B, 4, None), 6))]
        for h in range(2):
            u = 2 * n + h
            s16 = _spread(b, sc, [4 * u + i // 8 for i in range(32)], b.sext)
            acc = _madd_acc(b, acc, _maddubs(b, concat_vec(b, q[2 * h], q[2 * h + 1]), xv[u], how), s16, how)
    offs = _madd_wd(b, b.sext(sc, V16I16), bs, how)  # Σ sc_g·bsum_g, 8 lanes
    offs = b.shuffle_vector(offs, const(V8I32, [0] * 8), const(V16I32, list(range(16))))
    return b.sub(acc, b.shl(offs, const(V16I32, [5] * 16))), None


def _iq4_xs_row_int(b, p, base, xv, bs, how):
    """(Σ_j (ls_j − 32)·Σ q·q_x as <16 x i32>, None) for one IQ4_XS super-block; xv in PAIR_ORDER
    per 64 values (sub-block 2jj's low nibbles, 2jj + 1's, then both high ones: one AND and one
    shift per 32 bytes). The table values are signed (−127..113): pmaddubsw gets |q| and q_x
    with q's sign (|products| ≤ 2·127·127, no saturation), as ggml's mul_add_epi8."""
    off = lambda k: b.add(base, const(base.type, k))  # noqa: E731
    sh = b.or_(u8_at(b, p, off(2)), b.shl(u8_at(b, p, off(3)), const(I32, 8)))
    ls = ir.Constant(ir.VectorType(I8, 16), ir.Undefined)
    for j in range(8):
        lo = b.and_(b.lshr(u8_at(b, p, off(IQ4XS_SL + j // 2)), const(I32, 4 * (j % 2))), const(I32, 15))
        hi = b.and_(b.lshr(sh, const(I32, 2 * j)), const(I32, 3))
        ls = b.insert_element(ls, b.trunc(b.sub(b.or_(lo, b.shl(hi, const(I32, 4))), const(I32, 32)), I8), const(I32, j))
    acc = const(V16I32, [0] * 16)
    if how == "avx512vnni":
        # xv as _dot4_kq_int_codegen arranged it for IQ4_XS: values 0-15 of sub-blocks 4h..4h+3,
        # then their values 16-31. The table plus 128 is unsigned (1..241), so vpdpbusd
        # takes it as it is: per 64 bytes (sub-blocks 4h..4h+3) the low and the high nibbles'
        # products go into the same four lanes per sub-block, times its scale by one vpmulld;
        # the 128·Σx it added comes off once per super-block from the bsums
        t128 = const(V64I8, [v + 128 for v in KVALUES_IQ4NL] * 4)
        shuf = declare(b, "llvm.x86.avx512.pshuf.b.512", V64I8, [V64I8, V64I8])
        for h in range(2):
            q = vload(b, p, off(IQ4XS_QS + 64 * h), V64I8, 1)
            ul = b.call(shuf, [t128, b.and_(q, const(V64I8, [15] * 64))])
            uh = b.call(shuf, [t128, b.lshr(q, const(V64I8, [4] * 64))])
            isum = idot_u8s8(b, uh, xv[2 * h + 1], how, acc=idot_u8s8(b, ul, xv[2 * h], how))
            sc = b.sext(b.shuffle_vector(ls, ls, const(V16I32, [4 * h + i // 4 for i in range(16)])), V16I32)
            acc = b.add(acc, b.mul(isum, sc))
        corr = _madd_wd(b, _spread(b, ls, [i // 2 for i in range(16)], b.sext), bs, how)  # ls_j·Σx_j
        corr = b.shl(concat_vec(b, corr, const(ir.VectorType(I32, 8), [0] * 8)), const(V16I32, [7] * 16))
        return b.sub(acc, corr), None
    zero = const(V64I8, [0] * 64)
    for jj in range(4):
        q = vload(b, p, off(IQ4XS_QS + 32 * jj), V32I8, 1)
        w = lookup16_pshufb(b, concat_vec(b, bitfield(b, q, 0, 15), bitfield(b, q, 4, None)), how)
        neg = b.icmp_signed("<", w, zero)
        u, x = b.select(neg, b.sub(zero, w), w), b.select(neg, b.sub(zero, xv[jj]), xv[jj])
        sc = _spread(b, ls, ([2 * jj] * 8 + [2 * jj + 1] * 8) * 2, b.sext)
        acc = _madd_acc(b, acc, _maddubs(b, u, x, how), sc, how)
    return acc, None


def _q2_k_row_int(b, p, base, xv, bs, how):
    """(Σ_g sc_g·Σ q·q_x as <16 x i32>, Σ_g m_g·bsum_g as <8 x i32>) for one Q2_K super-block:
    scales[16] (4-bit scale | 4-bit minimum << 4), qs[64]: value 128n + 32j + l is bits 2j of
    qs[32n + l], so two shifts of 32 bytes give 64 values in natural order (sub-blocks of 16)."""
    sm = vload(b, p, base, ir.VectorType(I8, 16), 1)
    sc = b.and_(sm, const(sm.type, [15] * 16))
    acc = const(V16I32, [0] * 16)
    if how == "avx512vnni":
        # all 64 quant bytes at once: bits 2j give values 32j + l (lanes 0-31) and 128 + 32j + l
        # (lanes 32-63), x arranged so by the caller; sub-block scales by one word permute
        Q = vload(b, p, b.add(base, const(base.type, Q2K_QS)), V64I8, 1)
        s16 = b.zext(sc, V16I16)
        for j in range(4):
            w = b.and_(b.lshr(Q, const(V64I8, [2 * j] * 64)) if j else Q, const(V64I8, [3] * 64))
            lanes = [2 * j] * 8 + [2 * j + 1] * 8 + [8 + 2 * j] * 8 + [9 + 2 * j] * 8
            acc = _madd_acc(b, acc, _maddubs(b, w, xv[j], how), b.shuffle_vector(s16, s16, const(ir.VectorType(I32, 32), lanes)), how)
        mins = b.zext(b.lshr(sm, const(sm.type, [4] * 16)), V16I16)
        return acc, _madd_wd(b, mins, bs, how)
    for n in range(2):
        Q = vload(b, p, b.add(base, const(base.type, Q2K_QS + 32 * n)), V32I8, 1)
        for h in range(2):
            u = 2 * n + h
            w = concat_vec(b, bitfield(b, Q, 4 * h, 3), bitfield(b, Q, 4 * h + 2, 3))
            s16 = _spread(b, sc, [4 * u + i // 8 for i in range(32)], b.zext)
            acc = _madd_acc(b, acc, _maddubs(b, w, xv[u], how), s16, how)
    mins = b.zext(b.lshr(sm, const(sm.type, [4] * 16)), V16I16)
    return acc, _madd_wd(b, mins, bs, how)


def _q3_k_row_int(b, p, base, xv, bs, how):
    """(Σ_g sc_g·(Σ u·q_x − 4·bsum_g) as <16 x i32>, None) for one Q3_K super-block: u = the 2
    low bits (as Q2_K's) | the hmask bit << 2, 0..7, the value u − 4; 16 signed 6-bit scales."""
    off = lambda k: b.add(base, const(base.type, k))  # noqa: E731
    # scale k: low 4 bits from bytes 0-7, high 2 bits from bytes 8-11 (as _q3_k_row), unpacked as
    # ggml's three 32-bit words aux (kmask1 0x03030303, kmask2 0x0f0f0f0f), 4 scales per word
    a0, a1, a2 = (_i32_at(b, p, off(Q3K_SCALES + 4 * i)) for i in range(3))
    k1, k2 = const(I32, 0x03030303), const(I32, 0x0F0F0F0F)
    sh = lambda v, n: b.lshr(v, const(I32, n)) if n else v  # noqa: E731
    words = [b.or_(b.and_(sh(lo, 4 * (w // 2)), k2), b.shl(b.and_(sh(a2, 2 * w), k1), const(I32, 4)))
             for w, lo in enumerate((a0, a1, a0, a1))]
    v = ir.Constant(ir.VectorType(I32, 4), ir.Undefined)
    for w in range(4):
        v = b.insert_element(v, words[w], const(I32, w))
    sc = b.sub(b.bitcast(v, ir.VectorType(I8, 16)), const(ir.VectorType(I8, 16), [32] * 16))
    H = vload(b, p, off(0), V32I8, 1)
    acc = const(V16I32, [0] * 16)
    if how == "avx512vnni":  # as Q2_K's: 64 quant bytes at once, x arranged so by the caller
        Q = vload(b, p, off(Q3K_QS), V64I8, 1)
        H64 = concat_vec(b, H, H)
        zero, four = const(V64I8, [0] * 64), const(V64I8, [4] * 64)
        s16 = b.sext(sc, V16I16)
        for j in range(4):
            w = b.and_(b.lshr(Q, const(V64I8, [2 * j] * 64)) if j else Q, const(V64I8, [3] * 64))
            bit = b.icmp_unsigned("!=", b.and_(H64, const(V64I8, [1 << j] * 32 + [1 << (4 + j)] * 32)), zero)
            w = b.select(bit, b.or_(w, four), w)
            lanes = [2 * j] * 8 + [2 * j + 1] * 8 + [8 + 2 * j] * 8 + [9 + 2 * j] * 8
            acc = _madd_acc(b, acc, _maddubs(b, w, xv[j], how), b.shuffle_vector(s16, s16, const(ir.VectorType(I32, 32), lanes)), how)
    else:
        for n in range(2):
            Q = vload(b, p, off(Q3K_QS + 32 * n), V32I8, 1)
            q = [b.or_(bitfield(b, Q, 2 * j, 3), b.shl(bitfield(b, H, 4 * n + j, 1), const(V32I8, [2] * 32))) for j in range(4)]
            for h in range(2):
                u = 2 * n + h
                s16 = _spread(b, sc, [4 * u + i // 8 for i in range(32)], b.sext)
                acc = _madd_acc(b, acc, _maddubs(b, concat_vec(b, q[2 * h], q[2 * h + 1]), xv[u], how), s16, how)
    offs = _madd_wd(b, b.sext(sc, V16I16), bs, how)  # Σ sc_g·bsum_g, 8 lanes
    offs = b.shuffle_vector(offs, const(V8I32, [0] * 8), const(V16I32, list(range(16))))
    return b.sub(acc, b.shl(offs, const(V16I32, [2] * 16))), None


_KQ_ROW_INT = {"q3_k": _q3_k_row_int, "q2_k": _q2_k_row_int, "q4_k": _q4_k_row_int, "q5_k": lambda *a: _q4_k_row_int(*a, q5=True), "q6_k": _q6_k_row_int,
               "iq4_xs": _iq4_xs_row_int}


# The AVX-512 K-quant row functions' x: four <64 x i8> as (first source, second source, lanes of
# the two concatenated), from the super-block's four 64-value vectors. Q2_K/Q3_K: values
# 32j..32j+31 and 128+32j..128+32j+31 (step j); Q4_K/Q5_K: sub-blocks (0, 2), (1, 3), (4, 6),
# (5, 7); IQ4_XS: values 0-15 of sub-blocks 4h..4h+3, then their values 16-31.
KQ_X_ORDER = {
    **{f: [(j // 2, 2 + j // 2, [32 * (j % 2) + i for i in range(32)] + [64 + 32 * (j % 2) + i for i in range(32)])
           for j in range(4)] for f in ("q2_k", "q3_k")},
    **{f: [(2 * h, 2 * h + 1, [32 * part + i for i in range(32)] + [64 + 32 * part + i for i in range(32)])
           for h in range(2) for part in range(2)] for f in ("q4_k", "q5_k")},
    "iq4_xs": [(2 * h, 2 * h + 1, [32 * g + 16 * part + i for g in range(4) for i in range(16)])
               for h in range(2) for part in range(2)],
}


def _dot4_kq_int_codegen(fmt):
    row_fn = _KQ_ROW_INT[fmt]
    nbytes = KQ_BYTES[fmt]
    dpos = {"q6_k": Q6K_D, "q2_k": Q2K_D, "q3_k": Q3K_D}.get(fmt, 0)  # fp16 d (then dmin for the affine types)

    def codegen(context, builder, sig, args):
        # args: w0..w3, p0..p3 (uint8 rows), xq (int8, nsb·256), xd (d_x per block), xb (int16
        # bsums, 16 per block), nsb
        how = int_dot_features()
        ws = [array_data(context, builder, sig.args[j], args[j]) for j in range(ROWS)]
        ps = [array_data(context, builder, sig.args[ROWS + j], args[ROWS + j]) for j in range(ROWS)]
        xq, xd, xb = (array_data(context, builder, sig.args[2 * ROWS + u], args[2 * ROWS + u]) for u in range(3))
        nsb = args[2 * ROWS + 3]
        ity = nsb.type
        ST = ir.LiteralStructType([V16F] * ROWS + [V8F] * ROWS)
        init = ir.Constant(ST, [const(V16F, [0.0] * 16)] * ROWS + [const(V8F, [0.0] * 8)] * ROWS)

        def body(sb, accs):
            base = builder.mul(sb, const(ity, nbytes))
            xo = builder.mul(sb, const(ity, QK_K))
            xv = [vload(builder, xq, builder.add(xo, const(ity, 64 * u)), V64I8, 1) for u in range(4)]
            if how == "avx512vnni" and fmt in KQ_X_ORDER:  # once for the four rows, in the row
                v = ir.VectorType(I32, 64)                 # function's 64-byte steps' order
                xv = [builder.shuffle_vector(xv[a], xv[c], const(v, idx)) for a, c, idx in KQ_X_ORDER[fmt]]
            elif fmt == "iq4_xs":  # once for the four rows, to the weights' PAIR_ORDER
                xv = [builder.shuffle_vector(v, v, const(ir.VectorType(I32, 64), PAIR_ORDER)) for v in xv]
            bs = vload(builder, xb, builder.mul(sb, const(ity, QK_K // 16)), V16I16, 2)
            dx = builder.load(builder.gep(xd, [sb]))
            for r in range(ROWS):
                # the super-block at this offset of p's rows (the group AHEAD on), into L2
                # (prefetcht1; measured with AHEAD = 1), as the Q8_0
                # kernel does. Into L1 it evicted what the group still reads: Llama-3.1-8B-dims
                # files on a 2-core AMD EPYC (znver4), ÷ the same pages' fastest plain read, 12
                # alternated rounds: Q6_K 0.78/0.76 into L1, 1.08/1.05 into L2 (0.72/0.74 with no
                # prefetch); Q4_K 0.78 and 0.83
                prefetch_lines(builder, ps[r], base, (nbytes + 63) // 64, 2)
                isum, mins = row_fn(builder, ws[r], base, xv, bs, how)
                d = builder.fmul(f16_at(builder, ws[r], builder.add(base, const(ity, dpos))), dx, flags=FAST)
                v = builder.fmul(builder.sitofp(isum, V16F), splat(builder, d, 16), flags=FAST)
                accs = builder.insert_value(accs, builder.fadd(builder.extract_value(accs, r), v, flags=FAST), r)
                if mins is not None:
                    dm = builder.fmul(f16_at(builder, ws[r], builder.add(base, const(ity, dpos + 2))), dx, flags=FAST)
                    v = builder.fmul(builder.sitofp(mins, V8F), splat(builder, dm, 8), flags=FAST)
                    accs = builder.insert_value(accs, builder.fadd(builder.extract_value(accs, ROWS + r), v,
                                                                   flags=FAST), ROWS + r)
            return accs

        accs = ir_loop(builder, nsb, init, body)
        out = [builder.fsub(hsum(builder, builder.extract_value(accs, r)),
                            hsum(builder, builder.extract_value(accs, ROWS + r)), flags=FAST) for r in range(ROWS)]
        return context.make_tuple(builder, sig.return_type, out)

    return codegen


def _dot4_kq_int(fmt):
    gen = _dot4_kq_int_codegen(fmt)

    def typer(typingctx, w0, w1, w2, w3, p0, p1, p2, p3, xq, xd, xb, nsb):
        return types.UniTuple(types.float32, ROWS)(w0, w1, w2, w3, p0, p1, p2, p3, xq, xd, xb, nsb), gen

    typer.__name__ = f"dot4i_{fmt}"
    return intrinsic(typer)


# four rows of a KQ_INT type (raw super-block bytes) · a Q8_K-quantized x (quants, d_x, bsums)
dot4i_q4_k, dot4i_q5_k, dot4i_q6_k = _dot4_kq_int("q4_k"), _dot4_kq_int("q5_k"), _dot4_kq_int("q6_k")
dot4i_iq4_xs, dot4i_q2_k, dot4i_q3_k = _dot4_kq_int("iq4_xs"), _dot4_kq_int("q2_k"), _dot4_kq_int("q3_k")


KQ_INT_KIND = {fmt: i for i, fmt in enumerate(KQ_INT)}  # the run-time ``kind`` of mm_kq_int8


# (runtime.decode_block calls it from inside its own compiled function too)
@njit(parallel=True, fastmath=True, cache=True)
def mm_kq_int8(W, xq, xd, xb, rows, Y, kind):  # W (n, k/QK_K · block bytes) uint8; x as Q8_K
    T = xq.shape[0]
    nsb = xd.shape[1]
    n = row_count(rows, W)
    for g in prange((n + 3) // 4):
        i0, i1, i2, i3 = group4(rows, n, g)
        n0, n1, n2, n3 = group4(rows, n, g + AHEAD)
        for t in range(T):
            if kind == 0:
                y = dot4i_q4_k(W[i0], W[i1], W[i2], W[i3], W[n0], W[n1], W[n2], W[n3], xq[t], xd[t], xb[t], nsb)
            elif kind == 1:
                y = dot4i_q5_k(W[i0], W[i1], W[i2], W[i3], W[n0], W[n1], W[n2], W[n3], xq[t], xd[t], xb[t], nsb)
            elif kind == 3:
                y = dot4i_iq4_xs(W[i0], W[i1], W[i2], W[i3], W[n0], W[n1], W[n2], W[n3], xq[t], xd[t], xb[t], nsb)
            elif kind == 4:
                y = dot4i_q2_k(W[i0], W[i1], W[i2], W[i3], W[n0], W[n1], W[n2], W[n3], xq[t], xd[t], xb[t], nsb)
            elif kind == 5:
                y = dot4i_q3_k(W[i0], W[i1], W[i2], W[i3], W[n0], W[n1], W[n2], W[n3], xq[t], xd[t], xb[t], nsb)
            else:
                y = dot4i_q6_k(W[i0], W[i1], W[i2], W[i3], W[n0], W[n1], W[n2], W[n3], xq[t], xd[t], xb[t], nsb)
            store_group(Y, t, rows, n, 4 * g, 1, y)
