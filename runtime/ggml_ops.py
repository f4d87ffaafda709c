"""The int8 arithmetic's small operations, rounded as llama.cpp's CPU backend rounds them.

Why this exists: the int8 path re-quantizes every activation vector to 8-bit blocks before each
matmul, so a float32 difference of one ulp anywhere upstream flips a quant now and then, and
one flipped quant moves the logits by ~0.5 % of the largest. With our float64 norms, RoPE and
attention (runtime/ops.py, the float path's, closer to the exact values), llama.cpp's logits and
ours were bit-identical for the first 7 positions of a window and parted from the 8th on: a
LayerNorm ulp flipped a V quant there (found by dumping llama.cpp's intermediate tensors through
its eval callback). Each function below reproduces, bit for bit, what ggml computes on an
AVX-512 build (the one llama-cpp-python compiles on this machine), checked against those dumps:

- ``layer_norm``: ggml_norm (mean from a float64 sum rounded to float32; variance from 16-lane
  float32 squares reduced in _mm512_reduce_add_ps order, summed in float64), then the weight
  multiply and the bias add, each rounded to float32;
- ``rms_norm``: ggml_rms_norm(+mul): float32 squares summed in float64, x·scale·w in float32;
- ``rope``: ggml_rope's per-position cache (float32 θ stepped by powf(base, −2/n), glibc cosf and
  sinf, optional frequency divisors) and the rotation as the compiler emits it, with fused
  multiply-adds: x0·c − x1·s = fma(x0, c, −(x1·s)), x0·s + x1·c = fma(x0, s, x1·c);
- ``attention``: q·k as ggml_vec_dot_f32 (64-value FMA steps in four 16-lane accumulators, then
  the remainder added in float32 products, not fused); Gemma 2's cap as ggml_scale, tanhf,
  ggml_scale; softmax as ggml_soft_max_ext (×scale in
  float32, ggml_v_expf's polynomial, 16-value chunks summed in float64, ×float32(1/sum));
  p·V as llamafile's tinyBLAS (one 16-lane FMA accumulator per output, reduced in
  _mm512_reduce_add_ps order);
- ``silu_mul``: ggml_vec_swiglu_f32: x/(1 + ggml_v_expf(−x))·g on 16-value chunks, the tail with
  glibc expf.

The float path keeps runtime/ops.py. A CPU without AVX-512 runs the same arithmetic (llama.cpp's
AVX2 build sums in 8-lane order there; the difference is a rounding, as before this module).
Hand-written because no library reproduces ggml's rounding order.

ggml_v_expf and what runs on it (``v_expf``, ``exp_shift16``, ``silu_mul``) are runtime.ggml_expf,
imported here too.
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from runtime.ggml_expf import exp_shift16, expf_lane, silu_mul, silu_mul_rows, v_expf  # noqa: F401  (this module's API)
from runtime.kernels.ir_helpers import fma32

F32 = np.float32


@intrinsic
def vec_dot_f32(typingctx, x, y):
    """ggml_vec_dot_f32 (AVX-512) of two 1-D float32 arrays of equal length, in its order: four
    16-lane FMA accumulators over 64-value steps, reduced (a0 + a2) + (a1 + a3) and then as
    _mm512_reduce_add_ps, the remaining n % 64 products added one by one (not fused). Written
    in LLVM IR (strict float ops, no fast-math) so the order is pinned and the steps vectorize
    (numba loops over a scratch array were several times slower)."""
    sig = types.float32(x, y)

    def codegen(context, builder, signature, args):
        from runtime.kernels import array_data, ir_loop

        v16 = ir.VectorType(ir.FloatType(), 16)
        i32 = ir.IntType(32)
        mod = builder.module
        fma = mod.globals.get("llvm.fma.v16f32") or ir.Function(mod, ir.FunctionType(v16, [v16] * 3), "llvm.fma.v16f32")
        xa = context.make_array(signature.args[0])(context, builder, args[0])
        px, py = (array_data(context, builder, signature.args[k], args[k]) for k in range(2))
        n = builder.extract_value(xa.shape, 0)
        ity = n.type
        steps = builder.sdiv(n, ir.Constant(ity, 64))
        zero = ir.Constant(v16, [0.0] * 16)
        acc0 = ir.Constant(ir.LiteralStructType([v16] * 4), [zero] * 4)

        def load(ptr, idx):
            return builder.load(builder.bitcast(builder.gep(ptr, [idx]), v16.as_pointer()), align=4)

        def step(i, accs):
            base = builder.mul(i, ir.Constant(ity, 64))
            for a in range(4):
                off = builder.add(base, ir.Constant(ity, 16 * a))
                acc = builder.call(fma, [load(px, off), load(py, off), builder.extract_value(accs, a)])
                accs = builder.insert_value(accs, acc, a)
            return accs

        accs = ir_loop(builder, steps, acc0, step)
        a = [builder.extract_value(accs, k) for k in range(4)]
        v = builder.fadd(builder.fadd(a[0], a[2]), builder.fadd(a[1], a[3]))

        def half(vec, lo, n):
            return builder.shuffle_vector(vec, vec, ir.Constant(ir.VectorType(i32, n), list(range(lo, lo + n))))

        v8 = builder.fadd(half(v, 8, 8), half(v, 0, 8))  # _mm512_reduce_add_ps: 256-bit halves,
        v4 = builder.fadd(half(v8, 4, 4), half(v8, 0, 4))  # then 128-bit halves, then pairs
        e = [builder.extract_element(v4, ir.Constant(i32, k)) for k in range(4)]
        s0 = builder.fadd(builder.fadd(e[0], e[2]), builder.fadd(e[1], e[3]))

        def tail(i, s):
            xi = builder.load(builder.gep(px, [i]))
            yi = builder.load(builder.gep(py, [i]))
            return builder.fadd(s, builder.fmul(xi, yi))

        return ir_loop(builder, n, s0, tail, start=builder.mul(steps, ir.Constant(ity, 64)))

    return sig, codegen


@intrinsic
def f16_bits(typingctx, x):
    """The IEEE half bits of float32 x rounded to nearest even (LLVM fptrunc: F16C's vcvtps2ph,
    numpy's astype(float16)), as an int64 table index 0..65535."""
    sig = types.int64(types.float32)

    def codegen(context, builder, signature, args):
        h = builder.fptrunc(args[0], ir.HalfType())
        return builder.zext(builder.bitcast(h, ir.IntType(16)), ir.IntType(64))

    return sig, codegen


@njit(inline="always")
def red16(a, s):
    """a[s:s+16] summed as GCC's _mm512_reduce_add_ps: halves, quarters, then pairs."""
    c0 = (a[s + 12] + a[s + 4]) + (a[s + 8] + a[s])
    c1 = (a[s + 13] + a[s + 5]) + (a[s + 9] + a[s + 1])
    c2 = (a[s + 14] + a[s + 6]) + (a[s + 10] + a[s + 2])
    c3 = (a[s + 15] + a[s + 7]) + (a[s + 11] + a[s + 3])
    return (c0 + c2) + (c1 + c3)


@njit(cache=True)
def layer_norm(x, w, b, eps):  # x (T, d) f32; b may be empty (no bias); eps float32
    T, d = x.shape
    out = np.empty((T, d), F32)
    sq = np.empty(16, F32)
    for t in range(T):
        s = 0.0
        for j in range(d):
            s += np.float64(x[t, j])
        mean = F32(s) / F32(d)
        y = out[t]
        for j in range(d):
            y[j] = x[t, j] - mean
        acc = 0.0
        j = 0
        while j + 15 < d:
            for u in range(16):
                sq[u] = y[j + u] * y[j + u]
            acc += np.float64(red16(sq, 0))
            j += 16
        while j < d:
            acc += np.float64(y[j] * y[j])
            j += 1
        var = F32(acc / d)
        scale = F32(1.0) / F32(math.sqrt(np.float64(var + eps)))
        for j in range(d):
            v = (y[j] * scale) * w[j]
            y[j] = v + b[j] if b.shape[0] else v
    return out


@njit(cache=True)
def rms_norm(x, w, eps):  # x (T, d) f32, eps float32
    T, d = x.shape
    out = np.empty((T, d), F32)
    for t in range(T):
        s = 0.0
        for j in range(d):
            s += np.float64(x[t, j] * x[t, j])
        scale = F32(1.0) / F32(math.sqrt(np.float64(F32(s / d) + eps)))
        for j in range(d):
            out[t, j] = (x[t, j] * scale) * w[j]
    return out


@njit(cache=True)
def add_rms_norm(x, y, w, eps):
    """(x + y, rms_norm(x + y, w, eps)) in one call: a block's residual add and the norm after it
    (the same float32 add as numpy's, then ``rms_norm``)."""
    s = x + y
    return s, rms_norm(s, w, eps)


@njit(cache=True)
def rope_tables(positions, theta_scale, freq_factors):
    """(cos, sin) (T, half) float32 of each position's angles, as ggml's rope cache computes them
    (theta = position, times theta_scale per pair; cosf / sinf of theta / freq_factor)."""
    T = positions.shape[0]
    half = freq_factors.shape[0]
    cos = np.empty((T, half), F32)
    sin = np.empty((T, half), F32)
    for t in range(T):
        theta = F32(positions[t])
        for i in range(half):
            th = theta / freq_factors[i]
            cos[t, i] = math.cos(th)  # float32 in: LLVM calls cosf / sinf
            sin[t, i] = math.sin(th)
            theta = theta * theta_scale
    return cos, sin


@njit(cache=True)
def rope_with(x, cos, sin, neox):
    """x (T, H, hd) rotated in place by ``rope_tables``' angles."""
    T, H, _ = x.shape
    half = cos.shape[1]
    for t in range(T):
        for h in range(H):
            for i in range(half):
                ia, ib = (i, i + half) if neox else (2 * i, 2 * i + 1)
                x0, x1 = x[t, h, ia], x[t, h, ib]
                x[t, h, ia] = fma32(x0, cos[t, i], -(x1 * sin[t, i]))
                x[t, h, ib] = fma32(x0, sin[t, i], x1 * cos[t, i])


@njit(cache=True)
def rope(x, positions, theta_scale, freq_factors, neox):
    """x (T, H, hd) f32 rotated in place on its first 2·len(freq_factors) dims; positions int64."""
    cos, sin = rope_tables(positions, theta_scale, freq_factors)
    rope_with(x, cos, sin, neox)


@njit(cache=True)
def attention_inputs(q, k, v, qn, kn, eps, positions, theta_scale, freq_factors, neox, rotate, prescale,
                     K, V, p0):
    """What runs between the q/k/v projections and ``attention``, in one compiled call: q (T, Hq,
    hd) and k (T, Hkv, hd) copied, each head's vector RMS-normed by qn / kn (empty: no norm),
    rotated by ``rope`` when ``rotate``, q multiplied by ``prescale`` (1: not), and k and v
    written to the caches K, V (Hkv, n_ctx, hd) at positions p0.. . Returns q.

    The same float32 operations as Model's step by step path (``rms_norm``, ``rope``, then a
    float32 product), so the logits are the same to the bit (tests/runtime/test_model.py). Why
    one call: right after a weight matrix has streamed through the caches, every Python-level
    operation runs cold, and these dozen cost a noticeable share of a decode step
    (docs/benchmarks.md, "Measurements behind code choices")."""
    T, Hq, hd = q.shape
    Hkv = k.shape[1]
    # copies by .copy(), not ``qc[:] = q``: numba's slice assignment brings its shape-mismatch
    # message (f-strings, str, join), most of this function's compile time on a fresh cache
    qc = q.copy()
    kc = k.copy()
    if qn.shape[0]:
        qc = rms_norm(qc.reshape(T * Hq, hd), qn, eps).reshape(T, Hq, hd)
    if kn.shape[0]:
        kc = rms_norm(kc.reshape(T * Hkv, hd), kn, eps).reshape(T, Hkv, hd)
    if rotate:
        cos, sin = rope_tables(positions, theta_scale, freq_factors)  # once for q and k
        rope_with(qc, cos, sin, neox)
        rope_with(kc, cos, sin, neox)
    if prescale != F32(1.0):
        for t in range(T):
            for h in range(Hq):
                for d in range(hd):
                    qc[t, h, d] = qc[t, h, d] * prescale
    for t in range(T):
        for h in range(Hkv):
            for d in range(hd):
                K[h, p0 + t, d] = kc[t, h, d]
                V[h, p0 + t, d] = v[t, h, d]
    return qc


@njit(inline="always")
def _red16_column(a, d):
    """a[0:16, d] summed as ``red16``."""
    c0 = (a[12, d] + a[4, d]) + (a[8, d] + a[0, d])
    c1 = (a[13, d] + a[5, d]) + (a[9, d] + a[1, d])
    c2 = (a[14, d] + a[6, d]) + (a[10, d] + a[2, d])
    c3 = (a[15, d] + a[7, d]) + (a[11, d] + a[3, d])
    return (c0 + c2) + (c1 + c3)


@njit(parallel=True, cache=True)
def attention(q, K, V, p0, scale, window, softcap):
    """ops.attention's contract, rounded as llama.cpp's non-flash CPU attention: scores capped
    as ggml_scale(1/cap), tanhf, ggml_scale(cap) when ``softcap`` > 0, then ×``scale`` (both
    float32; a file whose graph pre-scales q passes q·scale and scale 1, as llama.cpp does).

    Keys sit at their absolute positions, as in a fresh llama.cpp context, so its 16-value
    softmax chunks and tinyBLAS lanes line up with ours."""
    T, Hq, hd = q.shape
    group = Hq // K.shape[0]  # K, V (Hkv, n, hd) as ops.attention takes them
    out = np.empty((T, Hq * hd), F32)
    for th in prange(T * Hq):
        t, h = th // Hq, th % Hq
        kv = h // group
        m = p0 + t + 1
        j0 = max(0, m - window) if window > 0 else 0
        c0, c1 = j0 // 16 * 16, (m + 15) // 16 * 16  # the 16-value chunks that hold keys j0..m-1
        e = np.zeros(c1 - c0, F32)
        top = F32(-np.inf)
        inv_cap = F32(1.0) / softcap if softcap > 0 else F32(0.0)
        qv = q[t, h]
        for j in range(j0, m):
            sj = vec_dot_f32(qv, K[kv, j])
            if softcap > 0:
                sj = F32(math.tanh(sj * inv_cap)) * softcap  # float32 in: tanhf
            sj = sj * scale
            e[j - c0] = sj
            top = max(top, sj)
        for j in range(j0, m):
            e[j - c0] = v_expf(e[j - c0] - top)
        tot = 0.0
        for c in range(0, c1 - c0, 16):
            tot += np.float64(red16(e, c))
        inv = F32(1.0 / tot)
        lanes = np.zeros((16, hd), F32)  # tinyBLAS: key j accumulates in lane j % 16
        for j in range(j0, m):
            pj = e[j - c0] * inv
            row = lanes[j % 16]
            vj = V[kv, j]
            for d in range(hd):
                row[d] = fma32(pj, vj[d], row[d])
        for d in range(hd):
            out[t, h * hd + d] = _red16_column(lanes, d)
    return out


def avx512_order() -> bool:
    """Whether llama.cpp built on this CPU takes the AVX-512 paths these functions mirror (its
    ``__AVX512F__ && __AVX512DQ__`` branches): there our logits can equal llama.cpp's bit for
    bit; elsewhere (AVX2: 8-lane sums) they differ by float32 rounding."""
    from llvmlite import binding

    feats = binding.get_host_cpu_features()
    return bool(feats.get("avx512f")) and bool(feats.get("avx512dq"))


def kq_scale(scale: float) -> np.float32:
    """The attention scale as llama.cpp computes it, 1.0f/sqrtf(float(n)), for a scale 1/√n with
    n an integer (head size, Gemma's query_pre_attn_scalar); any other scale rounded to float32."""
    n = round(1 / scale**2) if scale > 0 else 0
    if n and abs(1 / math.sqrt(n) - scale) <= 1e-9 * scale:
        return F32(1.0) / F32(math.sqrt(F32(n)))
    return F32(scale)


def _libm_powf():
    """C's powf from the platform's libm (glibc on Linux: what ggml calls), or None."""
    import ctypes
    import ctypes.util

    try:
        lib = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
        fn = lib.powf
    except (OSError, AttributeError):
        return None
    fn.restype, fn.argtypes = ctypes.c_float, [ctypes.c_float, ctypes.c_float]
    return fn


_POWF = {}


def theta_scale(base: float, n_dims: int) -> np.float32:
    """ggml_rope's powf(freq_base, −2.0f/n_dims), in float32, by the C library's powf itself:
    numpy's float32 power differed from glibc's by an ulp for 395 of 2,816 (base, n_dims) pairs
    tried (base 10000, n_dims 64 among them), an error RoPE's θ·scaleⁱ multiplies along the head;
    without a libm, float64 pow rounded to float32 (it differed once in those 2,816)."""
    if "fn" not in _POWF:
        _POWF["fn"] = _libm_powf()
    e = F32(-2.0) / F32(n_dims)
    if _POWF["fn"] is not None:
        return F32(_POWF["fn"](float(F32(base)), float(e)))
    return F32(math.pow(float(F32(base)), float(e)))
