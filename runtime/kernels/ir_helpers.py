"""The LLVM IR helpers every kernel family builds its SIMD intrinsics from: the vector types,
loads, stores, splats, horizontal sums, prefetches, phi loops (``ir_loop``), a block's fp16 and
byte fields, and the integer dot products chosen from the CPU features numba compiles for
(``int_dot_features``, ``idot_u8s8``).

An intrinsic (``@intrinsic``, in the family modules) is usable only inside @njit code, inlined
there. Its arguments are 1-D C-contiguous arrays (row views) plus counts; the kernels calling
it guarantee the lengths.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

F32 = ir.FloatType()
HALF = ir.HalfType()
I8, I16, I32 = ir.IntType(8), ir.IntType(16), ir.IntType(32)
V32F = ir.VectorType(F32, 32)
V16F, V8F = ir.VectorType(F32, 16), ir.VectorType(F32, 8)
V64I8, V32I8 = ir.VectorType(I8, 64), ir.VectorType(I8, 32)
V32I16, V16I16 = ir.VectorType(I16, 32), ir.VectorType(I16, 16)
V16I32, V8I32 = ir.VectorType(I32, 16), ir.VectorType(I32, 8)
FAST = ("fast",)
ROWS = 4  # weight rows per call of the *4 intrinsics


# --- IR helpers -------------------------------------------------------------------------
@intrinsic
def fma32(typingctx, a, b, c):
    """a·b + c rounded once (llvm.fma.f32): the _mm512_fmadd_ps lane ggml relies on (a scalar
    intrinsic for plain numba code: runtime.ggml_ops, runtime.kernels.ggml_order)."""
    sig = types.float32(a, b, c)

    def codegen(context, builder, signature, args):
        f = ir.FloatType()
        fn = builder.module.declare_intrinsic("llvm.fma", [f], ir.FunctionType(f, [f, f, f]))
        vals = [context.cast(builder, v, t, types.float32) for v, t in zip(args, signature.args)]
        return builder.call(fn, vals)

    return sig, codegen


def const(ty, v):
    return ir.Constant(ty, v)


def vload(b, ptr, idx, vt, align):
    return b.load(b.bitcast(b.gep(ptr, [idx]), vt.as_pointer()), align=align)


def vstore(b, val, ptr, idx, align):
    b.store(val, b.bitcast(b.gep(ptr, [idx]), val.type.as_pointer()), align=align)


def splat_lane(b, vec, lane, n):
    """<n x float> filled with vec[lane]."""
    return b.shuffle_vector(vec, ir.Constant(vec.type, ir.Undefined), const(ir.VectorType(I32, n), [lane] * n))


def splat(b, s, n):
    vt = ir.VectorType(s.type, n)
    v = b.insert_element(ir.Constant(vt, ir.Undefined), s, const(I32, 0))
    return splat_lane(b, v, 0, n)


def hsum(b, v):
    n = v.type.count
    while n > 1:
        h = n // 2
        lo = b.shuffle_vector(v, v, const(ir.VectorType(I32, h), list(range(h))))
        hi = b.shuffle_vector(v, v, const(ir.VectorType(I32, h), list(range(h, n))))
        v = b.fadd(lo, hi, flags=FAST)
        n = h
    return b.extract_element(v, const(I32, 0))


def prefetch_line(b, ptr, locality=3):  # 3: into L1 (prefetcht0); 2: into L2 (prefetcht1)
    mod = b.module
    p8 = I8.as_pointer()
    fn = mod.globals.get("llvm.prefetch.p0i8")
    if fn is None:
        fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [p8, I32, I32, I32]), "llvm.prefetch.p0i8")
    b.call(fn, [b.bitcast(ptr, p8), const(I32, 0), const(I32, locality), const(I32, 1)])  # read, locality, data


def prefetch_lines(b, ptr, idx, lines, locality=3):
    """Prefetch ``lines`` consecutive 64-byte lines starting at ptr[idx]."""
    p8 = b.bitcast(b.gep(ptr, [idx]), I8.as_pointer())
    for u in range(lines):
        prefetch_line(b, b.gep(p8, [const(I32, 64 * u)]), locality)


def ir_loop(b, n, init, body, start=None):
    """``for i in range(start, n): acc = body(i, acc)`` as a phi loop; returns the final acc.

    ``init`` may be any first-class value (a struct of vectors for several accumulators).
    """
    start = const(n.type, 0) if start is None else start
    entry = b.basic_block
    loop = b.append_basic_block("simd.loop")
    done = b.append_basic_block("simd.done")
    b.cbranch(b.icmp_signed("<", start, n), loop, done)
    b.position_at_end(loop)
    i = b.phi(n.type)
    acc = b.phi(init.type)
    new = body(i, acc)
    i2 = b.add(i, const(n.type, 1))
    tail = b.basic_block
    i.add_incoming(start, entry)
    i.add_incoming(i2, tail)
    acc.add_incoming(init, entry)
    acc.add_incoming(new, tail)
    b.cbranch(b.icmp_signed("<", i2, n), loop, done)
    b.position_at_end(done)
    out = b.phi(init.type)
    out.add_incoming(init, entry)
    out.add_incoming(new, tail)
    return out


def array_data(context, builder, ty, val):
    return context.make_array(ty)(context, builder, val).data


def zeros_struct(k):
    z = const(V32F, [0.0] * 32)
    return ir.Constant(ir.LiteralStructType([V32F] * k), [z] * k)


def accumulate(b, accs, j, val):
    return b.insert_value(accs, b.fadd(b.extract_value(accs, j), val, flags=FAST), j)


# --- a block's fields, by byte offset into a uint8 row -----------------------------------------
def u8_at(b, p, idx):
    return b.zext(b.load(b.gep(p, [idx])), I32)


def f16_at(b, p, idx):  # a little-endian fp16 at byte offset idx of a uint8 row
    bits = b.load(b.bitcast(b.gep(p, [idx]), I16.as_pointer()), align=1)
    return b.fpext(b.bitcast(bits, HALF), F32)


def splat_halves(b, lo, hi):
    """<32 x float>: lanes 0-15 = lo, lanes 16-31 = hi (a scale per 16 values)."""
    v2 = ir.VectorType(F32, 2)
    v = b.insert_element(b.insert_element(ir.Constant(v2, ir.Undefined), lo, const(I32, 0)), hi, const(I32, 1))
    return b.shuffle_vector(v, ir.Constant(v2, ir.Undefined), const(ir.VectorType(I32, 32), [0] * 16 + [1] * 16))


def bitfield(b, v, shift, mask):  # (v >> shift) & mask on <32 x i8>, logical shift
    if shift:
        v = b.lshr(v, const(V32I8, [shift] * 32))
    return b.and_(v, const(V32I8, [mask] * 32)) if mask is not None else v


# --- integer dot products of bytes, by the CPU's features ---------------------------------------
# LLVM does not form vpdpbusd from plain IR (measured: <32 x i8> sext/mul/add patterns compiled
# to vpmullw + vphaddw + vpmovsxwd, slower than the float path), so the instruction is chosen
# from the CPU's features when numba compiles (numba compiles and caches for the host CPU):
# AVX-512 VNNI: llvm.x86.avx512.vpdpbusd.512 (one zmm per block pair); AVX-VNNI: two
# vpdpbusd.256; AVX2: pmaddubsw + pmaddwd by ones (llama.cpp's mul_sum_us8_pairs); anything
# else: portable widen-multiply-add IR. On this project's Xeon (Emerald Rapids, AVX-512 VNNI,
# LLVM 22 of llvmlite 0.50) the pair step per row compiles to: Q4_0 vmovdqu + vinserti128 (both
# blocks' 16 bytes) + vpand + vgf2p8affineqb (the >> 4) + vinserti64x4 + vpdpbusd zmm + vpermd
# (the pair's scales) + vcvtdq2ps + vfmadd213ps; Q8_0 a vpxorq (q_w+128) and one vpdpbusd in place
# of the nibble unpacking; Q5 adds kmovq + a masked vmovdqu8 (numba's inspect_asm; the check is
# tests/runtime/test_kernels_int.py::test_int_kernel_emits_integer_dot).


def compile_features() -> set[str]:
    """The CPU features numba compiles for: the host's, or those NUMBA_CPU_FEATURES names."""
    from llvmlite import binding
    from numba.core import config

    if config.CPU_FEATURES is not None:  # as numba's codegen: these replace the host's features
        return {f.strip()[1:] for f in config.CPU_FEATURES.split(",") if f.strip().startswith("+")}
    return {k for k, v in binding.get_host_cpu_features().items() if v}


def int_dot_features() -> str:
    """The integer dot the int8 kernels are built with here: "avx512vnni", "avxvnni", "avx2" or
    "generic", from the features numba compiles for (the host's, or NUMBA_CPU_FEATURES)."""
    feats = compile_features()
    if {"avx512vnni", "avx512bw"} <= feats:
        return "avx512vnni"
    if "avxvnni" in feats:
        return "avxvnni"
    return "avx2" if "avx2" in feats else "generic"


def declare(b, name, ret, args):
    fn = b.module.globals.get(name)
    return fn if fn is not None else ir.Function(b.module, ir.FunctionType(ret, args), name)


def split_vec(b, v, lo, n):
    return b.shuffle_vector(v, v, const(ir.VectorType(I32, n), list(range(lo, lo + n))))


def concat_vec(b, x, y):
    n = x.type.count
    return b.shuffle_vector(x, y, const(ir.VectorType(I32, 2 * n), list(range(2 * n))))


def idot_u8s8(b, u, s, how, acc=None):
    """<16 x i32>: lane l = acc[l] + Σ_{i<4} u[4l+i]·s[4l+i] for <64 x i8> u (unsigned) and s
    (signed); acc (<16 x i32>) only with the VNNI ``how``s, whose vpdpbusd adds into it."""
    V8I32 = ir.VectorType(I32, 8)
    if how == "avx512vnni":
        fn = declare(b, "llvm.x86.avx512.vpdpbusd.512", V16I32, [V16I32] * 3)
        return b.call(fn, [const(V16I32, [0] * 16) if acc is None else acc, b.bitcast(u, V16I32), b.bitcast(s, V16I32)])
    assert acc is None or how == "avxvnni"
    halves = []
    for h in (0, 32):
        uh, sh = split_vec(b, u, h, 32), split_vec(b, s, h, 32)
        if how == "avxvnni":
            fn = declare(b, "llvm.x86.avx512.vpdpbusd.256", V8I32, [V8I32] * 3)
            start = const(V8I32, [0] * 8) if acc is None else split_vec(b, acc, h // 4, 8)
            halves.append(b.call(fn, [start, b.bitcast(uh, V8I32), b.bitcast(sh, V8I32)]))
        elif how == "avx2":
            V16I16 = ir.VectorType(I16, 16)
            p16 = b.call(declare(b, "llvm.x86.avx2.pmadd.ub.sw", V16I16, [V32I8, V32I8]), [uh, sh])
            halves.append(b.call(declare(b, "llvm.x86.avx2.pmadd.wd", V8I32, [V16I16, V16I16]),
                                 [p16, const(V16I16, [1] * 16)]))
        else:
            V32I32 = ir.VectorType(I32, 32)
            prod = b.mul(b.zext(uh, V32I32), b.sext(sh, V32I32))
            parts = [b.shuffle_vector(prod, prod, const(V8I32, list(range(i, 32, 4)))) for i in range(4)]
            halves.append(b.add(b.add(parts[0], parts[1]), b.add(parts[2], parts[3])))
    return concat_vec(b, halves[0], halves[1])


def zeros_f32(k, lanes=16):  # a struct of k zero <lanes x float>
    vt = ir.VectorType(F32, lanes)
    z = const(vt, [0.0] * lanes)
    return ir.Constant(ir.LiteralStructType([vt] * k), [z] * k)
