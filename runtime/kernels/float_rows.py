"""F32, F16 and BF16 rows: the float-row SIMD intrinsics (eight rows per call; x float32, or
fp16 for F16 weights under llama.cpp's arithmetic), the dense kernels built on them
(``mm_f32``, ``mm_f16``, ``mm_bf16``; ``mm_float_rows``, ``mm_f16_half_x`` and
``mm_f16_half_x_one`` for compiled callers, runtime.decode_block), the four-row ``axpy4_*`` of
the sparse down projection, attention's inner products over flat arrays, and the benchmarks'
memory probes (``read_rows_u32``)."""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from runtime.kernels.groups import row_at, row_count, store_group, strided8
from runtime.kernels.ir_helpers import (
    F32,
    FAST,
    HALF,
    I8,
    I16,
    I32,
    ROWS,
    V32F,
    accumulate,
    array_data,
    const,
    hsum,
    ir_loop,
    prefetch_line,
    prefetch_lines,
    splat,
    vload,
    vstore,
    zeros_struct,
)

# F16 / BF16 bits -> float32, for rows whose length is not a multiple of 32 (the plain loops)
LUT_F16 = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
LUT_BF16 = (np.arange(65536, dtype=np.uint32) << 16).view(np.float32)


# --- float rows: F32, F16 and BF16 elements, 32 at a time as <32 x float> ---------------------
def _f32_vec(b, ptr, off):
    return vload(b, ptr, off, V32F, 4)


def _f16_vec(b, ptr, off):
    bits = vload(b, ptr, off, ir.VectorType(I16, 32), 2)
    return b.fpext(b.bitcast(bits, ir.VectorType(HALF, 32)), V32F)


def _bf16_vec(b, ptr, off):  # bfloat16 is the top half of a float32
    bits = b.zext(vload(b, ptr, off, ir.VectorType(I16, 32), 2), ir.VectorType(I32, 32))
    return b.bitcast(b.shl(bits, const(bits.type, [16] * 32)), V32F)


_FLOAT_ROWS = {"f32": (_f32_vec, 2), "f16": (_f16_vec, 1), "bf16": (_bf16_vec, 1)}  # decoder, lines / 32


ROW_AHEAD = 512  # bytes: the float-row kernels prefetch each row this far ahead of the read


FLOAT_ROWS = 8  # weight rows per call of the dot8_* float intrinsics


def float_row_prefetch() -> bool:
    """Whether the float-row kernels prefetch each row ROW_AHEAD bytes on, by the CPU numba
    compiles for (the host's, or NUMBA_CPU_NAME): not on AMD Zen ("znver*"), yes elsewhere.

    Eight F16 rows per group over the matrices of Llama-3.1-8B- and Falcon-7B-dims F16 files,
    alternated 30-40 rounds with the benchmarks' read of the same pages right after each:
    on a 2-core AMD EPYC (znver4) without prefetch 1.06 and 1.15 × the 4-row prefetched read,
    with it 1.04 and 0.97 (one row at a time, no prefetch: 0.94 and 1.04); on a 2-core Xeon
    (emeraldrapids) the prefetch raised the same kernel from 0.79 to 0.95 of that read.
    """
    from llvmlite import binding
    from numba.core import config

    name = config.CPU_NAME if config.CPU_NAME not in (None, "host") else binding.get_host_cpu_name()
    return not name.startswith("znver")


def _dot_rows_codegen(kind, nrows, half_x=False):
    """Dot products of ``nrows`` rows with x: x float32, or (``half_x``) fp16 bits widened as the
    weights are, which is ggml's vec_dot_f16 (F16 weights under llama.cpp's arithmetic)."""
    load, lines = _FLOAT_ROWS[kind]

    def codegen(context, builder, sig, args):
        prefetch = float_row_prefetch()
        # args: nrows row views, x, n (multiple of 32)
        ws = [array_data(context, builder, sig.args[j], args[j]) for j in range(nrows)]
        x = array_data(context, builder, sig.args[nrows], args[nrows])
        n = args[nrows + 1]

        def body(i, accs):
            off = builder.mul(i, const(n.type, 32))
            xv = _f16_vec(builder, x, off) if half_x else vload(builder, x, off, V32F, 4)
            for j in range(nrows):
                # each row's own lines ROW_AHEAD bytes on (past a row's end: the next row's
                # first lines, or nothing: a prefetch never faults). Against an integer read
                # of the same file pages (benchmarks/runtime_vs_llamacpp.read_rows), alternated
                # 25 rounds on Llama-3.1-8B-dims F16: 0.95 of it, against 0.79 when each
                # group prefetched the next group's rows at the same offset
                # (float_row_prefetch: not on AMD Zen, whose hardware prefetcher does better alone)
                p8 = builder.bitcast(builder.gep(ws[j], [off]), I8.as_pointer())
                for u in range(lines if prefetch else 0):
                    prefetch_line(builder, builder.gep(p8, [const(I32, ROW_AHEAD + 64 * u)]))
                accs = accumulate(builder, accs, j, builder.fmul(load(builder, ws[j], off), xv, flags=FAST))
            return accs

        accs = ir_loop(builder, builder.sdiv(n, const(n.type, 32)), zeros_struct(nrows), body)
        return context.make_tuple(builder, sig.return_type,
                                  [hsum(builder, builder.extract_value(accs, j)) for j in range(nrows)])

    return codegen


def _dot8(kind):
    gen = _dot_rows_codegen(kind, FLOAT_ROWS)

    def typer(typingctx, w0, w1, w2, w3, w4, w5, w6, w7, x, n):
        return types.UniTuple(types.float32, FLOAT_ROWS)(w0, w1, w2, w3, w4, w5, w6, w7, x, n), gen

    typer.__name__ = f"dot8_{kind}"
    return intrinsic(typer)


# (w0·x, ..., w7·x) over n values (a multiple of 32); each row prefetched ROW_AHEAD on.
# Eight rows, not four: eight streams in flight and the x loads shared by eight rows. Matrices
# of a Llama-3.1-8B-dims F16 file, 2 threads, alternated 8-10 rounds: 4 rows 27.1-27.8 GB/s,
# 8 rows 28.6-29.2, 16 rows 27.5, where an integer read of the same pages (4 or 8 rows) ran
# 31.0-31.6; one thread: 13.9 / 14.7 against 15.9. (Those groups were eight rows side by side;
# the kernel now takes them G apart, see strided8. Strided, one row at a time was faster still
# on the k = 4096 matrices alone, one thread 25.0 against 23.4 GB/s, but at k = 14336 it fell to
# 12.3 against 24.3: x (57 KB as float32) no longer stays in L1 when eight rows do not share it.)
dot8_f32, dot8_f16, dot8_bf16 = _dot8("f32"), _dot8("f16"), _dot8("bf16")


def _dots_f16_half_x():
    gen8, gen1 = _dot_rows_codegen("f16", FLOAT_ROWS, True), _dot_rows_codegen("f16", 1, True)

    def typer8(typingctx, w0, w1, w2, w3, w4, w5, w6, w7, x, n):
        return types.UniTuple(types.float32, FLOAT_ROWS)(w0, w1, w2, w3, w4, w5, w6, w7, x, n), gen8

    def typer1(typingctx, w0, x, n):
        return types.UniTuple(types.float32, 1)(w0, x, n), gen1

    typer8.__name__, typer1.__name__ = "dot8_f16_hx", "dot1_f16_hx"
    return intrinsic(typer8), intrinsic(typer1)


# F16 rows · x as fp16 bits (ggml's vec_dot_f16): eight rows, and one row
dot8_f16_hx, dot1_f16_hx = _dots_f16_half_x()


def _read_rows_codegen(nrows, prefetch):
    def codegen(context, builder, sig, args):
        # args: w (rows of uint32, C-contiguous: its first nrows rows are read), n (a multiple of 16)
        v16 = ir.VectorType(I32, 16)
        w0 = array_data(context, builder, sig.args[0], args[0])
        n = args[1]
        ws = [builder.gep(w0, [builder.mul(n, const(n.type, j))]) for j in range(nrows)]

        def body(i, acc):
            off = builder.mul(i, const(n.type, 16))
            for j in range(nrows):
                if prefetch:
                    p8 = builder.bitcast(builder.gep(ws[j], [off]), I8.as_pointer())
                    prefetch_line(builder, builder.gep(p8, [const(I32, ROW_AHEAD)]))
                acc = builder.xor(acc, vload(builder, ws[j], off, v16, 4))
            return acc

        acc = ir_loop(builder, builder.sdiv(n, const(n.type, 16)), const(v16, [0] * 16), body)
        out = builder.extract_element(acc, const(I32, 0))
        for k in range(1, 16):
            out = builder.xor(out, builder.extract_element(acc, const(I32, k)))
        return out

    return codegen


_READS = {}


def read_rows_u32(nrows: int, prefetch: bool):
    """The benchmarks' memory probes: an intrinsic ``(w, n) -> uint32`` reading the first
    ``nrows`` rows of ``w`` (n uint32 each, contiguous), 64 bytes of each per step, each row
    prefetched ROW_AHEAD bytes on or not, the values xor-folded as integers. No floating
    point: weight bytes read as floats hold denormals (0.7 % of a Q6_K file's words), whose
    microcode assists made a float probe read such a file 1.5× slower than memory allows.
    Which pattern reads fastest depends on the CPU (a 2-core Xeon: 4 rows prefetched; a 2-core
    AMD EPYC: 8 rows without prefetch, ~1.1× that), so the benchmarks try several."""
    key = (nrows, bool(prefetch))
    if key not in _READS:
        gen = _read_rows_codegen(nrows, bool(prefetch))

        def typer(typingctx, w, n):
            return types.uint32(w, n), gen

        typer.__name__ = f"read{nrows}_u32" + ("prefetch_line" if prefetch else "")
        _READS[key] = intrinsic(typer)
    return _READS[key]


def _axpy4_codegen(kind):
    load, lines = _FLOAT_ROWS[kind]

    def codegen(context, builder, sig, args):
        # args: y, w0..w3, a (4-tuple of float32), p0..p3, n (multiple of 32): y += Σ a_j w_j
        y = array_data(context, builder, sig.args[0], args[0])
        ws = [array_data(context, builder, sig.args[1 + j], args[1 + j]) for j in range(ROWS)]
        coef = [splat(builder, builder.extract_value(args[1 + ROWS], j), 32) for j in range(ROWS)]
        ps = [array_data(context, builder, sig.args[2 + ROWS + j], args[2 + ROWS + j]) for j in range(ROWS)]
        n = args[2 + 2 * ROWS]

        def body(i, carry):
            off = builder.mul(i, const(n.type, 32))
            acc = vload(builder, y, off, V32F, 4)
            for j in range(ROWS):
                prefetch_lines(builder, ps[j], off, lines)
                acc = builder.fadd(acc, builder.fmul(load(builder, ws[j], off), coef[j], flags=FAST), flags=FAST)
            vstore(builder, acc, y, off, 4)
            return carry

        ir_loop(builder, builder.sdiv(n, const(n.type, 32)), const(I32, 0), body)
        return context.get_dummy_value()

    return codegen


def _axpy4(kind):
    gen = _axpy4_codegen(kind)

    def typer(typingctx, y, w0, w1, w2, w3, a, p0, p1, p2, p3, n):
        return types.void(y, w0, w1, w2, w3, a, p0, p1, p2, p3, n), gen

    typer.__name__ = f"axpy4_{kind}"
    return intrinsic(typer)


# y[:n] += a[0]·w0 + a[1]·w1 + a[2]·w2 + a[3]·w3 (n a multiple of 32); rows p0..p3 prefetched
axpy4_f32, axpy4_f16, axpy4_bf16 = _axpy4("f32"), _axpy4("f16"), _axpy4("bf16")


# --- attention's inner products over flat arrays: the float path's (runtime/ops.attention) --------
# Element offsets into 1-D arrays instead of row views: a view made per key costs two atomic
# reference-count updates, more than the 128 multiply-adds it feeds; and numba does not
# vectorize its own loop over a float64 accumulator row (it cannot rule out aliasing).
@intrinsic
def dot_f32_at(typingctx, x, xo, y, yo, n):
    """Σ x[xo+i]·y[yo+i] for i < n, float32: 16-lane products summed per lane, then the lanes
    halved pairwise; the last n % 16 products added one by one."""
    sig = types.float32(x, xo, y, yo, n)

    def codegen(context, builder, signature, args):
        v16 = ir.VectorType(F32, 16)
        px, py = array_data(context, builder, signature.args[0], args[0]), array_data(context, builder, signature.args[2], args[2])
        xo_, yo_, n_ = args[1], args[3], args[4]
        ity = n_.type
        steps = builder.sdiv(n_, const(ity, 16))

        def step(i, acc):
            k = builder.mul(i, const(ity, 16))
            prod = builder.fmul(vload(builder, px, builder.add(xo_, k), v16, 4),
                                vload(builder, py, builder.add(yo_, k), v16, 4), flags=FAST)
            return builder.fadd(acc, prod, flags=FAST)

        total = hsum(builder, ir_loop(builder, steps, const(v16, [0.0] * 16), step))

        def tail(i, acc):
            a = builder.load(builder.gep(px, [builder.add(xo_, i)]))
            b = builder.load(builder.gep(py, [builder.add(yo_, i)]))
            return builder.fadd(acc, builder.fmul(a, b, flags=FAST), flags=FAST)

        return ir_loop(builder, n_, total, tail, start=builder.mul(steps, const(ity, 16)))

    return sig, codegen


@intrinsic
def axpy_f64_at(typingctx, o, oo, w, v, vo, n):
    """o[oo+i] += w·v[vo+i] for i < n: o float64, v float32 widened exactly, 8 lanes at a time."""
    sig = types.void(o, oo, w, v, vo, n)

    def codegen(context, builder, signature, args):
        f64 = ir.DoubleType()
        v8d, v8f = ir.VectorType(f64, 8), ir.VectorType(F32, 8)
        po, pv = array_data(context, builder, signature.args[0], args[0]), array_data(context, builder, signature.args[3], args[3])
        oo_, vo_, n_ = args[1], args[4], args[5]
        ity = n_.type
        w = context.cast(builder, args[2], signature.args[2], types.float64)
        ws = splat(builder, w, 8)
        steps = builder.sdiv(n_, const(ity, 8))

        def step(i, carry):
            k = builder.mul(i, const(ity, 8))
            at = builder.add(oo_, k)
            x = builder.fpext(vload(builder, pv, builder.add(vo_, k), v8f, 4), v8d)
            vstore(builder, builder.fadd(vload(builder, po, at, v8d, 8), builder.fmul(ws, x)), po, at, 8)
            return carry

        ir_loop(builder, steps, const(I32, 0), step)

        def tail(i, carry):
            p = builder.gep(po, [builder.add(oo_, i)])
            x = builder.fpext(builder.load(builder.gep(pv, [builder.add(vo_, i)])), f64)
            builder.store(builder.fadd(builder.load(p), builder.fmul(w, x)), p)
            return carry

        ir_loop(builder, n_, const(I32, 0), tail, start=builder.mul(steps, const(ity, 8)))
        return context.get_dummy_value()

    return sig, codegen


# --- dense rows: F32, F16, BF16 ---------------------------------------------------------------
# One parallel kernel per family with the element type as a run-time ``kind`` (one predictable
# branch per four rows); the public functions pick it, and the plain fallback when rows are
# not a multiple of 32. (Separate kernels per type would repeat the loop; closures over the
# intrinsic would not cache.)
F32_ROWS, F16_ROWS, BF16_ROWS = 0, 1, 2


@njit(parallel=True, fastmath=True, cache=True)
def mm_float_rows(W, X, rows, Y, kind):
    T, k = X.shape
    n = row_count(rows, W)
    G = (n + FLOAT_ROWS - 1) // FLOAT_ROWS
    for g in prange(G):
        i0, i1, i2, i3, i4, i5, i6, i7 = strided8(rows, n, g, G)
        for t in range(T):
            if kind == F32_ROWS:
                y = dot8_f32(W[i0], W[i1], W[i2], W[i3], W[i4], W[i5], W[i6], W[i7], X[t], k)
            elif kind == F16_ROWS:
                y = dot8_f16(W[i0], W[i1], W[i2], W[i3], W[i4], W[i5], W[i6], W[i7], X[t], k)
            else:
                y = dot8_bf16(W[i0], W[i1], W[i2], W[i3], W[i4], W[i5], W[i6], W[i7], X[t], k)
            store_group(Y, t, rows, n, g, G, y)


def mm_f32(W, X, rows, Y):  # W (n, k) f32; X (T, k); rows (r,) int64 or None (every row); Y (T, n)
    if X.shape[1] % 32:
        _mm_f32_rows(W, X, rows, Y)
    else:
        mm_float_rows(W, X, rows, Y, F32_ROWS)


def mm_f16(W, X, rows, Y):  # W (n, k) uint16 holding IEEE half bits
    if X.shape[1] % 32:
        mm_lut_rows(W, LUT_F16, X, rows, Y)
    else:
        mm_float_rows(W, X, rows, Y, F16_ROWS)


def mm_bf16(W, X, rows, Y):  # W (n, k) uint16 holding bfloat16 bits
    if X.shape[1] % 32:
        mm_lut_rows(W, LUT_BF16, X, rows, Y)
    else:
        mm_float_rows(W, X, rows, Y, BF16_ROWS)


# --- F16 weights in llama.cpp's arithmetic: x rounded to fp16 once per matmul ------------------
# What ggml computes for an F16 weight (its vec_dot_type for F16 is F16): each activation rounded
# to fp16, products and sums in float32. Under the "int8" arithmetic (the default: llama.cpp's
# arithmetic, named for the block types) the F16 matmuls run so; "float" keeps x float32, exact.
# The halved x also changes which grouping reads fastest. One row at a time with x in fp16 reads
# each thread's rows as one sequential stream, and x (2k bytes) stays in L1 beside it. Llama-3.1-
# 8B-dims F16, AMD EPYC, the k = 4096 matrices, 2 threads, one minute: C loops of these shapes
# (gcc -O3) one row with fp16 x 46-47 GB/s, one row with float32 x 39.8, our strided eight with
# float32 x 40.7. This kernel, in one process alternated step by step with llama.cpp: a decode
# step 1.01-1.08x llama.cpp's where the strided float32 one ran 0.97-1.03x; Falcon-7B dims
# (k = 4544) 1.12-1.13x against 1.06x.
# Past ONE_ROW_X_BYTES of x (k = 14336: 28 KB) one row at a time fell to half the speed of eight
# rows sharing each x load, so longer rows keep the strided eight (with fp16 x as well). Which
# kernel runs: ``mm_f16_arith`` (runtime.kernels.dispatch).
ONE_ROW_X_BYTES = 16 << 10  # half of a 32 KiB L1D


@njit(parallel=True, fastmath=True, cache=True)
def mm_f16_half_x(W, XH, rows, Y):  # XH (T, k) uint16: x as fp16 bits
    T, k = XH.shape
    n = row_count(rows, W)
    G = (n + FLOAT_ROWS - 1) // FLOAT_ROWS
    for g in prange(G):
        i0, i1, i2, i3, i4, i5, i6, i7 = strided8(rows, n, g, G)
        for t in range(T):
            y = dot8_f16_hx(W[i0], W[i1], W[i2], W[i3], W[i4], W[i5], W[i6], W[i7], XH[t], k)
            store_group(Y, t, rows, n, g, G, y)


@njit(parallel=True, fastmath=True, cache=True)
def mm_f16_half_x_one(W, XH, rows, Y):
    T, k = XH.shape
    for ii in prange(row_count(rows, W)):
        i = row_at(rows, ii)
        for t in range(T):
            Y[t, i] = dot1_f16_hx(W[i], XH[t], k)[0]


# rows whose length is not a multiple of 32: one row at a time, vectorized by LLVM alone
@njit(parallel=True, fastmath=True, cache=True)
def _mm_f32_rows(W, X, rows, Y):
    T, k = X.shape
    for ii in prange(row_count(rows, W)):
        i = row_at(rows, ii)
        for t in range(T):
            acc = np.float32(0.0)
            for j in range(k):
                acc += W[i, j] * X[t, j]
            Y[t, i] = acc


@njit(parallel=True, fastmath=True, cache=True)
def mm_lut_rows(W, lut, X, rows, Y):  # W uint16 bits decoded through a 65536-entry table
    T, k = X.shape
    for ii in prange(row_count(rows, W)):
        i = row_at(rows, ii)
        for t in range(T):
            acc = np.float32(0.0)
            for j in range(k):
                acc += lut[W[i, j]] * X[t, j]
            Y[t, i] = acc
