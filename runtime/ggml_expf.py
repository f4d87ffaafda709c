"""ggml_v_expf, llama.cpp's vectorized exp, and what the int8 arithmetic runs on it, rounded as
ggml rounds them (runtime.ggml_ops says why that matters): ``v_expf`` (one lane, for compiled
loops), ``exp_shift16`` (16 lanes in IR: the many-query softmax's exponentials) and ``silu_mul``
(ggml_vec_swiglu_f32: x/(1 + ggml_v_expf(−x))·g on 16-value chunks, the tail with glibc expf).
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from runtime.kernels.ir_helpers import fma32

F32 = np.float32


# ggml_v_expf (AVX-512): constants as ggml writes them in hexadecimal
_R = F32(float.fromhex("0x1.8p23"))
_LOG2E = F32(float.fromhex("0x1.715476p+0"))
_LN2_HI = F32(float.fromhex("0x1.62e4p-1"))
_LN2_LO = F32(float.fromhex("0x1.7f7d1cp-20"))
_P5, _P4 = F32(float.fromhex("0x1.0e4020p-7")), F32(float.fromhex("0x1.573e2ep-5"))
_P3, _P2 = F32(float.fromhex("0x1.555e66p-3")), F32(float.fromhex("0x1.fffdb6p-2"))
_P1, _ONE = F32(float.fromhex("0x1.ffffecp-1")), F32(1.0)


@njit(inline="always")
def v_expf(x):
    """exp(x) for a float32 x as one lane of ggml_v_expf."""
    z = fma32(x, _LOG2E, _R)
    n = z - _R
    if abs(n) > 192:  # ggml's out-of-range lanes: 0 below, inf above (-inf in: 0 out)
        return F32(0.0) if n <= 0 else F32(np.inf)
    b = fma32(-n, _LN2_LO, fma32(-n, _LN2_HI, x))
    u = b * b
    j = fma32(fma32(fma32(_P5, b, _P4), u, fma32(_P3, b, _P2)), u, fma32(_P1, b, _ONE))
    return F32(math.ldexp(np.float64(j), int(n)))  # _mm512_scalef_ps: j·2^n, rounded once


def _v_expf16(builder, x):
    """ggml_v_expf on a <16 x float> in LLVM IR, lane for lane ``v_expf``: strict float ops, the
    FMAs as llvm.fma, _mm512_scalef_ps as a float64 product by 2^n built from its bits (exact;
    |n| <= 192 there) rounded once to float32, out-of-range lanes selected to 0 or inf."""
    f = ir.FloatType()
    v16, d16 = ir.VectorType(f, 16), ir.VectorType(ir.DoubleType(), 16)
    i64v = ir.VectorType(ir.IntType(64), 16)
    mod = builder.module
    fma = mod.globals.get("llvm.fma.v16f32") or ir.Function(mod, ir.FunctionType(v16, [v16] * 3), "llvm.fma.v16f32")

    def c(val):
        return ir.Constant(v16, [float(val)] * 16)

    def F(a, b, d):
        return builder.call(fma, [a, b, d])

    n = builder.fsub(F(x, c(_LOG2E), c(_R)), c(_R))
    neg = builder.fneg(n)
    b = F(neg, c(_LN2_LO), F(neg, c(_LN2_HI), x))
    u = builder.fmul(b, b)
    j = F(F(F(c(_P5), b, c(_P4)), u, F(c(_P3), b, c(_P2))), u, F(c(_P1), b, c(_ONE)))
    lo, hi = builder.fcmp_ordered("<", n, c(-192.0)), builder.fcmp_ordered(">", n, c(192.0))
    ni = builder.fptosi(builder.select(lo, c(-192.0), builder.select(hi, c(192.0), n)), i64v)
    two_n = builder.bitcast(builder.shl(builder.add(ni, ir.Constant(i64v, [1023] * 16)), ir.Constant(i64v, [52] * 16)), d16)
    r = builder.fptrunc(builder.fmul(builder.fpext(j, d16), two_n), v16)
    return builder.select(lo, c(0.0), builder.select(hi, c(np.inf), r))


@intrinsic
def _swiglu16(typingctx, x, g, out):
    """out[:m] = x/(1 + ggml_v_expf(−x))·g for m = len(x) // 16 · 16, 16 lanes at a time, in
    ggml_vec_swiglu_f32's order. Written in IR: numba's scalar loop over ``v_expf`` did not
    vectorize (the same bits, an order of magnitude slower: docs/benchmarks.md, "Measurements
    behind code choices")."""
    sig = types.void(x, g, out)

    def codegen(context, builder, signature, args):
        from runtime.kernels import array_data, ir_loop

        v16 = ir.VectorType(ir.FloatType(), 16)
        px, pg, po = (array_data(context, builder, signature.args[k], args[k]) for k in range(3))
        n = builder.extract_value(context.make_array(signature.args[0])(context, builder, args[0]).shape, 0)
        ity = n.type

        def at(p, i):
            return builder.bitcast(builder.gep(p, [builder.mul(i, ir.Constant(ity, 16))]), v16.as_pointer())

        def body(i, carry):
            xv = builder.load(at(px, i), align=4)
            e = _v_expf16(builder, builder.fneg(xv))
            silu = builder.fdiv(xv, builder.fadd(ir.Constant(v16, [1.0] * 16), e))
            builder.store(builder.fmul(silu, builder.load(at(pg, i), align=4)), at(po, i), align=4)
            return carry

        ir_loop(builder, builder.sdiv(n, ir.Constant(ity, 16)), ir.Constant(ir.IntType(8), 0), body)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def exp_shift16(typingctx, row, top):
    """row[:m] = ggml_v_expf(row[:m] − top) in place, m = len(row) // 16 · 16, 16 lanes at a time
    (``_v_expf16``): the many-query softmax's exponentials (runtime.attention_gemm), slow as
    numba's scalar expf calls. ``row`` must be contiguous."""
    sig = types.void(row, top)

    def codegen(context, builder, signature, args):
        from runtime.kernels import array_data, ir_loop
        from runtime.kernels.ir_helpers import splat

        v16 = ir.VectorType(ir.FloatType(), 16)
        p = array_data(context, builder, signature.args[0], args[0])
        n = builder.extract_value(context.make_array(signature.args[0])(context, builder, args[0]).shape, 0)
        ity = n.type
        tv = splat(builder, args[1], 16)

        def body(i, carry):
            ptr = builder.bitcast(builder.gep(p, [builder.mul(i, ir.Constant(ity, 16))]), v16.as_pointer())
            builder.store(_v_expf16(builder, builder.fsub(builder.load(ptr, align=4), tv)), ptr, align=4)
            return carry

        ir_loop(builder, builder.sdiv(n, ir.Constant(ity, 16)), ir.Constant(ir.IntType(8), 0), body)
        return context.get_dummy_value()

    return sig, codegen


@njit(cache=True)
def _silu_mul(x, g):  # x, g (T, n) f32
    T, n = x.shape
    out = np.empty((T, n), F32)
    n16 = n // 16 * 16
    for t in range(T):
        _swiglu16(x[t], g[t], out[t])
        for j in range(n16, n):
            v = x[t, j]
            out[t, j] = (v / (F32(1.0) + F32(math.exp(-v)))) * g[t, j]  # float32 in: expf
    return out


silu_mul_rows = _silu_mul  # the compiled function, for compiled callers (runtime.decode_block)


@njit(cache=True)
def _silu_mul_lanes(x, g):  # _silu_mul through the scalar ``v_expf`` lane (tests)
    T, n = x.shape
    out = np.empty((T, n), F32)
    for t in range(T):
        for j in range(n // 16 * 16):
            v = x[t, j]
            out[t, j] = (v / (F32(1.0) + v_expf(-v))) * g[t, j]
    return out


def silu_mul(x: np.ndarray, g: np.ndarray) -> np.ndarray:
    """silu(x)·g as ggml_vec_swiglu_f32 (g = ones gives ggml's plain SiLU on 16-value chunks)."""
    return _silu_mul(np.ascontiguousarray(x, F32), np.ascontiguousarray(g, F32))


@njit(cache=True)
def expf_lane(x):
    """``v_expf`` callable from Python (tests): one float32 in, its ggml_v_expf lane out."""
    return v_expf(x)
