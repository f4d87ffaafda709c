"""The operands of runtime.kernels.blocks32_int's integer block dot products: the 32-value
blocks' quant bytes and fp16 scales, and the int8 activations, brought into vectors. Two blocks
per 64-byte vector (``pair_quants``, in PAIR_ORDER or in the values' order), four per pair of
vectors with AVX-512 (``quad_quants``, ``quad_x``), a chunk's fp16 scales by word permutes
(``strided_words``), and IQ4_NL's table values by vpshufb (``lookup16_pshufb``).
"""

from __future__ import annotations

from llvmlite import ir

from runtime.kernels.blocks32 import B32_BYTES, B32_QS, KVALUES_IQ4NL, QK, b32_quants, lookup16
from runtime.kernels.ir_helpers import (
    I8,
    I16,
    I32,
    V32I8,
    V64I8,
    compile_features,
    concat_vec,
    const,
    declare,
    split_vec,
    vload,
)

# The 4/5-bit types' pair order: both blocks' low nibbles (values 0-15 of block a, then of b),
# then both high nibbles (values 16-31): two 16-byte loads, one AND and one shift on 32 bytes.
PAIR_ORDER = list(range(16)) + list(range(32, 48)) + list(range(16, 32)) + list(range(48, 64))


def lookup16_pshufb(b, n, how):
    """kvalues_iq4nl[n] for a <64 x i8> of nibbles: vpshufb on the 16-entry table (AVX-512BW
    zmm or two AVX2 ymm), the select tree elsewhere."""
    if how == "avx512vnni":
        fn = declare(b, "llvm.x86.avx512.pshuf.b.512", V64I8, [V64I8, V64I8])
        return b.call(fn, [const(V64I8, list(KVALUES_IQ4NL) * 4), n])
    if how in ("avxvnni", "avx2"):
        fn = declare(b, "llvm.x86.avx2.pshuf.b", V32I8, [V32I8, V32I8])
        t = const(V32I8, list(KVALUES_IQ4NL) * 2)
        return concat_vec(b, b.call(fn, [t, split_vec(b, n, 0, 32)]), b.call(fn, [t, split_vec(b, n, 32, 32)]))
    return concat_vec(b, lookup16(b, split_vec(b, n, 0, 32)), lookup16(b, split_vec(b, n, 32, 32)))


def pair_quants(b, fmt, p, base, how, natural=False):
    """<64 x i8>: blocks a (at ``base``) and b (the next) as the integer dot's first operand:
    Q8_0 in natural order (a's 32 then b's 32), the 4/5-bit types in PAIR_ORDER (``natural``:
    in natural order too) without their offset (unsigned nibbles, IQ4_NL's table values signed)."""
    ty = base.type
    nb = B32_BYTES[fmt]
    if fmt == "q8_0":
        return concat_vec(b, b32_quants(b, fmt, p, base), b32_quants(b, fmt, p, b.add(base, const(ty, nb))))
    if natural:  # each block's low nibbles then its high ones: values 0-31 of a, then of b
        V16I8 = ir.VectorType(I8, 16)
        qs = [vload(b, p, b.add(base, const(ty, B32_QS[fmt] + nb * h)), V16I8, 1) for h in (0, 1)]
        packed = concat_vec(b, qs[0], qs[1])  # one AND and one shift on both blocks, one 128-bit shuffle
        lo, hi = b.and_(packed, const(V32I8, [15] * 32)), b.lshr(packed, const(V32I8, [4] * 32))
        n = b.shuffle_vector(lo, hi, const(ir.VectorType(I32, 64), list(range(16)) + list(range(32, 48))
                                        + list(range(16, 32)) + list(range(48, 64))))
        if fmt == "iq4_nl":
            return lookup16_pshufb(b, n, how)
        if fmt in ("q5_0", "q5_1"):  # the fifth bits: qh of a then of b, one 64-lane mask
            I64 = ir.IntType(64)
            qh = [b.zext(b.load(b.bitcast(b.gep(p, [b.add(base, const(ty, B32_QS[fmt] - 4 + nb * h))]), I32.as_pointer()),
                                align=1), I64) for h in (0, 1)]
            mask = b.bitcast(b.or_(qh[0], b.shl(qh[1], const(I64, 32))), ir.VectorType(ir.IntType(1), 64))
            n = b.or_(n, b.select(mask, const(V64I8, [16] * 64), const(V64I8, [0] * 64)))
        return n
    V16I8 = ir.VectorType(I8, 16)
    qs = [vload(b, p, b.add(base, const(ty, B32_QS[fmt] + nb * h)), V16I8, 1) for h in (0, 1)]
    packed = concat_vec(b, qs[0], qs[1])
    n = concat_vec(b, b.and_(packed, const(V32I8, [15] * 32)), b.lshr(packed, const(V32I8, [4] * 32)))
    if fmt == "iq4_nl":
        return lookup16_pshufb(b, n, how)
    if fmt in ("q5_0", "q5_1"):  # the fifth bits: both qh words as one 64-lane mask in PAIR_ORDER
        I64 = ir.IntType(64)
        qh = [b.zext(b.load(b.bitcast(b.gep(p, [b.add(base, const(ty, B32_QS[fmt] - 4 + nb * h))]), I32.as_pointer()),
                            align=1), I64) for h in (0, 1)]
        lo16 = const(I64, 0xFFFF)
        m = b.or_(b.or_(b.and_(qh[0], lo16), b.shl(b.and_(qh[1], lo16), const(I64, 16))),
                  b.or_(b.shl(b.lshr(qh[0], const(I64, 16)), const(I64, 32)), b.shl(b.lshr(qh[1], const(I64, 16)), const(I64, 48))))
        mask = b.bitcast(m, ir.VectorType(ir.IntType(1), 64))  # lane l = bit l (kmovq + masked move)
        n = b.or_(n, b.select(mask, const(V64I8, [16] * 64), const(V64I8, [0] * 64)))
    return n


# Blocks up to this many bytes gather their chunk's scales with strided_words, not one scalar
# load and one vpinsrw per block and row: faster for Q4_0, Q4_1 and Q5_0 (18 to 22 bytes), no
# slower for IQ4_NL; Q5_1 (24) and Q8_0 (34: four words per permute, two loads each) were not
# faster with it and keep the inserts (docs/benchmarks.md, "Measurements behind code choices").
STRIDED_WORDS_MAX = 22


def strided_words(b, p, base, stride, n):
    """<n x i16>: the 16-bit words at byte offsets base + u·stride (u < n) of uint8 row p, e.g.
    the fp16 scales of n consecutive blocks. Groups of G blocks whose words lie within 128 bytes
    each come from two 64-byte loads and one two-source word permute (AVX-512BW vpermt2w), the
    second load ending at the group's last word, so nothing past the blocks is read."""
    V32H = ir.VectorType(I16, 32)
    g = 8 if 7 * stride + 2 <= 128 else 4
    assert stride % 2 == 0 and 3 * stride + 2 <= 128 and n % g == 0
    last = (g - 1) * stride + 2  # bytes a group spans
    off2 = max(0, last - 64)  # the second load's start, relative to the group's
    ty = base.type
    groups = []
    for q in range(n // g):
        start = b.add(base, const(ty, q * g * stride))
        lo = vload(b, p, start, V32H, 1)
        hi = vload(b, p, b.add(start, const(ty, off2)), V32H, 1) if last > 64 else lo
        idx = []
        for u in range(g):
            o = u * stride
            idx.append(o // 2 if o + 2 <= 64 else 32 + (o - off2) // 2)
            assert o + 2 <= 64 or 0 <= o - off2 <= 62
        groups.append(b.shuffle_vector(lo, hi, const(ir.VectorType(I32, g), idx)))
    while len(groups) > 1:  # concatenate the groups' words in block order
        groups = [b.shuffle_vector(groups[i], groups[i + 1], const(ir.VectorType(I32, 2 * groups[i].type.count),
                                                                 list(range(2 * groups[i].type.count))))
                  for i in range(0, len(groups), 2)]
    return groups[0]


# How quad_quants gathers a quad's quant bytes: two 64-byte loads and one vpermt2b, or (the
# types listed here, for which they measured faster) four 16-byte loads and inserts
# (docs/benchmarks.md, "Measurements behind code choices").
QUAD_INSERT = {"q5_0", "q5_1"}


def quad_quants(b, fmt, p, base):
    """(lo, hi), two <64 x i8>: lane 16q+i of lo is value i of block q (q < 4, the blocks at
    ``base`` and the three after it) and of hi its value 16+i, unsigned without the offset (the
    4/5-bit types) or IQ4_NL's signed table values. The four blocks' 64 quant bytes come from
    two 64-byte loads within the quad's bytes and one two-source byte permute (AVX-512 VBMI
    vpermt2b), or from four 16-byte loads (QUAD_INSERT); one AND gives the low nibbles and one
    shift the high ones."""
    nb, qs = B32_BYTES[fmt], B32_QS[fmt]
    ty = base.type
    span = 4 * nb
    if fmt not in QUAD_INSERT and "avx512vbmi" in compile_features():  # else LLVM's byte shuffles
        lo_ld = vload(b, p, base, V64I8, 1)
        off2 = span - 64
        hi_ld = vload(b, p, b.add(base, const(ty, off2)), V64I8, 1)
        idx = []
        for q in range(4):
            for i in range(16):
                o = q * nb + qs + i
                idx.append(o if o < 64 else 64 + o - off2)
        packed = b.shuffle_vector(lo_ld, hi_ld, const(ir.VectorType(I32, 64), idx))
    else:
        V16I8 = ir.VectorType(I8, 16)
        parts = [vload(b, p, b.add(base, const(ty, q * nb + qs)), V16I8, 1) for q in range(4)]
        packed = concat_vec(b, concat_vec(b, parts[0], parts[1]), concat_vec(b, parts[2], parts[3]))
    lo = b.and_(packed, const(V64I8, [15] * 64))
    hi = b.lshr(packed, const(V64I8, [4] * 64))
    if fmt == "iq4_nl":
        return lookup16_pshufb(b, lo, "avx512vnni"), lookup16_pshufb(b, hi, "avx512vnni")
    if fmt in ("q5_0", "q5_1"):  # the fifth bits: qh bit i of block q to lane 16q+i (lo), 16+i (hi)
        I64 = ir.IntType(64)
        qh = [b.zext(b.load(b.bitcast(b.gep(p, [b.add(base, const(ty, qs - 4 + nb * q))]), I32.as_pointer()),
                            align=1), I64) for q in range(4)]
        lo16 = const(I64, 0xFFFF)
        mlo = mhi = None
        for q in range(4):
            a = b.shl(b.and_(qh[q], lo16), const(I64, 16 * q))
            c = b.shl(b.lshr(qh[q], const(I64, 16)), const(I64, 16 * q))
            mlo = a if mlo is None else b.or_(mlo, a)
            mhi = c if mhi is None else b.or_(mhi, c)
        V1 = ir.VectorType(ir.IntType(1), 64)
        s16, z = const(V64I8, [16] * 64), const(V64I8, [0] * 64)
        lo = b.or_(lo, b.select(b.bitcast(mlo, V1), s16, z))
        hi = b.or_(hi, b.select(b.bitcast(mhi, V1), s16, z))
    return lo, hi


def quad_x(b, xq, blk, ity):
    """(x_lo, x_hi) for the quad of blocks from ``blk``: values 0-15 and 16-31 of each of the four
    blocks, in quad_quants' lane order (16-byte granules: vshufi64x2)."""
    x0 = vload(b, xq, b.mul(blk, const(ity, QK)), V64I8, 1)
    x1 = vload(b, xq, b.mul(b.add(blk, const(ity, 2)), const(ity, QK)), V64I8, 1)
    lo = [16 * g + i for g in (0, 2, 4, 6) for i in range(16)]
    hi = [16 * g + i for g in (1, 3, 5, 7) for i in range(16)]
    v = ir.VectorType(I32, 64)
    return b.shuffle_vector(x0, x1, const(v, lo)), b.shuffle_vector(x0, x1, const(v, hi))
