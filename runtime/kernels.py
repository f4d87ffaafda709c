"""numba kernels: Y[t, i] = Σ_j W[i, j] · X[t, j] over a chosen set of rows, per storage type.

Weights stay in their stored precision and are decoded in registers (F16/BF16 by the CPU's
conversion instructions, block types block by block straight from the file's interleaved
ggml blocks, fp16 scales included), so the bytes a kernel reads are the bytes the byte
counter reports, and a weight is never copied out of the mmap. Each weight row
is read once per call whatever the number of tokens T (chunked prefill reuses it across the
chunk).

Hand-written because no maintained library multiplies GGUF block formats on the CPU from
Python without dequantizing the whole matrix first (which would triple the traffic), and
numba alone leaves the vectorization to LLVM's auto-vectorizer, which (measured on this
project's Ice Lake machine) kept the Q8_0 int8 → float decode scalar and ran one row per
loop: ~10 GB/s for Q8_0 and ~20 GB/s for F32 against 26 GB/s for OpenBLAS' GEMV.

So the inner loops are LLVM IR intrinsics ("SIMD intrinsics" below) that state the vector
shapes directly (``<32 x float>`` accumulators, ``<32 x i8>`` loads, 16 fp16 scales
converted in one instruction), work on several rows at once (the activations are loaded once
per group and as many memory streams are in flight; the rows may be any subset, as the
sparse paths need, or None for all of them) and prefetch ahead: the float kernels eight rows
taken G apart (each position one unbroken stream of consecutive rows), each its own lines
ROW_AHEAD bytes on (except on AMD Zen: ``float_row_prefetch``); the block kernels four rows
side by side and the lines of the group AHEAD on, into L2. F16 under llama.cpp's arithmetic
(``mm_f16_arith``: x rounded to fp16, as ggml) reads short rows one at a time instead. Which pattern reads memory fastest was measured per
kernel against a plain read of the same file pages, on a Xeon and on an AMD EPYC (the
comments at each say by how much; docs/benchmarks.md, "Two CPUs"). LLVM lowers the generic vector
types to what the CPU has (AVX-512, AVX2, NEON). Rows whose length is not a multiple of 32
(F32/F16/BF16 only; block formats are whole blocks) take a plain numba loop.

Arithmetic of the 32-value block types (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL), process-wide
(``set_arithmetic``; ``aios-run generate/bench --arithmetic``): "int8", the default, does what
llama.cpp does: each activation row is quantized once per matmul to int8 blocks of 32 with a
float scale per block (ggml's quantize_row_q8_0), and each weight block meets it in an integer
dot product (AVX-512 VNNI vpdpbusd here; AVX-VNNI, AVX2 pmaddubsw or portable IR elsewhere,
picked from the CPU's features when numba compiles), scaled by d_w·d_x in float; Q8_0, Q4_0 and
Q5_0 (``BLOCKWISE``) in ggml's order of float operations, so on x86 their matmuls equal llama.cpp's
bit for bit (its plain CPU buffers; one token and a batch alike). Its error is
the activations' 8-bit rounding (~0.5 % of Y, tested ≤ 1 %). "float" decodes each block to
float and multiplies the float activations: exact to float32 rounding, what the parity tests
compare with gguf-py's dequantized weights (``mm_block`` is always this path). The K-quants
(Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS: ``KQ_INT``) run int8 the same way with llama.cpp's Q8_K
activations (blocks of 256, float d, the 16 group sums for the minimum / offset terms;
``quantize_q8_k``), integer sums by pmaddubsw + vpdpwssd. ``INT8_DEFAULT`` lists the types
"int8" runs in int8 (all of them: int8 measured faster than float for every type here).

The intrinsics live in this file on purpose: numba's on-disk cache is invalidated by the
timestamp of the file that defines a kernel only, so intrinsics in another module could
leave stale compiled kernels behind after an edit.
"""

from __future__ import annotations

import os

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic, overload

from aios.quant import QK_K, block_size, type_size

# numba's OpenMP threading layer (libgomp; its default here: TBB is rarely installed) lets idle
# threads spin for a while (GOMP_SPINCOUNT, 300,000 by default) before they sleep. When another
# process uses a core, a parallel region then waits for a descheduled thread while its peers burn
# the other core (measured on the tiny fixture with one core busy: 11-20 tok/s with the default
# spin, 625-1270 tok/s passive). Sleeping at once (OMP_WAIT_POLICY=PASSIVE) costs a futex wake-up
# per parallel region instead: 45-50 µs on the 2-core AMD EPYC VM (115-130 µs on the Xeon one;
# a halted vCPU is woken through the hypervisor), ~30 regions per decode step. A short spin
# sits between the two: 3,000 spins keep the threads awake through gaps of up to ~50-100 µs
# (the Python between a step's matmuls) and let them sleep soon after. EPYC, Llama-3.1-8B-dims
# Q4_0, ours ÷ llama.cpp (its own process and defaults), 3 alternated processes of 4 rounds:
# passive 0.895/0.945/0.903, 3,000 spins 0.956/0.933/1.013 (10,000: 0.964/0.973). With one core
# busy (benchmarks/busy_core.py, Q4_K_M): passive kept 0.71 of the idle speed, 3,000 spins 0.64,
# 10,000 spins 0.41, llama.cpp 0.49. Set before numba starts its pool, unless the user chose a
# policy or a count. libgomp is one per process: a llama.cpp loaded into the same process (its
# CPU backend uses OpenMP) gets this setting too; OMP_SET_HERE lets a caller give a child
# process its own defaults (benchmarks/llamacpp_worker.py).
SPIN_COUNT = "3000"
OMP_SET_HERE: tuple[str, ...] = ()
if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
    os.environ["GOMP_SPINCOUNT"] = SPIN_COUNT
    OMP_SET_HERE = ("GOMP_SPINCOUNT",)

QK = block_size("Q8_0")  # elements per Q8_0 / Q4_0 block (gguf-py's table, like every block size)
assert block_size("Q4_0") == QK
SPARSE_CHUNKS = 8  # partial sums per sparse down-projection call: balances two to eight threads

LUT_F16 = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
LUT_BF16 = (np.arange(65536, dtype=np.uint32) << 16).view(np.float32)


def physical_cores() -> int:
    """Physical cores of this machine (hyper-threads not counted): the default thread count."""
    try:
        import psutil

        n = psutil.cpu_count(logical=False)
    except ImportError:  # pragma: no cover - psutil is a dependency of the toolchain
        n = None
    return max(1, n or os.cpu_count() or 1)


_THREADS = {"want": 0, "now": 0}  # set_threads' count (0: never called) and the count in effect
# below this many bytes touched, a parallel region costs more than it saves: a second thread's
# wake-up (~120 µs here) is the time one thread takes to read ~1.5 MB (13 GB/s per core)
SERIAL_BYTES = 1 << 20


def set_threads(n: int | None = None) -> int:
    """Run the parallel kernels on ``n`` threads (default: physical cores, at most what numba
    started with); returns the count in effect. ``n`` above numba's pool is an error."""
    import numba

    from aios.errors import UsageError

    pool = numba.config.NUMBA_NUM_THREADS
    if n is None:
        n = min(physical_cores(), pool)
    if not 1 <= n <= pool:
        raise UsageError(f"--threads {n} is outside 1..{pool} (numba's thread pool here; "
                         "NUMBA_NUM_THREADS sets its size).")
    numba.set_num_threads(n)
    _THREADS["want"] = _THREADS["now"] = n
    return n


def threads_for(nbytes: int) -> None:
    """Before a parallel kernel that touches ``nbytes``: one thread below SERIAL_BYTES, else the
    ``set_threads`` count (a tiny model's every matmul, a short attention, run without waking the
    pool). Changes numba's setting only when the choice changes (a set costs ~2.5 µs). Without a
    ``set_threads`` call (library use: the checker, perplexity), the count is numba's setting at
    the first call."""
    want = _THREADS["want"]
    if want == 0:
        import numba

        want = _THREADS["want"] = _THREADS["now"] = numba.get_num_threads()
    if want > 1:
        n = 1 if nbytes < SERIAL_BYTES else want
        if n != _THREADS["now"]:
            import numba

            numba.set_num_threads(n)
            _THREADS["now"] = n


# === SIMD intrinsics ==========================================================================
# Each is an ``@intrinsic``: usable only inside @njit code, inlined there. Arguments are 1-D
# C-contiguous arrays (row views) plus counts; the kernels below guarantee the lengths.
F32 = ir.FloatType()
HALF = ir.HalfType()
I8, I16, I32 = ir.IntType(8), ir.IntType(16), ir.IntType(32)
V32F = ir.VectorType(F32, 32)
FAST = ("fast",)
ROWS = 4  # weight rows per call of the *4 intrinsics


# --- IR helpers -------------------------------------------------------------------------
def _c(ty, v):
    return ir.Constant(ty, v)


def _vload(b, ptr, idx, vt, align):
    return b.load(b.bitcast(b.gep(ptr, [idx]), vt.as_pointer()), align=align)


def _vstore(b, val, ptr, idx, align):
    b.store(val, b.bitcast(b.gep(ptr, [idx]), val.type.as_pointer()), align=align)


def _splat_lane(b, vec, lane, n):
    """<n x float> filled with vec[lane]."""
    return b.shuffle_vector(vec, ir.Constant(vec.type, ir.Undefined), _c(ir.VectorType(I32, n), [lane] * n))


def _splat(b, s, n):
    vt = ir.VectorType(s.type, n)
    v = b.insert_element(ir.Constant(vt, ir.Undefined), s, _c(I32, 0))
    return _splat_lane(b, v, 0, n)


def _hsum(b, v):
    n = v.type.count
    while n > 1:
        h = n // 2
        lo = b.shuffle_vector(v, v, _c(ir.VectorType(I32, h), list(range(h))))
        hi = b.shuffle_vector(v, v, _c(ir.VectorType(I32, h), list(range(h, n))))
        v = b.fadd(lo, hi, flags=FAST)
        n = h
    return b.extract_element(v, _c(I32, 0))


def _prefetch(b, ptr, locality=3):  # 3: into L1 (prefetcht0); 2: into L2 (prefetcht1)
    mod = b.module
    p8 = I8.as_pointer()
    fn = mod.globals.get("llvm.prefetch.p0i8")
    if fn is None:
        fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [p8, I32, I32, I32]), "llvm.prefetch.p0i8")
    b.call(fn, [b.bitcast(ptr, p8), _c(I32, 0), _c(I32, locality), _c(I32, 1)])  # read, locality, data


def _prefetch_lines(b, ptr, idx, lines, locality=3):
    """Prefetch ``lines`` consecutive 64-byte lines starting at ptr[idx]."""
    p8 = b.bitcast(b.gep(ptr, [idx]), I8.as_pointer())
    for u in range(lines):
        _prefetch(b, b.gep(p8, [_c(I32, 64 * u)]), locality)


def _loop(b, n, init, body, start=None):
    """``for i in range(start, n): acc = body(i, acc)`` as a phi loop; returns the final acc.

    ``init`` may be any first-class value (a struct of vectors for several accumulators).
    """
    start = _c(n.type, 0) if start is None else start
    entry = b.basic_block
    loop = b.append_basic_block("simd.loop")
    done = b.append_basic_block("simd.done")
    b.cbranch(b.icmp_signed("<", start, n), loop, done)
    b.position_at_end(loop)
    i = b.phi(n.type)
    acc = b.phi(init.type)
    new = body(i, acc)
    i2 = b.add(i, _c(n.type, 1))
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


def _data(context, builder, ty, val):
    return context.make_array(ty)(context, builder, val).data


# the two IR helpers runtime.ggml_ops builds its vec_dot_f32 intrinsic with, under public names
array_data, ir_loop = _data, _loop


def _zeros_struct(k):
    z = _c(V32F, [0.0] * 32)
    return ir.Constant(ir.LiteralStructType([V32F] * k), [z] * k)


def _accumulate(b, accs, j, val):
    return b.insert_value(accs, b.fadd(b.extract_value(accs, j), val, flags=FAST), j)


# --- float rows: F32, F16 and BF16 elements, 32 at a time as <32 x float> ---------------------
def _f32_vec(b, ptr, off):
    return _vload(b, ptr, off, V32F, 4)


def _f16_vec(b, ptr, off):
    bits = _vload(b, ptr, off, ir.VectorType(I16, 32), 2)
    return b.fpext(b.bitcast(bits, ir.VectorType(HALF, 32)), V32F)


def _bf16_vec(b, ptr, off):  # bfloat16 is the top half of a float32
    bits = b.zext(_vload(b, ptr, off, ir.VectorType(I16, 32), 2), ir.VectorType(I32, 32))
    return b.bitcast(b.shl(bits, _c(bits.type, [16] * 32)), V32F)


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
        ws = [_data(context, builder, sig.args[j], args[j]) for j in range(nrows)]
        x = _data(context, builder, sig.args[nrows], args[nrows])
        n = args[nrows + 1]

        def body(i, accs):
            off = builder.mul(i, _c(n.type, 32))
            xv = _f16_vec(builder, x, off) if half_x else _vload(builder, x, off, V32F, 4)
            for j in range(nrows):
                # each row's own lines ROW_AHEAD bytes on (past a row's end: the next row's
                # first lines, or nothing: a prefetch never faults). Against an integer read
                # of the same file pages (benchmarks/runtime_vs_llamacpp.read_rows), alternated
                # 25 rounds on Llama-3.1-8B-dims F16: 0.95 of it, against 0.79 when each
                # group prefetched the next group's rows at the same offset
                # (float_row_prefetch: not on AMD Zen, whose hardware prefetcher does better alone)
                p8 = builder.bitcast(builder.gep(ws[j], [off]), I8.as_pointer())
                for u in range(lines if prefetch else 0):
                    _prefetch(builder, builder.gep(p8, [_c(I32, ROW_AHEAD + 64 * u)]))
                accs = _accumulate(builder, accs, j, builder.fmul(load(builder, ws[j], off), xv, flags=FAST))
            return accs

        accs = _loop(builder, builder.sdiv(n, _c(n.type, 32)), _zeros_struct(nrows), body)
        return context.make_tuple(builder, sig.return_type,
                                  [_hsum(builder, builder.extract_value(accs, j)) for j in range(nrows)])

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
# the kernel now takes them G apart, see _strided8. Strided, one row at a time was faster still
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
        w0 = _data(context, builder, sig.args[0], args[0])
        n = args[1]
        ws = [builder.gep(w0, [builder.mul(n, _c(n.type, j))]) for j in range(nrows)]

        def body(i, acc):
            off = builder.mul(i, _c(n.type, 16))
            for j in range(nrows):
                if prefetch:
                    p8 = builder.bitcast(builder.gep(ws[j], [off]), I8.as_pointer())
                    _prefetch(builder, builder.gep(p8, [_c(I32, ROW_AHEAD)]))
                acc = builder.xor(acc, _vload(builder, ws[j], off, v16, 4))
            return acc

        acc = _loop(builder, builder.sdiv(n, _c(n.type, 16)), _c(v16, [0] * 16), body)
        out = builder.extract_element(acc, _c(I32, 0))
        for k in range(1, 16):
            out = builder.xor(out, builder.extract_element(acc, _c(I32, k)))
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

        typer.__name__ = f"read{nrows}_u32" + ("_prefetch" if prefetch else "")
        _READS[key] = intrinsic(typer)
    return _READS[key]


def _axpy4_codegen(kind):
    load, lines = _FLOAT_ROWS[kind]

    def codegen(context, builder, sig, args):
        # args: y, w0..w3, a (4-tuple of float32), p0..p3, n (multiple of 32): y += Σ a_j w_j
        y = _data(context, builder, sig.args[0], args[0])
        ws = [_data(context, builder, sig.args[1 + j], args[1 + j]) for j in range(ROWS)]
        coef = [_splat(builder, builder.extract_value(args[1 + ROWS], j), 32) for j in range(ROWS)]
        ps = [_data(context, builder, sig.args[2 + ROWS + j], args[2 + ROWS + j]) for j in range(ROWS)]
        n = args[2 + 2 * ROWS]

        def body(i, carry):
            off = builder.mul(i, _c(n.type, 32))
            acc = _vload(builder, y, off, V32F, 4)
            for j in range(ROWS):
                _prefetch_lines(builder, ps[j], off, lines)
                acc = builder.fadd(acc, builder.fmul(load(builder, ws[j], off), coef[j], flags=FAST), flags=FAST)
            _vstore(builder, acc, y, off, 4)
            return carry

        _loop(builder, builder.sdiv(n, _c(n.type, 32)), _c(I32, 0), body)
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
        px, py = _data(context, builder, signature.args[0], args[0]), _data(context, builder, signature.args[2], args[2])
        xo_, yo_, n_ = args[1], args[3], args[4]
        ity = n_.type
        steps = builder.sdiv(n_, _c(ity, 16))

        def step(i, acc):
            k = builder.mul(i, _c(ity, 16))
            prod = builder.fmul(_vload(builder, px, builder.add(xo_, k), v16, 4),
                                _vload(builder, py, builder.add(yo_, k), v16, 4), flags=FAST)
            return builder.fadd(acc, prod, flags=FAST)

        total = _hsum(builder, _loop(builder, steps, _c(v16, [0.0] * 16), step))

        def tail(i, acc):
            a = builder.load(builder.gep(px, [builder.add(xo_, i)]))
            b = builder.load(builder.gep(py, [builder.add(yo_, i)]))
            return builder.fadd(acc, builder.fmul(a, b, flags=FAST), flags=FAST)

        return _loop(builder, n_, total, tail, start=builder.mul(steps, _c(ity, 16)))

    return sig, codegen


@intrinsic
def axpy_f64_at(typingctx, o, oo, w, v, vo, n):
    """o[oo+i] += w·v[vo+i] for i < n: o float64, v float32 widened exactly, 8 lanes at a time."""
    sig = types.void(o, oo, w, v, vo, n)

    def codegen(context, builder, signature, args):
        f64 = ir.DoubleType()
        v8d, v8f = ir.VectorType(f64, 8), ir.VectorType(F32, 8)
        po, pv = _data(context, builder, signature.args[0], args[0]), _data(context, builder, signature.args[3], args[3])
        oo_, vo_, n_ = args[1], args[4], args[5]
        ity = n_.type
        w = context.cast(builder, args[2], signature.args[2], types.float64)
        ws = _splat(builder, w, 8)
        steps = builder.sdiv(n_, _c(ity, 8))

        def step(i, carry):
            k = builder.mul(i, _c(ity, 8))
            at = builder.add(oo_, k)
            x = builder.fpext(_vload(builder, pv, builder.add(vo_, k), v8f, 4), v8d)
            _vstore(builder, builder.fadd(_vload(builder, po, at, v8d, 8), builder.fmul(ws, x)), po, at, 8)
            return carry

        _loop(builder, steps, _c(I32, 0), step)

        def tail(i, carry):
            p = builder.gep(po, [builder.add(oo_, i)])
            x = builder.fpext(builder.load(builder.gep(pv, [builder.add(vo_, i)])), f64)
            builder.store(builder.fadd(builder.load(p), builder.fmul(w, x)), p)
            return carry

        _loop(builder, n_, _c(I32, 0), tail, start=builder.mul(steps, _c(ity, 8)))
        return context.get_dummy_value()

    return sig, codegen


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
B32 = ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl")
B32_BYTES = {t: type_size(t) for t in B32}  # bytes per block (gguf-py's table)
assert all(block_size(t) == QK for t in B32) and QK == V32F.count  # one block, one <32 x float>
# where the quants start and whether a block has a minimum m (fp16 right after d)
B32_QS = {"q8_0": 2, "q4_0": 2, "q4_1": 4, "q5_0": 6, "q5_1": 8, "iq4_nl": 2}
B32_AFFINE = {"q4_1", "q5_1"}
B32_OFFSET = {"q4_0": 8, "q5_0": 16}  # subtracted from the stored unsigned quants
B32_SIGNED = {"q8_0", "iq4_nl"}  # quants stored as signed values
# the types whose int8 kernel sums as ggml's does, bit for bit (its vec_dot_*_q8_0 for one token
# and llamafile's tinyBLAS_Q0_AVX for a batch, on x86 alike): each block's signed Σ q_w·q_x in 8
# int32 lanes of 4 products (lane l: values 4l..4l+3), converted, fma'd with f32(d_w·d_x) into 8
# float lanes, one block after another, then _hsum. IQ4_NL is not: ggml's one-token dot keeps
# two accumulators (even and odd blocks) where its batch keeps one.
# Q4_0 and Q5_0 can sum so too (their offset taken off in the integer lanes: add them here), but
# that kernel took 1.15x (Q5_0) and 1.27x (Q4_0) the time of the quad kernel on the 2-core Xeon
# (2026-11-27), for top-1 agreement with llama.cpp on the real Gemma 3 270M of 0.9277 instead of
# 0.9233: decode speed at or above llama.cpp's is worth more, so they keep the quad kernel.
BLOCKWISE = ("q8_0",)
assert B32_BYTES == {t: B32_QS[t] + (QK if t == "q8_0" else QK // 2) for t in B32}
# ggml's non-linear 4-bit value table (ggml-common.h kvalues_iq4nl; gguf-py's IQ4_NL.kvalues)
KVALUES_IQ4NL = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)


def _nibbles(b, p, off):
    """<32 x i8>: the 16 bytes at p[off], low nibbles then high nibbles (values 0-15, 16-31)."""
    packed = _vload(b, p, off, ir.VectorType(I8, 16), 1)
    lo = b.and_(packed, _c(packed.type, [15] * 16))
    hi = b.lshr(packed, _c(packed.type, [4] * 16))
    return b.shuffle_vector(lo, hi, _c(ir.VectorType(I32, 32), list(range(32))))


def _lookup16(b, n):
    """kvalues_iq4nl[n] for a <32 x i8> of nibbles: a select tree over the 16 constants, one
    level per bit (generic vector selects, which every SIMD target lowers)."""
    vals = [_c(V32I8, [v] * 32) for v in KVALUES_IQ4NL]
    for bit in range(4):
        m = b.icmp_unsigned("!=", b.and_(n, _c(V32I8, [1 << bit] * 32)), _c(V32I8, [0] * 32))
        vals = [b.select(m, vals[2 * i + 1], vals[2 * i]) for i in range(len(vals) // 2)]
    return vals[0]


def _qh_bits(b, p, off):
    """<32 x i8>: bit l of the little-endian uint32 at p[off], shifted to bit 4 (Q5_0/Q5_1)."""
    qh = b.load(b.bitcast(b.gep(p, [off]), I32.as_pointer()), align=1)
    v = b.lshr(_splat(b, qh, 32), _c(ir.VectorType(I32, 32), list(range(32))))
    v = b.and_(v, _c(ir.VectorType(I32, 32), [1] * 32))
    return b.shl(b.trunc(v, V32I8), _c(V32I8, [4] * 32))


def _b32_quants(b, fmt, p, base, offset=True):
    """The block's 32 quant values as <32 x i8> (before d and m). With ``offset=False`` Q4_0 and
    Q5_0 give their stored unsigned 0..15 / 0..31 (the value is that minus B32_OFFSET); the
    affine types' values are unsigned either way (0..15 / 0..31), Q8_0 and IQ4_NL's signed."""
    qs = b.add(base, _c(base.type, B32_QS[fmt]))
    if fmt == "q8_0":
        return _vload(b, p, qs, V32I8, 1)
    n = _nibbles(b, p, qs)
    if fmt == "iq4_nl":
        return _lookup16(b, n)
    if fmt in ("q5_0", "q5_1"):
        n = b.or_(n, _qh_bits(b, p, b.add(base, _c(base.type, B32_QS[fmt] - 4))))
    if fmt in B32_AFFINE or not offset:
        return n
    return b.sub(n, _c(V32I8, [B32_OFFSET[fmt]] * 32))


def _b32_values(b, fmt, p, base):
    """The block's 32 quant values as <32 x float> (before d and m)."""
    q = _b32_quants(b, fmt, p, base)
    return b.uitofp(q, V32F) if fmt in B32_AFFINE else b.sitofp(q, V32F)


def _dot4_b32_codegen(fmt):
    nbytes = B32_BYTES[fmt]
    affine = fmt in B32_AFFINE
    chunk_blocks = 16  # blocks per loop step: one prefetch run per row, the rest unrolled

    def codegen(context, builder, sig, args):
        # args: w0..w3, p0..p3 (uint8 rows of blocks), x, nb
        ws = [_data(context, builder, sig.args[j], args[j]) for j in range(ROWS)]
        ps = [_data(context, builder, sig.args[ROWS + j], args[ROWS + j]) for j in range(ROWS)]
        x = _data(context, builder, sig.args[2 * ROWS], args[2 * ROWS])
        nb = args[2 * ROWS + 1]
        ity = nb.type

        def step(blk, accs, scale=None):
            # scale(j, k): row j's fp16 field k (0: d, 1: m) as <32 x float>; else loaded here
            base = builder.mul(blk, _c(ity, nbytes))
            xv = _vload(builder, x, builder.mul(blk, _c(ity, QK)), V32F, 4)
            if scale is None:
                def scale(j, k):
                    return _splat(builder, _f16_at(builder, ws[j], builder.add(base, _c(ity, 2 * k))), 32)
            for j in range(ROWS):
                t = builder.fmul(builder.fmul(_b32_values(builder, fmt, ws[j], base), xv, flags=FAST), scale(j, 0),
                                 flags=FAST)
                if affine:
                    t = builder.fadd(t, builder.fmul(scale(j, 1), xv, flags=FAST), flags=FAST)
                accs = _accumulate(builder, accs, j, t)
            return accs

        def chunk(c, accs):
            b0 = builder.mul(c, _c(ity, chunk_blocks))
            for j in range(ROWS):
                _prefetch_lines(builder, ps[j], builder.mul(b0, _c(ity, nbytes)), (chunk_blocks * nbytes + 63) // 64)
            # the chunk's 16 fp16 scales of a row, gathered into one vector and converted by
            # one instruction (then one lane broadcast per block)
            v16h, v16f = ir.VectorType(I16, chunk_blocks), ir.VectorType(F32, chunk_blocks)
            sv = {}
            for j in range(ROWS):
                for k in range(2 if affine else 1):
                    v = ir.Constant(v16h, ir.Undefined)
                    for u in range(chunk_blocks):
                        off = builder.add(builder.mul(builder.add(b0, _c(ity, u)), _c(ity, nbytes)), _c(ity, 2 * k))
                        h = builder.load(builder.bitcast(builder.gep(ws[j], [off]), I16.as_pointer()), align=1)
                        v = builder.insert_element(v, h, _c(I32, u))
                    sv[j, k] = builder.fpext(builder.bitcast(v, ir.VectorType(HALF, chunk_blocks)), v16f)
            for u in range(chunk_blocks):
                accs = step(builder.add(b0, _c(ity, u)), accs, lambda j, k, u=u: _splat_lane(builder, sv[j, k], u, 32))
            return accs

        nchunk = builder.sdiv(nb, _c(ity, chunk_blocks))
        accs = _loop(builder, nchunk, _zeros_struct(ROWS), chunk)
        accs = _loop(builder, nb, accs, step, start=builder.mul(nchunk, _c(ity, chunk_blocks)))
        return context.make_tuple(builder, sig.return_type,
                                  [_hsum(builder, builder.extract_value(accs, j)) for j in range(ROWS)])

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
# types (Q8_0, Q4_0, Q5_0) then sum as ggml: per block one fma by d_w·d_x into 8 float lanes,
# block after block (AVX-512: two rows' 8 lanes in one zmm); the others multiply the 16 lanes
# by the pair's d_w·d_x and add (AVX-512: four blocks per step, ``_quad_quants``).
#
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
V16I32 = ir.VectorType(I32, 16)
V16F = ir.VectorType(F32, 16)
V8F = ir.VectorType(F32, 8)
V64I8 = ir.VectorType(I8, 64)


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


INT_DOT_NAMES = {"avx512vnni": "AVX-512 VNNI vpdpbusd", "avxvnni": "AVX-VNNI vpdpbusd",
                 "avx2": "AVX2 pmaddubsw", "generic": "portable integer IR"}


def _declare(b, name, ret, args):
    fn = b.module.globals.get(name)
    return fn if fn is not None else ir.Function(b.module, ir.FunctionType(ret, args), name)


def _split(b, v, lo, n):
    return b.shuffle_vector(v, v, _c(ir.VectorType(I32, n), list(range(lo, lo + n))))


def _concat(b, x, y):
    n = x.type.count
    return b.shuffle_vector(x, y, _c(ir.VectorType(I32, 2 * n), list(range(2 * n))))


def _idot_u8s8(b, u, s, how, acc=None):
    """<16 x i32>: lane l = acc[l] + Σ_{i<4} u[4l+i]·s[4l+i] for <64 x i8> u (unsigned) and s
    (signed); acc (<16 x i32>) only with the VNNI ``how``s, whose vpdpbusd adds into it."""
    V8I32 = ir.VectorType(I32, 8)
    if how == "avx512vnni":
        fn = _declare(b, "llvm.x86.avx512.vpdpbusd.512", V16I32, [V16I32] * 3)
        return b.call(fn, [_c(V16I32, [0] * 16) if acc is None else acc, b.bitcast(u, V16I32), b.bitcast(s, V16I32)])
    assert acc is None or how == "avxvnni"
    halves = []
    for h in (0, 32):
        uh, sh = _split(b, u, h, 32), _split(b, s, h, 32)
        if how == "avxvnni":
            fn = _declare(b, "llvm.x86.avx512.vpdpbusd.256", V8I32, [V8I32] * 3)
            start = _c(V8I32, [0] * 8) if acc is None else _split(b, acc, h // 4, 8)
            halves.append(b.call(fn, [start, b.bitcast(uh, V8I32), b.bitcast(sh, V8I32)]))
        elif how == "avx2":
            V16I16 = ir.VectorType(I16, 16)
            p16 = b.call(_declare(b, "llvm.x86.avx2.pmadd.ub.sw", V16I16, [V32I8, V32I8]), [uh, sh])
            halves.append(b.call(_declare(b, "llvm.x86.avx2.pmadd.wd", V8I32, [V16I16, V16I16]),
                                 [p16, _c(V16I16, [1] * 16)]))
        else:
            V32I32 = ir.VectorType(I32, 32)
            prod = b.mul(b.zext(uh, V32I32), b.sext(sh, V32I32))
            parts = [b.shuffle_vector(prod, prod, _c(V8I32, list(range(i, 32, 4)))) for i in range(4)]
            halves.append(b.add(b.add(parts[0], parts[1]), b.add(parts[2], parts[3])))
    return _concat(b, halves[0], halves[1])


# The 4/5-bit types' pair order: both blocks' low nibbles (values 0-15 of block a, then of b),
# then both high nibbles (values 16-31): two 16-byte loads, one AND and one shift on 32 bytes.
PAIR_ORDER = list(range(16)) + list(range(32, 48)) + list(range(16, 32)) + list(range(48, 64))


def _lookup16_pshufb(b, n, how):
    """kvalues_iq4nl[n] for a <64 x i8> of nibbles: vpshufb on the 16-entry table (AVX-512BW
    zmm or two AVX2 ymm), the select tree elsewhere."""
    if how == "avx512vnni":
        fn = _declare(b, "llvm.x86.avx512.pshuf.b.512", V64I8, [V64I8, V64I8])
        return b.call(fn, [_c(V64I8, list(KVALUES_IQ4NL) * 4), n])
    if how in ("avxvnni", "avx2"):
        fn = _declare(b, "llvm.x86.avx2.pshuf.b", V32I8, [V32I8, V32I8])
        t = _c(V32I8, list(KVALUES_IQ4NL) * 2)
        return _concat(b, b.call(fn, [t, _split(b, n, 0, 32)]), b.call(fn, [t, _split(b, n, 32, 32)]))
    return _concat(b, _lookup16(b, _split(b, n, 0, 32)), _lookup16(b, _split(b, n, 32, 32)))


def _pair_quants(b, fmt, p, base, how, natural=False):
    """<64 x i8>: blocks a (at ``base``) and b (the next) as the integer dot's first operand:
    Q8_0 in natural order (a's 32 then b's 32), the 4/5-bit types in PAIR_ORDER (``natural``:
    in natural order too) without their offset (unsigned nibbles, IQ4_NL's table values signed)."""
    ty = base.type
    nb = B32_BYTES[fmt]
    if fmt == "q8_0":
        return _concat(b, _b32_quants(b, fmt, p, base), _b32_quants(b, fmt, p, b.add(base, _c(ty, nb))))
    if natural:  # each block's low nibbles then its high ones: values 0-31 of a, then of b
        V16I8 = ir.VectorType(I8, 16)
        qs = [_vload(b, p, b.add(base, _c(ty, B32_QS[fmt] + nb * h)), V16I8, 1) for h in (0, 1)]
        packed = _concat(b, qs[0], qs[1])  # one AND and one shift on both blocks, one 128-bit shuffle
        lo, hi = b.and_(packed, _c(V32I8, [15] * 32)), b.lshr(packed, _c(V32I8, [4] * 32))
        n = b.shuffle_vector(lo, hi, _c(ir.VectorType(I32, 64), list(range(16)) + list(range(32, 48))
                                        + list(range(16, 32)) + list(range(48, 64))))
        if fmt == "iq4_nl":
            return _lookup16_pshufb(b, n, how)
        if fmt in ("q5_0", "q5_1"):  # the fifth bits: qh of a then of b, one 64-lane mask
            I64 = ir.IntType(64)
            qh = [b.zext(b.load(b.bitcast(b.gep(p, [b.add(base, _c(ty, B32_QS[fmt] - 4 + nb * h))]), I32.as_pointer()),
                                align=1), I64) for h in (0, 1)]
            mask = b.bitcast(b.or_(qh[0], b.shl(qh[1], _c(I64, 32))), ir.VectorType(ir.IntType(1), 64))
            n = b.or_(n, b.select(mask, _c(V64I8, [16] * 64), _c(V64I8, [0] * 64)))
        return n
    V16I8 = ir.VectorType(I8, 16)
    qs = [_vload(b, p, b.add(base, _c(ty, B32_QS[fmt] + nb * h)), V16I8, 1) for h in (0, 1)]
    packed = _concat(b, qs[0], qs[1])
    n = _concat(b, b.and_(packed, _c(V32I8, [15] * 32)), b.lshr(packed, _c(V32I8, [4] * 32)))
    if fmt == "iq4_nl":
        return _lookup16_pshufb(b, n, how)
    if fmt in ("q5_0", "q5_1"):  # the fifth bits: both qh words as one 64-lane mask in PAIR_ORDER
        I64 = ir.IntType(64)
        qh = [b.zext(b.load(b.bitcast(b.gep(p, [b.add(base, _c(ty, B32_QS[fmt] - 4 + nb * h))]), I32.as_pointer()),
                            align=1), I64) for h in (0, 1)]
        lo16 = _c(I64, 0xFFFF)
        m = b.or_(b.or_(b.and_(qh[0], lo16), b.shl(b.and_(qh[1], lo16), _c(I64, 16))),
                  b.or_(b.shl(b.lshr(qh[0], _c(I64, 16)), _c(I64, 32)), b.shl(b.lshr(qh[1], _c(I64, 16)), _c(I64, 48))))
        mask = b.bitcast(m, ir.VectorType(ir.IntType(1), 64))  # lane l = bit l (kmovq + masked move)
        n = b.or_(n, b.select(mask, _c(V64I8, [16] * 64), _c(V64I8, [0] * 64)))
    return n


# Blocks up to this many bytes gather their chunk's scales with _strided_words, not one scalar
# load and one vpinsrw per block and row. The kernels alone, rows in L2, one AMD EPYC (znver4)
# thread, two alternated runs (benchmarks/kernels_in_cache.py's kernel_gb_s): Q4_0 (18 bytes)
# 22.2/22.3 -> 23.5/23.3 GB/s, Q4_1 (20) 19.2/21.4 -> 22.9/22.4, Q5_0 (22) 18.8/18.8 ->
# 19.8/19.6, IQ4_NL (18) 17.9/17.1 -> 17.9/18.4; Q5_1 (24) 16.4/18.4 -> 16.5/15.6 and Q8_0
# (34: four words per permute, two loads each) 33.3/34.2 -> 31.9/32.3 keep the inserts.
STRIDED_WORDS_MAX = 22


def _strided_words(b, p, base, stride, n):
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
        start = b.add(base, _c(ty, q * g * stride))
        lo = _vload(b, p, start, V32H, 1)
        hi = _vload(b, p, b.add(start, _c(ty, off2)), V32H, 1) if last > 64 else lo
        idx = []
        for u in range(g):
            o = u * stride
            idx.append(o // 2 if o + 2 <= 64 else 32 + (o - off2) // 2)
            assert o + 2 <= 64 or 0 <= o - off2 <= 62
        groups.append(b.shuffle_vector(lo, hi, _c(ir.VectorType(I32, g), idx)))
    while len(groups) > 1:  # concatenate the groups' words in block order
        groups = [b.shuffle_vector(groups[i], groups[i + 1], _c(ir.VectorType(I32, 2 * groups[i].type.count),
                                                                 list(range(2 * groups[i].type.count))))
                  for i in range(0, len(groups), 2)]
    return groups[0]


# How _quad_quants gathers a quad's quant bytes: two 64-byte loads and one vpermt2b, or four
# 16-byte loads and inserts. The kernels alone, rows in L2, one AMD EPYC (znver4) thread, k 4096,
# alternated runs (kernels_in_cache.py's kernel_gb_s): Q4_0 35.2/31.9 against 30.9/30.5 GB/s,
# Q4_1 29.6/33.2 against 29.5/29.5, IQ4_NL 25.2/25.7 against 23.6/23.6; Q5_0 19.9/19.8 against
# 23.3/22.5 and Q5_1 23.6/23.1 (with the fifth bits by vpshufbitqmb) against 25.3/25.0.
QUAD_INSERT = {"q5_0", "q5_1"}


def _quad_quants(b, fmt, p, base):
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
        lo_ld = _vload(b, p, base, V64I8, 1)
        off2 = span - 64
        hi_ld = _vload(b, p, b.add(base, _c(ty, off2)), V64I8, 1)
        idx = []
        for q in range(4):
            for i in range(16):
                o = q * nb + qs + i
                idx.append(o if o < 64 else 64 + o - off2)
        packed = b.shuffle_vector(lo_ld, hi_ld, _c(ir.VectorType(I32, 64), idx))
    else:
        V16I8 = ir.VectorType(I8, 16)
        parts = [_vload(b, p, b.add(base, _c(ty, q * nb + qs)), V16I8, 1) for q in range(4)]
        packed = _concat(b, _concat(b, parts[0], parts[1]), _concat(b, parts[2], parts[3]))
    lo = b.and_(packed, _c(V64I8, [15] * 64))
    hi = b.lshr(packed, _c(V64I8, [4] * 64))
    if fmt == "iq4_nl":
        return _lookup16_pshufb(b, lo, "avx512vnni"), _lookup16_pshufb(b, hi, "avx512vnni")
    if fmt in ("q5_0", "q5_1"):  # the fifth bits: qh bit i of block q to lane 16q+i (lo), 16+i (hi)
        I64 = ir.IntType(64)
        qh = [b.zext(b.load(b.bitcast(b.gep(p, [b.add(base, _c(ty, qs - 4 + nb * q))]), I32.as_pointer()),
                            align=1), I64) for q in range(4)]
        lo16 = _c(I64, 0xFFFF)
        mlo = mhi = None
        for q in range(4):
            a = b.shl(b.and_(qh[q], lo16), _c(I64, 16 * q))
            c = b.shl(b.lshr(qh[q], _c(I64, 16)), _c(I64, 16 * q))
            mlo = a if mlo is None else b.or_(mlo, a)
            mhi = c if mhi is None else b.or_(mhi, c)
        V1 = ir.VectorType(ir.IntType(1), 64)
        s16, z = _c(V64I8, [16] * 64), _c(V64I8, [0] * 64)
        lo = b.or_(lo, b.select(b.bitcast(mlo, V1), s16, z))
        hi = b.or_(hi, b.select(b.bitcast(mhi, V1), s16, z))
    return lo, hi


def _quad_x(b, xq, blk, ity):
    """(x_lo, x_hi) for the quad of blocks from ``blk``: values 0-15 and 16-31 of each of the four
    blocks, in _quad_quants' lane order (16-byte granules: vshufi64x2)."""
    x0 = _vload(b, xq, b.mul(blk, _c(ity, QK)), V64I8, 1)
    x1 = _vload(b, xq, b.mul(b.add(blk, _c(ity, 2)), _c(ity, QK)), V64I8, 1)
    lo = [16 * g + i for g in (0, 2, 4, 6) for i in range(16)]
    hi = [16 * g + i for g in (1, 3, 5, 7) for i in range(16)]
    v = ir.VectorType(I32, 64)
    return b.shuffle_vector(x0, x1, _c(v, lo)), b.shuffle_vector(x0, x1, _c(v, hi))


def _zeros_f32(k, lanes=16):  # a struct of k zero <lanes x float>
    vt = ir.VectorType(F32, lanes)
    z = _c(vt, [0.0] * lanes)
    return ir.Constant(ir.LiteralStructType([vt] * k), [z] * k)


def _dot4_b32_int_codegen(fmt):
    nbytes = B32_BYTES[fmt]
    affine = fmt in B32_AFFINE
    # the Q8_0 partners as ggml sums them (BLOCKWISE): each block's signed integer dot in 8 lanes,
    # fma'd block after block; the affine types: the minimum a per-block float term m_w·s_x
    blockwise = fmt in BLOCKWISE
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
        ws = [_data(context, builder, sig.args[j], args[j]) for j in range(ROWS)]
        ps = [_data(context, builder, sig.args[ROWS + j], args[ROWS + j]) for j in range(ROWS)]
        xq, xd, xs = (_data(context, builder, sig.args[2 * ROWS + u], args[2 * ROWS + u]) for u in range(3))
        nb = args[2 * ROWS + 3]
        ity = nb.type

        def operands(w, x):  # (unsigned, signed) bytes whose products are q_w·q_x
            if offset:  # the stored unsigned n to the signed value n − offset
                w = builder.sub(w, _c(w.type, [offset] * w.type.count))
            elif not signed:
                return w, x
            neg = builder.icmp_signed("<", w, _c(w.type, [0] * w.type.count))
            zero = _c(w.type, [0] * w.type.count)
            return builder.select(neg, builder.sub(zero, w), w), builder.select(neg, builder.sub(zero, x), x)

        def add_to(accs, j, v):
            return builder.insert_value(accs, builder.fadd(builder.extract_value(accs, j), v, flags=FAST), j)

        def shift_w(j, base):  # the field multiplying s_x: m_w (affine) or −offset·d_w
            if affine:
                return _f16_at(builder, ws[j], builder.add(base, _c(ity, 2)))
            return builder.fmul(_f16_at(builder, ws[j], base), _c(F32, -float(B32_OFFSET[fmt])), flags=FAST)

        # with VNNI (vpdpbusd: unsigned · signed bytes, no saturation), the signed weights as
        # unsigned n = q_w + bias (Q8_0 / IQ4_NL q_w xor 0x80, Q4_0 / Q5_0 their stored n) and
        # each lane started from −bias·Σ₄q_x: Σ₄ n·q_x − bias·Σ₄q_x = Σ₄ q_w·q_x exactly
        bias = 128 if signed else offset
        biased = bias and how in ("avx512vnni", "avxvnni")
        m128 = _c(V64I8, [-128] * 64)
        mbias = _c(V64I8, [bias - 256 if bias > 127 else bias] * 64)

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
            return builder.shuffle_vector(v, v, _c(ir.VectorType(I32, 8), list(range(8 * (j % 2), 8 * (j % 2) + 8))))

        def set8(accs, j, a8):
            if not packed:
                return builder.insert_value(accs, a8, j)
            v = builder.extract_value(accs, j // 2)
            w16 = builder.shuffle_vector(a8, a8, _c(V16I32, list(range(8)) * 2))
            idx = [16 + i if (i // 8) == j % 2 else i for i in range(16)]
            return builder.insert_value(accs, builder.shuffle_vector(v, w16, _c(V16I32, idx)), j // 2)

        def pair_x(b0, u):
            # x for blocks b0+u, b0+u+1 of the chunk, in _pair_quants' order (permuted once for
            # the four rows), and for signed weights with VNNI (no pmaddubsw saturation)
            # −128·Σ₄q_x: each row's vpdpbusd starts from it and sums Σ₄(q_w+128)·q_x, one
            # vpdpbusd and one xor per row. (Biasing x instead needs −128·Σ₄q_w per row: two
            # vpdpbusd, two zeroed accumulators and a subtraction. Four Q8_0 rows in L1, one
            # thread: 33.4 GB/s against 29.9.)
            blk = builder.add(b0, _c(ity, u))
            x = _vload(builder, xq, builder.mul(blk, _c(ity, QK)), V64I8, 1)
            if fmt != "q8_0" and not natural:
                x = builder.shuffle_vector(x, x, _c(ir.VectorType(I32, 64), PAIR_ORDER))
            corr = builder.sub(_c(V16I32, [0] * 16), _idot_u8s8(builder, mbias, x, how)) if biased else None
            return x, corr

        def pair(b0, u, j, x, corr, accs, sv):
            # row j's blocks b0+u, b0+u+1; sv[j]: the chunk's d_w·d_x of row j
            blk = builder.add(b0, _c(ity, u))
            lanes = [u] * 8 + [u + 1] * 8 if blockwise else ([u] * 4 + [u + 1] * 4) * 2
            w = _pair_quants(builder, fmt, ws[j], builder.mul(blk, _c(ity, nbytes)), how, natural=natural)
            if biased:
                isum = _idot_u8s8(builder, unsigned_w(w), x, how, acc=corr)
            else:
                isum = _idot_u8s8(builder, *operands(w, x), how)
            sc = builder.shuffle_vector(sv[j], sv[j], _c(V16I32, lanes))
            if blockwise:  # ggml's order: block u, then u+1, fused into the same 8 lanes
                return fma8_blocks(accs, j, builder.sitofp(isum, V16F), sc, 2)
            return add_to(accs, j, builder.fmul(builder.sitofp(isum, V16F), sc, flags=FAST))

        def pair_isum(b0, u, j, x, corr):  # row j's <16 x i32> for blocks b0+u, b0+u+1
            blk = builder.add(b0, _c(ity, u))
            w = _pair_quants(builder, fmt, ws[j], builder.mul(blk, _c(ity, nbytes)), how, natural=natural)
            return _idot_u8s8(builder, unsigned_w(w), x, how, acc=corr)

        def pair2(b0, u, k, x, corr, accs, sv):
            # rows 2k, 2k+1, blocks b0+u, b0+u+1 (packed): per block the two rows' int lanes side by
            # side (one vshuff32x4), converted, one fma by [d_w·d_x of row 2k ×8, of row 2k+1 ×8]
            fma = _declare(builder, "llvm.fma.v16f32", V16F, [V16F] * 3)
            p0, p1 = (builder.sitofp(pair_isum(b0, u, 2 * k + r, x, corr), V16F) for r in (0, 1))
            a = builder.extract_value(accs, k)
            for blk in (0, 1):
                lo, hi = units[blk]
                idx = [4 * lo + i for i in range(4)] + [4 * hi + i for i in range(4)]
                v = builder.shuffle_vector(p0, p1, _c(V16I32, idx + [16 + i for i in idx]))
                sc = builder.shuffle_vector(sv[2 * k], sv[2 * k + 1], _c(V16I32, [u + blk] * 8 + [16 + u + blk] * 8))
                a = builder.call(fma, [sc, v, a])
            return builder.insert_value(accs, a, k)

        def fma8_blocks(accs, j, p, sc, nblocks):
            # Q8_0 as ggml sums it (vec_dot_q8_0_q8_0 and tinyBLAS alike): per block, 8 lanes of
            # 4-product integer sums, acc = fma(d_w·d_x, lanes, acc) block after block, one 8-lane
            # accumulator (Q8_0's accumulators are <8 x float>), reduced by _hsum's tree as
            # hsum_float_8 does. Pairs summed 16 lanes wide gave another rounding.
            mod = builder.module
            fma = mod.globals.get("llvm.fma.v8f32") or ir.Function(mod, ir.FunctionType(V8F, [V8F] * 3), "llvm.fma.v8f32")
            a8 = get8(accs, j)
            for k in range(nblocks):
                idx = _c(ir.VectorType(I32, 8), list(range(8 * k, 8 * k + 8)))
                a8 = builder.call(fma, [builder.shuffle_vector(p, p, idx), builder.shuffle_vector(sc, sc, idx), a8])
            return set8(accs, j, a8)

        def chunk(c, accs):
            return chunk_at(builder.mul(c, _c(ity, chunk_blocks)), accs)

        def chunk_at(b0, accs, first=None):
            # blocks b0 .. b0+15; with ``first``, those before it count zero (their scales and
            # shift terms selected to 0: fma(0, p, acc) and acc + 0 leave acc as it was)
            if first is None:
                keep = None
            else:
                keep = builder.icmp_signed(">=", builder.add(_splat(builder, b0, chunk_blocks),
                                                             _c(ir.VectorType(ity, chunk_blocks), list(range(chunk_blocks)))),
                                           _splat(builder, first, chunk_blocks))

            def masked(v):
                return v if keep is None else builder.select(keep, v, _c(V16F, [0.0] * 16))
            # the rows passed as p (the group AHEAD on) at this chunk's offset, into L2 (prefetcht1;
            # measured with the next group, AHEAD = 1). Llama-3.1-8B-
            # dims Q8_0 matrices, 2 threads, ÷ an integer read of the same pages, 8 alternated
            # rounds, two runs each: into L1 0.883/0.877, into L2 0.908/0.912; each row's own
            # lines 544 or 1088 bytes on (the float kernels' pattern) 0.80
            for j in range(ROWS):
                _prefetch_lines(builder, ps[j], builder.mul(b0, _c(ity, nbytes)), (chunk_blocks * nbytes + 63) // 64, 2)
            v16h = ir.VectorType(I16, chunk_blocks)

            def f16s(j, k):  # the chunk's 16 fp16 field k (0: d, 1: m) of row j, one conversion
                if how == "avx512vnni" and nbytes <= STRIDED_WORDS_MAX:
                    return builder.fpext(builder.bitcast(_strided_words(builder, ws[j], builder.add(
                        builder.mul(b0, _c(ity, nbytes)), _c(ity, 2 * k)), nbytes, chunk_blocks), ir.VectorType(HALF, chunk_blocks)), V16F)
                v = ir.Constant(v16h, ir.Undefined)
                for u in range(chunk_blocks):
                    off = builder.add(builder.mul(builder.add(b0, _c(ity, u)), _c(ity, nbytes)), _c(ity, 2 * k))
                    v = builder.insert_element(v, builder.load(builder.bitcast(builder.gep(ws[j], [off]),
                                                                               I16.as_pointer()), align=1), _c(I32, u))
                return builder.fpext(builder.bitcast(v, ir.VectorType(HALF, chunk_blocks)), V16F)

            dw = [f16s(j, 0) for j in range(ROWS)]
            dx = _vload(builder, xd, b0, V16F, 4)
            sv = [masked(builder.fmul(dw[j], dx, flags=FAST)) for j in range(ROWS)]
            if shifted:  # lane u: block u's m_w·s_x or −offset·d_w·s_x
                sx = _vload(builder, xs, b0, V16F, 4)
                for j in range(ROWS):
                    f = f16s(j, 1) if affine else builder.fmul(dw[j], _c(V16F, [-float(B32_OFFSET[fmt])] * 16),
                                                               flags=FAST)
                    accs = add_to(accs, ROWS + j, masked(builder.fmul(f, sx, flags=FAST)))
            if quads:
                return quads_of(b0, accs, sv)
            # x (and its −128·Σ₄q_x) for the chunk's pairs once, then row after row: fewer live
            # registers than pair after pair across the rows (Q8_0 ÷ the same pages' read, 8
            # alternated rounds, two runs each: 0.918/0.904 against 0.884/0.897)
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
                xl, xh = _quad_x(builder, xq, builder.add(b0, _c(ity, q)), ity)
                corr = None
                if biased:
                    c = _idot_u8s8(builder, m128, xl, how)
                    corr = builder.sub(_c(V16I32, [0] * 16), _idot_u8s8(builder, m128, xh, how, acc=c))
                xs4.append((xl, xh, corr))
            for j in range(ROWS):
                for qi, q in enumerate(range(0, chunk_blocks, 4)):
                    xl, xh, corr = xs4[qi]
                    blk = builder.add(b0, _c(ity, q))
                    wl, wh = _quad_quants(builder, fmt, ws[j], builder.mul(blk, _c(ity, nbytes)))
                    if biased:
                        isum = _idot_u8s8(builder, builder.xor(wl, m128), xl, how, acc=corr)
                        isum = _idot_u8s8(builder, builder.xor(wh, m128), xh, how, acc=isum)
                    else:
                        isum = _idot_u8s8(builder, wh, xh, how, acc=_idot_u8s8(builder, wl, xl, how))
                    sc = builder.shuffle_vector(sv[j], sv[j], _c(V16I32, [q + u for u in range(4) for _ in range(4)]))
                    accs = add_to(accs, j, builder.fmul(builder.sitofp(isum, V16F), sc, flags=FAST))
            return accs

        def tail(blk, accs):  # one block, its bytes in the first half of a pair (the rest zero)
            base = builder.mul(blk, _c(ity, nbytes))
            z32 = _c(V32I8, [0] * 32)
            x = _concat(builder, _vload(builder, xq, builder.mul(blk, _c(ity, QK)), V32I8, 1), z32)
            dx = builder.load(builder.gep(xd, [blk]))
            zero16 = _c(V16F, [0.0] * 16)
            for j in range(ROWS):
                w = _concat(builder, _b32_quants(builder, fmt, ws[j], base, offset=False), z32)
                isum = _idot_u8s8(builder, *operands(w, x), how)
                sc = _splat(builder, builder.fmul(_f16_at(builder, ws[j], base), dx, flags=FAST), 16)
                if blockwise:
                    accs = fma8_blocks(accs, j, builder.sitofp(isum, V16F), sc, 1)
                else:
                    accs = add_to(accs, j, builder.fmul(builder.sitofp(isum, V16F), sc, flags=FAST))
                if shifted:
                    t = builder.fmul(shift_w(j, base), builder.load(builder.gep(xs, [blk])), flags=FAST)
                    accs = add_to(accs, ROWS + j, builder.insert_element(zero16, t, _c(I32, 0)))
            return accs

        def tail_pair(q, accs):
            # blocks b, b+1 past the last whole chunk (b = first such block + 2q) by the pair
            # step, their scales loaded one by one. Rows of 142 blocks (d 4544, Falcon-7B) leave
            # 14 blocks past the last chunk: four such Q8_0 rows in L1, one thread, 4 interleaved
            # runs: 610-627 ns against 645-693 when each of the 14 took the one-block step
            b = builder.add(builder.mul(nchunk, _c(ity, chunk_blocks)), builder.mul(q, _c(ity, 2)))
            x, corr = pair_x(b, 0)
            dx = [builder.load(builder.gep(xd, [builder.add(b, _c(ity, u))])) for u in (0, 1)]
            zero16 = _c(V16F, [0.0] * 16)
            sv = []
            for j in range(ROWS):
                v = zero16
                for u in (0, 1):
                    base = builder.mul(builder.add(b, _c(ity, u)), _c(ity, nbytes))
                    v = builder.insert_element(v, builder.fmul(_f16_at(builder, ws[j], base), dx[u], flags=FAST),
                                               _c(I32, u))
                    if shifted:
                        t = builder.fmul(shift_w(j, base), builder.load(builder.gep(xs, [builder.add(b, _c(ity, u))])),
                                         flags=FAST)
                        accs = add_to(accs, ROWS + j, builder.insert_element(zero16, t, _c(I32, u)))
                sv.append(v)
            if packed:
                for k in range(ROWS // 2):
                    accs = pair2(b, 0, k, x, corr, accs, sv)
                return accs
            for j in range(ROWS):
                accs = pair(b, 0, j, x, corr, accs, sv)
            return accs

        nchunk = builder.sdiv(nb, _c(ity, chunk_blocks))
        accs = _loop(builder, nchunk, _zeros_f32(ROWS // 2, 16) if packed else _zeros_f32(nacc, 8 if blockwise else 16),
                     chunk)
        # blocks past the last whole chunk: with nb >= 16, one more chunk ending at the row's
        # end, its blocks already counted masked (Falcon-7B's rows of 142 blocks: 8 chunks and
        # 14 blocks. The kernels alone, rows in L2, one AMD EPYC thread, against the 7 pairs:
        # Q4_0 20.8 -> 21.5-22.6 GB/s, Q5_0 17.7-18.1 -> 19.4, Q5_1 15.0-17.2 -> 18.0-18.8, Q8_0
        # 32-37 either way); shorter rows by pairs, then one block
        done = builder.mul(nchunk, _c(ity, chunk_blocks))
        whole = builder.icmp_signed(">=", nb, _c(ity, chunk_blocks))
        ragged = builder.and_(whole, builder.icmp_signed("<", done, nb))
        accs = _loop(builder, builder.zext(ragged, ity), accs,
                     lambda i, a: chunk_at(builder.sub(nb, _c(ity, chunk_blocks)), a, first=done))
        npair = builder.select(whole, _c(ity, 0), builder.sdiv(builder.sub(nb, done), _c(ity, 2)))
        accs = _loop(builder, npair, accs, tail_pair)
        start = builder.add(done, builder.mul(npair, _c(ity, 2)))
        accs = _loop(builder, builder.select(whole, start, nb), accs, tail, start=start)
        out = []
        for j in range(ROWS):
            v = get8(accs, j) if blockwise else builder.extract_value(accs, j)
            if shifted:
                v = builder.fadd(v, builder.extract_value(accs, ROWS + j), flags=FAST)
            out.append(_hsum(builder, v))
        return context.make_tuple(builder, sig.return_type, out)

    return codegen


def _dot4_b32_int(fmt):
    gen = _dot4_b32_int_codegen(fmt)

    def typer(typingctx, w0, w1, w2, w3, p0, p1, p2, p3, xq, xd, xs, nb):
        return types.UniTuple(types.float32, ROWS)(w0, w1, w2, w3, p0, p1, p2, p3, xq, xd, xs, nb), gen

    typer.__name__ = f"dot4i_{fmt}"
    return intrinsic(typer)


# four rows of 32-value blocks · an int8-quantized x (quants, d_x, s_x per block) over nb blocks
dot4i_q8_0, dot4i_q4_0, dot4i_q4_1 = _dot4_b32_int("q8_0"), _dot4_b32_int("q4_0"), _dot4_b32_int("q4_1")
dot4i_q5_0, dot4i_q5_1, dot4i_iq4_nl = _dot4_b32_int("q5_0"), _dot4_b32_int("q5_1"), _dot4_b32_int("iq4_nl")


# --- K-quants: 256-value super-blocks (Q2_K 84 B, Q3_K 110 B, Q4_K 144 B, Q5_K 176 B, Q6_K 210 B,
# IQ4_XS 136 B per block) ----------------------------------------------------------------------
# Layouts as ggml's block_q2_K ... block_iq4_xs. Per super-block and row: the sub-block scales
# are unpacked with scalar integer ops, the quants 32 at a time as vectors. Affine types (Q2_K,
# Q4_K, Q5_K) add −dmin·m·Σx per sub-block from ``xs`` (Σx per sub-block, computed once per
# call and shared by every row).
KQ_TYPES = ("q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_xs")
KQ_BYTES = {t: type_size(t) for t in KQ_TYPES}  # bytes per super-block
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
V32I8 = ir.VectorType(I8, 32)


def _u8(b, p, idx):
    return b.zext(b.load(b.gep(p, [idx])), I32)


def _f16_at(b, p, idx):  # a little-endian fp16 at byte offset idx of a uint8 row
    bits = b.load(b.bitcast(b.gep(p, [idx]), I16.as_pointer()), align=1)
    return b.fpext(b.bitcast(bits, HALF), F32)


def _halves(b, lo, hi):
    """<32 x float>: lanes 0-15 = lo, lanes 16-31 = hi (a scale per 16 values)."""
    v2 = ir.VectorType(F32, 2)
    v = b.insert_element(b.insert_element(ir.Constant(v2, ir.Undefined), lo, _c(I32, 0)), hi, _c(I32, 1))
    return b.shuffle_vector(v, ir.Constant(v2, ir.Undefined), _c(ir.VectorType(I32, 32), [0] * 16 + [1] * 16))


def _bits(b, v, shift, mask):  # (v >> shift) & mask on <32 x i8>, logical shift
    if shift:
        v = b.lshr(v, _c(V32I8, [shift] * 32))
    return b.and_(v, _c(V32I8, [mask] * 32)) if mask is not None else v


def _q4_k_row(b, p, base, xv, xs, q5=False):
    """(Σ_j d·sc_j·Σ q·x as <16 x float>, Σ_j dmin·m_j·Σx_j) for one Q4_K super-block of a row
    (``q5``: a Q5_K one, whose value j·32 + l adds bit j of qh[l] as its fifth bit)."""
    d, dmin = _f16_at(b, p, base), _f16_at(b, p, b.add(base, _c(base.type, 2)))
    s = [_u8(b, p, b.add(base, _c(base.type, Q4K_SCALES + i))) for i in range(12)]
    c = lambda v: _c(I32, v)  # noqa: E731
    sc, m = [], []
    for j in range(8):  # ggml's get_scale_min_k4
        if j < 4:
            sc.append(b.and_(s[j], c(63)))
            m.append(b.and_(s[j + 4], c(63)))
        else:
            sc.append(b.or_(b.and_(s[j + 4], c(15)), b.shl(b.lshr(s[j - 4], c(6)), c(4))))
            m.append(b.or_(b.lshr(s[j + 4], c(4)), b.shl(b.lshr(s[j], c(6)), c(4))))
    acc = None
    lo16, hi16 = _c(ir.VectorType(I32, 16), list(range(16))), _c(ir.VectorType(I32, 16), list(range(16, 32)))
    undef = ir.Constant(V32F, ir.Undefined)
    H = _vload(b, p, b.add(base, _c(base.type, Q5K_QH)), V32I8, 1) if q5 else None
    for jj in range(4):  # 32 bytes: sub-block 2jj in the low nibbles, 2jj + 1 in the high ones
        q = _vload(b, p, b.add(base, _c(base.type, (Q5K_QS if q5 else Q4K_QS) + 32 * jj)), V32I8, 1)
        for half, qv in ((0, _bits(b, q, 0, 15)), (1, _bits(b, q, 4, None))):
            j = 2 * jj + half
            if q5:
                qv = b.or_(qv, b.shl(_bits(b, H, j, 1), _c(V32I8, [4] * 32)))
            # fold the sub-block's 32 products to 16 lanes first (a multiply and a fused
            # multiply-add), then one fused multiply-add by its scale: 3 vector ops, not 4
            pr = b.fmul(b.uitofp(qv, V32F), xv[j], flags=FAST)
            t = b.fadd(b.shuffle_vector(pr, undef, lo16), b.shuffle_vector(pr, undef, hi16), flags=FAST)
            t = b.fmul(t, _splat(b, b.fmul(d, b.uitofp(sc[j], F32), flags=FAST), 16), flags=FAST)
            acc = t if acc is None else b.fadd(acc, t, flags=FAST)
    mins = None
    for j in range(8):
        t = b.fmul(b.fmul(dmin, b.uitofp(m[j], F32), flags=FAST), xs[j], flags=FAST)
        mins = t if mins is None else b.fadd(mins, t, flags=FAST)
    return acc, mins


def _q6_k_row(b, p, base, xv, xs):
    """Σ d·sc·q·x for one Q6_K super-block (ql[128], qh[64], int8 scales[16], fp16 d)."""
    off = lambda k: b.add(base, _c(base.type, k))  # noqa: E731
    d = _f16_at(b, p, off(Q6K_D))
    sc = [b.fmul(d, b.sitofp(b.load(b.gep(p, [off(Q6K_SCALES + i)])), F32), flags=FAST)
          for i in range(16)]
    acc = None
    for n in range(2):  # 128 values each
        A, B = _vload(b, p, off(64 * n), V32I8, 1), _vload(b, p, off(64 * n + 32), V32I8, 1)
        H = _vload(b, p, off(Q6K_QH + 32 * n), V32I8, 1)
        for g, (low, hsh) in enumerate(((_bits(b, A, 0, 15), 0), (_bits(b, B, 0, 15), 2),
                                        (_bits(b, A, 4, None), 4), (_bits(b, B, 4, None), 6))):
            q = b.or_(low, b.shl(_bits(b, H, hsh, 3), _c(V32I8, [4] * 32)))
            qf = b.sitofp(b.sub(q, _c(V32I8, [32] * 32)), V32F)
            s = _halves(b, sc[8 * n + 2 * g], sc[8 * n + 2 * g + 1])
            t = b.fmul(b.fmul(qf, xv[4 * n + g], flags=FAST), s, flags=FAST)
            acc = t if acc is None else b.fadd(acc, t, flags=FAST)
    return acc, None


def _q2_k_row(b, p, base, xv, xs):
    """Q2_K super-block: scales[16] (4-bit scale | 4-bit min), qs[64], fp16 d, fp16 dmin."""
    off = lambda k: b.add(base, _c(base.type, k))  # noqa: E731
    d, dmin = _f16_at(b, p, off(Q2K_D)), _f16_at(b, p, off(Q2K_D + 2))
    s = [_u8(b, p, off(i)) for i in range(16)]
    dl = [b.fmul(d, b.uitofp(b.and_(v, _c(I32, 15)), F32), flags=FAST) for v in s]
    ml = [b.fmul(dmin, b.uitofp(b.lshr(v, _c(I32, 4)), F32), flags=FAST) for v in s]
    acc = mins = None
    for n in range(2):
        Q = _vload(b, p, off(Q2K_QS + 32 * n), V32I8, 1)
        for j in range(4):  # values 128n + 32j + l: bits 2j of qs[32n + l]
            qf = b.uitofp(_bits(b, Q, 2 * j, 3), V32F)
            k = 8 * n + 2 * j
            t = b.fmul(b.fmul(qf, xv[4 * n + j], flags=FAST), _halves(b, dl[k], dl[k + 1]), flags=FAST)
            acc = t if acc is None else b.fadd(acc, t, flags=FAST)
            for u in (k, k + 1):
                t = b.fmul(ml[u], xs[u], flags=FAST)
                mins = t if mins is None else b.fadd(mins, t, flags=FAST)
    return acc, mins


def _q5_k_row(b, p, base, xv, xs):
    return _q4_k_row(b, p, base, xv, xs, q5=True)


def _q3_k_row(b, p, base, xv, xs):
    """Q3_K super-block: hmask[32], qs[64] (2 low bits), scales[12] (16 signed 6-bit), fp16 d."""
    off = lambda k: b.add(base, _c(base.type, k))  # noqa: E731
    d = _f16_at(b, p, off(Q3K_D))
    s = [_u8(b, p, off(Q3K_SCALES + i)) for i in range(12)]
    dl = []
    for k in range(16):  # low 4 bits from bytes 0-7, high 2 bits from bytes 8-11 (gguf-py's Q3_K)
        lo = b.and_(b.lshr(s[k % 8], _c(I32, 4 * (k // 8))), _c(I32, 15))
        hi = b.and_(b.lshr(s[8 + k % 4], _c(I32, 2 * (k // 4))), _c(I32, 3))
        sc = b.sub(b.or_(lo, b.shl(hi, _c(I32, 4))), _c(I32, 32))
        dl.append(b.fmul(d, b.sitofp(sc, F32), flags=FAST))
    H = _vload(b, p, off(0), V32I8, 1)
    acc = None
    for n in range(2):
        Q = _vload(b, p, off(Q3K_QS + 32 * n), V32I8, 1)
        for j in range(4):  # values 128n + 32j + l: bits 2j of qs[32n + l], bit 4n + j of hmask[l]
            hb = b.shl(_bits(b, H, 4 * n + j, 1), _c(V32I8, [2] * 32))  # 4 when set, else the −4 offset
            q = b.sub(b.or_(_bits(b, Q, 2 * j, 3), hb), _c(V32I8, [4] * 32))
            k = 8 * n + 2 * j
            t = b.fmul(b.fmul(b.sitofp(q, V32F), xv[4 * n + j], flags=FAST), _halves(b, dl[k], dl[k + 1]),
                       flags=FAST)
            acc = t if acc is None else b.fadd(acc, t, flags=FAST)
    return acc, None


def _iq4_xs_row(b, p, base, xv, xs):
    """IQ4_XS super-block: fp16 d, scales_h (2 bits × 8), scales_l (4 bits × 8), qs[128] whose
    nibbles index kvalues_iq4nl; sub-block j: 16 bytes, low nibbles then high ones."""
    off = lambda k: b.add(base, _c(base.type, k))  # noqa: E731
    d = _f16_at(b, p, off(0))
    sh = b.or_(_u8(b, p, off(2)), b.shl(_u8(b, p, off(3)), _c(I32, 8)))
    acc = None
    for j in range(8):
        lo = b.and_(b.lshr(_u8(b, p, off(IQ4XS_SL + j // 2)), _c(I32, 4 * (j % 2))), _c(I32, 15))
        hi = b.and_(b.lshr(sh, _c(I32, 2 * j)), _c(I32, 3))
        sc = b.fmul(d, b.sitofp(b.sub(b.or_(lo, b.shl(hi, _c(I32, 4))), _c(I32, 32)), F32), flags=FAST)
        q = b.sitofp(_lookup16(b, _nibbles(b, p, off(IQ4XS_QS + 16 * j))), V32F)
        t = b.fmul(b.fmul(q, xv[j], flags=FAST), _splat(b, sc, 32), flags=FAST)
        acc = t if acc is None else b.fadd(acc, t, flags=FAST)
    return acc, None


_KQ_ROW = {"q2_k": (_q2_k_row, 16), "q3_k": (_q3_k_row, 0), "q4_k": (_q4_k_row, 8), "q5_k": (_q5_k_row, 8),
           "q6_k": (_q6_k_row, 0), "iq4_xs": (_iq4_xs_row, 0)}  # row fn, Σx per super-block


def _dot4_kq_codegen(fmt):
    row_fn, nxs = _KQ_ROW[fmt]
    nbytes = KQ_BYTES[fmt]

    def codegen(context, builder, sig, args):
        # args: w0..w3, p0..p3 (uint8 rows), x, xs (Σx per sub-block; unused by Q6_K), nsb
        ws = [_data(context, builder, sig.args[j], args[j]) for j in range(ROWS)]
        ps = [_data(context, builder, sig.args[ROWS + j], args[ROWS + j]) for j in range(ROWS)]
        x = _data(context, builder, sig.args[2 * ROWS], args[2 * ROWS])
        xsum = _data(context, builder, sig.args[2 * ROWS + 1], args[2 * ROWS + 1])
        nsb = args[2 * ROWS + 2]
        ity = nsb.type
        VT = ir.VectorType(F32, 16 if fmt in ("q4_k", "q5_k") else 32)  # the row function's accumulator width
        ST = ir.LiteralStructType([VT] * ROWS + [F32] * ROWS)
        init = ir.Constant(ST, [_c(VT, [0.0] * VT.count)] * ROWS + [_c(F32, 0.0)] * ROWS)

        def body(sb, accs):
            base = builder.mul(sb, _c(ity, nbytes))
            xo = builder.mul(sb, _c(ity, QK_K))
            xv = [_vload(builder, x, builder.add(xo, _c(ity, 32 * u)), V32F, 4) for u in range(8)]
            xo = builder.mul(sb, _c(ity, max(1, nxs)))
            xs = [builder.load(builder.gep(xsum, [builder.add(xo, _c(ity, u))])) for u in range(nxs)]
            for r in range(ROWS):
                _prefetch_lines(builder, ps[r], base, (nbytes + 63) // 64)
                vec, mins = row_fn(builder, ws[r], base, xv, xs)
                accs = _accumulate(builder, accs, r, vec)
                if mins is not None:
                    accs = builder.insert_value(accs, builder.fsub(builder.extract_value(accs, ROWS + r), mins,
                                                                   flags=FAST), ROWS + r)
            return accs

        accs = _loop(builder, nsb, init, body)
        out = [builder.fadd(_hsum(builder, builder.extract_value(accs, r)), builder.extract_value(accs, ROWS + r),
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
V32I16 = ir.VectorType(I16, 32)
V16I16 = ir.VectorType(I16, 16)
V8I32 = ir.VectorType(I32, 8)
KQ_INT = ("q4_k", "q5_k", "q6_k", "iq4_xs", "q2_k", "q3_k")  # K-quants with an int8-activation kernel
KQ_DOT_NAMES = {"avx512vnni": "AVX-512 pmaddubsw + VNNI vpdpwssd", "avxvnni": "AVX2 pmaddubsw + pmaddwd",
                "avx2": "AVX2 pmaddubsw + pmaddwd", "generic": "portable integer IR"}  # as arithmetic_label says


def _maddubs(b, u, s, how):
    """<32 x i16>: lane l = u[2l]·s[2l] + u[2l+1]·s[2l+1], <64 x i8> u unsigned, s signed."""
    if how == "avx512vnni":
        return b.call(_declare(b, "llvm.x86.avx512.pmaddubs.w.512", V32I16, [V64I8, V64I8]), [u, s])
    if how in ("avxvnni", "avx2"):
        fn = _declare(b, "llvm.x86.avx2.pmadd.ub.sw", V16I16, [V32I8, V32I8])
        return _concat(b, b.call(fn, [_split(b, u, 0, 32), _split(b, s, 0, 32)]),
                       b.call(fn, [_split(b, u, 32, 32), _split(b, s, 32, 32)]))
    V64I16 = ir.VectorType(I16, 64)
    prod = b.mul(b.zext(u, V64I16), b.sext(s, V64I16))
    return b.add(_evens(b, prod), _odds(b, prod))


def _evens(b, v):
    n = v.type.count
    return b.shuffle_vector(v, v, _c(ir.VectorType(I32, n // 2), list(range(0, n, 2))))


def _odds(b, v):
    n = v.type.count
    return b.shuffle_vector(v, v, _c(ir.VectorType(I32, n // 2), list(range(1, n, 2))))


def _madd_wd(b, a, s, how):
    """<n/2 x i32>: lane l = a[2l]·s[2l] + a[2l+1]·s[2l+1] for <n x i16> a, s (n 16 or 32)."""
    n = a.type.count
    if how != "generic":
        if n == 32 and how == "avx512vnni":
            return b.call(_declare(b, "llvm.x86.avx512.pmaddw.d.512", V16I32, [V32I16, V32I16]), [a, s])
        fn = _declare(b, "llvm.x86.avx2.pmadd.wd", V8I32, [V16I16, V16I16])
        parts = [b.call(fn, [_split(b, a, h, 16), _split(b, s, h, 16)]) for h in range(0, n, 16)]
        return parts[0] if len(parts) == 1 else _concat(b, parts[0], parts[1])
    VT = ir.VectorType(I32, n)
    prod = b.mul(b.sext(a, VT), b.sext(s, VT))
    return b.add(_evens(b, prod), _odds(b, prod))


def _madd_acc(b, acc, a, s, how):
    """acc (<16 x i32>) + _madd_wd(a, s): one vpdpwssd with AVX-512 VNNI."""
    if how == "avx512vnni":
        fn = _declare(b, "llvm.x86.avx512.vpdpwssd.512", V16I32, [V16I32] * 3)
        return b.call(fn, [acc, b.bitcast(a, V16I32), b.bitcast(s, V16I32)])
    return b.add(acc, _madd_wd(b, a, s, how))


def _i32_at(b, p, idx):
    return b.load(b.bitcast(b.gep(p, [idx]), I32.as_pointer()), align=1)


def _q4_k_scales_mins(b, p, base):
    """<16 x i8>: the 8 six-bit scales then the 8 six-bit mins of a Q4_K super-block (ggml's
    utmp unpacking of scales[12]: three 32-bit words, masks 0x3f3f3f3f/0x0f0f0f0f/0x03030303)."""
    s0, s1, s2 = (_i32_at(b, p, b.add(base, _c(base.type, Q4K_SCALES + 4 * i))) for i in range(3))
    k1, k2, k3 = _c(I32, 0x3F3F3F3F), _c(I32, 0x0F0F0F0F), _c(I32, 0x03030303)
    u3 = b.or_(b.and_(b.lshr(s2, _c(I32, 4)), k2), b.shl(b.and_(b.lshr(s1, _c(I32, 6)), k3), _c(I32, 4)))
    u2 = b.and_(s1, k1)
    u1 = b.or_(b.and_(s2, k2), b.shl(b.and_(b.lshr(s0, _c(I32, 6)), k3), _c(I32, 4)))
    u0 = b.and_(s0, k1)
    v = ir.Constant(ir.VectorType(I32, 4), ir.Undefined)
    for i, u in enumerate((u0, u1, u2, u3)):
        v = b.insert_element(v, u, _c(I32, i))
    return b.bitcast(v, ir.VectorType(I8, 16))


def _spread(b, v16, lanes, ext):
    """<len(lanes) x i16>: bytes v16[lanes[i]] widened (ext: b.zext or b.sext)."""
    n = len(lanes)
    return ext(b.shuffle_vector(v16, v16, _c(ir.VectorType(I32, n), lanes)), ir.VectorType(I16, n))


def _q4_k_row_int(b, p, base, xv, bs, how, q5=False):
    """(Σ_j sc_j·Σ q·q_x as <16 x i32>, Σ_j m_j·(its two bsums) as <8 x i32>) for one Q4_K
    super-block (``q5``: Q5_K, value j·32 + l adding bit j of qh[l] as its fifth bit, 0..31);
    xv: the block's 256 q_x as four <64 x i8>, bs: its bsums <16 x i16>."""
    sm = _q4_k_scales_mins(b, p, base)
    acc = _c(V16I32, [0] * 16)
    if how == "avx512vnni":
        # xv as the caller arranged it for Q4_K/Q5_K. 64 bytes at a time: the low nibbles are
        # sub-blocks 4h and 4h + 2, the high ones 4h + 1 and 4h + 3; each sub-block's scale
        # spread by one word permute of the eight scales widened once. Q5_K's fifth bits: qh
        # twice in one vector, bit j of byte l tested per lane (vptestmb) and added as 16
        s16 = b.zext(b.shuffle_vector(sm, sm, _c(ir.VectorType(I32, 8), list(range(8)))), ir.VectorType(I16, 8))
        if q5:
            h32 = _vload(b, p, b.add(base, _c(base.type, Q5K_QH)), V32I8, 1)
            H64 = _concat(b, h32, h32)
            zero, sixteen = _c(V64I8, [0] * 64), _c(V64I8, [16] * 64)
        for h in range(2):
            q = _vload(b, p, b.add(base, _c(base.type, (Q5K_QS if q5 else Q4K_QS) + 64 * h)), V64I8, 1)
            for part, w in enumerate((b.and_(q, _c(V64I8, [15] * 64)), b.lshr(q, _c(V64I8, [4] * 64)))):
                j = 4 * h + part
                if q5:
                    bit = b.icmp_unsigned("!=", b.and_(H64, _c(V64I8, [1 << j] * 32 + [1 << (j + 2)] * 32)), zero)
                    w = b.or_(w, b.select(bit, sixteen, zero))
                sc = b.shuffle_vector(s16, s16, _c(ir.VectorType(I32, 32), [j] * 16 + [j + 2] * 16))
                acc = _madd_acc(b, acc, _maddubs(b, w, xv[2 * h + part], how), sc, how)
        mins = _madd_wd(b, _spread(b, sm, [8 + i // 2 for i in range(16)], b.zext), bs, how)
        return acc, mins
    H = _vload(b, p, b.add(base, _c(base.type, Q5K_QH)), V32I8, 1) if q5 else None
    sixteen = _c(V32I8, [16] * 32)
    for jj in range(4):  # 32 bytes: sub-block 2jj in the low nibbles, 2jj + 1 in the high ones
        q = _vload(b, p, b.add(base, _c(base.type, (Q5K_QS if q5 else Q4K_QS) + 32 * jj)), V32I8, 1)
        lo, hi = _bits(b, q, 0, 15), _bits(b, q, 4, None)
        if q5:
            lo = b.or_(lo, b.and_(b.shl(_bits(b, H, 2 * jj, None), _c(V32I8, [4] * 32)), sixteen))
            hi = b.or_(hi, b.and_(b.shl(_bits(b, H, 2 * jj + 1, None), _c(V32I8, [4] * 32)), sixteen))
        w = _concat(b, lo, hi)
        sc = _spread(b, sm, [2 * jj] * 16 + [2 * jj + 1] * 16, b.zext)
        acc = _madd_acc(b, acc, _maddubs(b, w, xv[jj], how), sc, how)
    mins = _madd_wd(b, _spread(b, sm, [8 + i // 2 for i in range(16)], b.zext), bs, how)
    return acc, mins


def _q6_k_row_int(b, p, base, xv, bs, how):
    """(Σ_g sc_g·(Σ q·q_x − 32·bsum_g) as <16 x i32>, None) for one Q6_K super-block."""
    off = lambda k: b.add(base, _c(base.type, k))  # noqa: E731
    sc = _vload(b, p, off(Q6K_SCALES), ir.VectorType(I8, 16), 1)
    acc = _c(V16I32, [0] * 16)
    for n in range(2):  # 128 values each: units u = 2n (values 0-63 of the half), 2n + 1 (64-127)
        A, B = _vload(b, p, off(64 * n), V32I8, 1), _vload(b, p, off(64 * n + 32), V32I8, 1)
        H = _vload(b, p, off(Q6K_QH + 32 * n), V32I8, 1)
        four = _c(V32I8, [4] * 32)
        q = [b.or_(low, b.shl(_bits(b, H, hsh, 3), four))
             for low, hsh in ((_bits(b, A, 0, 15), 0), (_bits(b, B, 0, 15), 2),
                              (_bits(b, A, 4, None), 4), (_bits(b, B, 4, None), 6))]
        for h in range(2):
            u = 2 * n + h
            s16 = _spread(b, sc, [4 * u + i // 8 for i in range(32)], b.sext)
            acc = _madd_acc(b, acc, _maddubs(b, _concat(b, q[2 * h], q[2 * h + 1]), xv[u], how), s16, how)
    offs = _madd_wd(b, b.sext(sc, V16I16), bs, how)  # Σ sc_g·bsum_g, 8 lanes
    offs = b.shuffle_vector(offs, _c(V8I32, [0] * 8), _c(V16I32, list(range(16))))
    return b.sub(acc, b.shl(offs, _c(V16I32, [5] * 16))), None


def _iq4_xs_row_int(b, p, base, xv, bs, how):
    """(Σ_j (ls_j − 32)·Σ q·q_x as <16 x i32>, None) for one IQ4_XS super-block; xv in PAIR_ORDER
    per 64 values (sub-block 2jj's low nibbles, 2jj + 1's, then both high ones: one AND and one
    shift per 32 bytes). The table values are signed (−127..113): pmaddubsw gets |q| and q_x
    with q's sign (|products| ≤ 2·127·127, no saturation), as ggml's mul_add_epi8."""
    off = lambda k: b.add(base, _c(base.type, k))  # noqa: E731
    sh = b.or_(_u8(b, p, off(2)), b.shl(_u8(b, p, off(3)), _c(I32, 8)))
    ls = ir.Constant(ir.VectorType(I8, 16), ir.Undefined)
    for j in range(8):
        lo = b.and_(b.lshr(_u8(b, p, off(IQ4XS_SL + j // 2)), _c(I32, 4 * (j % 2))), _c(I32, 15))
        hi = b.and_(b.lshr(sh, _c(I32, 2 * j)), _c(I32, 3))
        ls = b.insert_element(ls, b.trunc(b.sub(b.or_(lo, b.shl(hi, _c(I32, 4))), _c(I32, 32)), I8), _c(I32, j))
    acc = _c(V16I32, [0] * 16)
    if how == "avx512vnni":
        # xv as _dot4_kq_int_codegen arranged it for IQ4_XS: values 0-15 of sub-blocks 4h..4h+3,
        # then their values 16-31. The table plus 128 is unsigned (1..241), so vpdpbusd
        # takes it as it is: per 64 bytes (sub-blocks 4h..4h+3) the low and the high nibbles'
        # products go into the same four lanes per sub-block, times its scale by one vpmulld;
        # the 128·Σx it added comes off once per super-block from the bsums
        t128 = _c(V64I8, [v + 128 for v in KVALUES_IQ4NL] * 4)
        shuf = _declare(b, "llvm.x86.avx512.pshuf.b.512", V64I8, [V64I8, V64I8])
        for h in range(2):
            q = _vload(b, p, off(IQ4XS_QS + 64 * h), V64I8, 1)
            ul = b.call(shuf, [t128, b.and_(q, _c(V64I8, [15] * 64))])
            uh = b.call(shuf, [t128, b.lshr(q, _c(V64I8, [4] * 64))])
            isum = _idot_u8s8(b, uh, xv[2 * h + 1], how, acc=_idot_u8s8(b, ul, xv[2 * h], how))
            sc = b.sext(b.shuffle_vector(ls, ls, _c(V16I32, [4 * h + i // 4 for i in range(16)])), V16I32)
            acc = b.add(acc, b.mul(isum, sc))
        corr = _madd_wd(b, _spread(b, ls, [i // 2 for i in range(16)], b.sext), bs, how)  # ls_j·Σx_j
        corr = b.shl(_concat(b, corr, _c(ir.VectorType(I32, 8), [0] * 8)), _c(V16I32, [7] * 16))
        return b.sub(acc, corr), None
    zero = _c(V64I8, [0] * 64)
    for jj in range(4):
        q = _vload(b, p, off(IQ4XS_QS + 32 * jj), V32I8, 1)
        w = _lookup16_pshufb(b, _concat(b, _bits(b, q, 0, 15), _bits(b, q, 4, None)), how)
        neg = b.icmp_signed("<", w, zero)
        u, x = b.select(neg, b.sub(zero, w), w), b.select(neg, b.sub(zero, xv[jj]), xv[jj])
        sc = _spread(b, ls, ([2 * jj] * 8 + [2 * jj + 1] * 8) * 2, b.sext)
        acc = _madd_acc(b, acc, _maddubs(b, u, x, how), sc, how)
    return acc, None


def _q2_k_row_int(b, p, base, xv, bs, how):
    """(Σ_g sc_g·Σ q·q_x as <16 x i32>, Σ_g m_g·bsum_g as <8 x i32>) for one Q2_K super-block:
    scales[16] (4-bit scale | 4-bit minimum << 4), qs[64]: value 128n + 32j + l is bits 2j of
    qs[32n + l], so two shifts of 32 bytes give 64 values in natural order (sub-blocks of 16)."""
    sm = _vload(b, p, base, ir.VectorType(I8, 16), 1)
    sc = b.and_(sm, _c(sm.type, [15] * 16))
    acc = _c(V16I32, [0] * 16)
    if how == "avx512vnni":
        # all 64 quant bytes at once: bits 2j give values 32j + l (lanes 0-31) and 128 + 32j + l
        # (lanes 32-63), x arranged so by the caller; sub-block scales by one word permute
        Q = _vload(b, p, b.add(base, _c(base.type, Q2K_QS)), V64I8, 1)
        s16 = b.zext(sc, V16I16)
        for j in range(4):
            w = b.and_(b.lshr(Q, _c(V64I8, [2 * j] * 64)) if j else Q, _c(V64I8, [3] * 64))
            lanes = [2 * j] * 8 + [2 * j + 1] * 8 + [8 + 2 * j] * 8 + [9 + 2 * j] * 8
            acc = _madd_acc(b, acc, _maddubs(b, w, xv[j], how), b.shuffle_vector(s16, s16, _c(ir.VectorType(I32, 32), lanes)), how)
        mins = b.zext(b.lshr(sm, _c(sm.type, [4] * 16)), V16I16)
        return acc, _madd_wd(b, mins, bs, how)
    for n in range(2):
        Q = _vload(b, p, b.add(base, _c(base.type, Q2K_QS + 32 * n)), V32I8, 1)
        for h in range(2):
            u = 2 * n + h
            w = _concat(b, _bits(b, Q, 4 * h, 3), _bits(b, Q, 4 * h + 2, 3))
            s16 = _spread(b, sc, [4 * u + i // 8 for i in range(32)], b.zext)
            acc = _madd_acc(b, acc, _maddubs(b, w, xv[u], how), s16, how)
    mins = b.zext(b.lshr(sm, _c(sm.type, [4] * 16)), V16I16)
    return acc, _madd_wd(b, mins, bs, how)


def _q3_k_row_int(b, p, base, xv, bs, how):
    """(Σ_g sc_g·(Σ u·q_x − 4·bsum_g) as <16 x i32>, None) for one Q3_K super-block: u = the 2
    low bits (as Q2_K's) | the hmask bit << 2, 0..7, the value u − 4; 16 signed 6-bit scales."""
    off = lambda k: b.add(base, _c(base.type, k))  # noqa: E731
    # scale k: low 4 bits from bytes 0-7, high 2 bits from bytes 8-11 (as _q3_k_row), unpacked as
    # ggml's three 32-bit words aux (kmask1 0x03030303, kmask2 0x0f0f0f0f), 4 scales per word
    a0, a1, a2 = (_i32_at(b, p, off(Q3K_SCALES + 4 * i)) for i in range(3))
    k1, k2 = _c(I32, 0x03030303), _c(I32, 0x0F0F0F0F)
    sh = lambda v, n: b.lshr(v, _c(I32, n)) if n else v  # noqa: E731
    words = [b.or_(b.and_(sh(lo, 4 * (w // 2)), k2), b.shl(b.and_(sh(a2, 2 * w), k1), _c(I32, 4)))
             for w, lo in enumerate((a0, a1, a0, a1))]
    v = ir.Constant(ir.VectorType(I32, 4), ir.Undefined)
    for w in range(4):
        v = b.insert_element(v, words[w], _c(I32, w))
    sc = b.sub(b.bitcast(v, ir.VectorType(I8, 16)), _c(ir.VectorType(I8, 16), [32] * 16))
    H = _vload(b, p, off(0), V32I8, 1)
    acc = _c(V16I32, [0] * 16)
    if how == "avx512vnni":  # as Q2_K's: 64 quant bytes at once, x arranged so by the caller
        Q = _vload(b, p, off(Q3K_QS), V64I8, 1)
        H64 = _concat(b, H, H)
        zero, four = _c(V64I8, [0] * 64), _c(V64I8, [4] * 64)
        s16 = b.sext(sc, V16I16)
        for j in range(4):
            w = b.and_(b.lshr(Q, _c(V64I8, [2 * j] * 64)) if j else Q, _c(V64I8, [3] * 64))
            bit = b.icmp_unsigned("!=", b.and_(H64, _c(V64I8, [1 << j] * 32 + [1 << (4 + j)] * 32)), zero)
            w = b.select(bit, b.or_(w, four), w)
            lanes = [2 * j] * 8 + [2 * j + 1] * 8 + [8 + 2 * j] * 8 + [9 + 2 * j] * 8
            acc = _madd_acc(b, acc, _maddubs(b, w, xv[j], how), b.shuffle_vector(s16, s16, _c(ir.VectorType(I32, 32), lanes)), how)
    else:
        for n in range(2):
            Q = _vload(b, p, off(Q3K_QS + 32 * n), V32I8, 1)
            q = [b.or_(_bits(b, Q, 2 * j, 3), b.shl(_bits(b, H, 4 * n + j, 1), _c(V32I8, [2] * 32))) for j in range(4)]
            for h in range(2):
                u = 2 * n + h
                s16 = _spread(b, sc, [4 * u + i // 8 for i in range(32)], b.sext)
                acc = _madd_acc(b, acc, _maddubs(b, _concat(b, q[2 * h], q[2 * h + 1]), xv[u], how), s16, how)
    offs = _madd_wd(b, b.sext(sc, V16I16), bs, how)  # Σ sc_g·bsum_g, 8 lanes
    offs = b.shuffle_vector(offs, _c(V8I32, [0] * 8), _c(V16I32, list(range(16))))
    return b.sub(acc, b.shl(offs, _c(V16I32, [2] * 16))), None


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
    affine = fmt in ("q2_k", "q4_k", "q5_k")
    dpos = {"q6_k": Q6K_D, "q2_k": Q2K_D, "q3_k": Q3K_D}.get(fmt, 0)  # fp16 d (then dmin for the affine types)

    def codegen(context, builder, sig, args):
        # args: w0..w3, p0..p3 (uint8 rows), xq (int8, nsb·256), xd (d_x per block), xb (int16
        # bsums, 16 per block), nsb
        how = int_dot_features()
        ws = [_data(context, builder, sig.args[j], args[j]) for j in range(ROWS)]
        ps = [_data(context, builder, sig.args[ROWS + j], args[ROWS + j]) for j in range(ROWS)]
        xq, xd, xb = (_data(context, builder, sig.args[2 * ROWS + u], args[2 * ROWS + u]) for u in range(3))
        nsb = args[2 * ROWS + 3]
        ity = nsb.type
        ST = ir.LiteralStructType([V16F] * ROWS + [V8F] * ROWS)
        init = ir.Constant(ST, [_c(V16F, [0.0] * 16)] * ROWS + [_c(V8F, [0.0] * 8)] * ROWS)

        def body(sb, accs):
            base = builder.mul(sb, _c(ity, nbytes))
            xo = builder.mul(sb, _c(ity, QK_K))
            xv = [_vload(builder, xq, builder.add(xo, _c(ity, 64 * u)), V64I8, 1) for u in range(4)]
            if how == "avx512vnni" and fmt in KQ_X_ORDER:  # once for the four rows, in the row
                v = ir.VectorType(I32, 64)                 # function's 64-byte steps' order
                xv = [builder.shuffle_vector(xv[a], xv[c], _c(v, idx)) for a, c, idx in KQ_X_ORDER[fmt]]
            elif fmt == "iq4_xs":  # once for the four rows, to the weights' PAIR_ORDER
                xv = [builder.shuffle_vector(v, v, _c(ir.VectorType(I32, 64), PAIR_ORDER)) for v in xv]
            bs = _vload(builder, xb, builder.mul(sb, _c(ity, QK_K // 16)), V16I16, 2)
            dx = builder.load(builder.gep(xd, [sb]))
            for r in range(ROWS):
                # the super-block at this offset of p's rows (the group AHEAD on), into L2
                # (prefetcht1; measured with AHEAD = 1), as the Q8_0
                # kernel does. Into L1 it evicted what the group still reads: Llama-3.1-8B-dims
                # files on a 2-core AMD EPYC (znver4), ÷ the same pages' fastest plain read, 12
                # alternated rounds: Q6_K 0.78/0.76 into L1, 1.08/1.05 into L2 (0.72/0.74 with no
                # prefetch); Q4_K 0.78 and 0.83
                _prefetch_lines(builder, ps[r], base, (nbytes + 63) // 64, 2)
                isum, mins = row_fn(builder, ws[r], base, xv, bs, how)
                d = builder.fmul(_f16_at(builder, ws[r], builder.add(base, _c(ity, dpos))), dx, flags=FAST)
                v = builder.fmul(builder.sitofp(isum, V16F), _splat(builder, d, 16), flags=FAST)
                accs = builder.insert_value(accs, builder.fadd(builder.extract_value(accs, r), v, flags=FAST), r)
                if mins is not None:
                    dm = builder.fmul(_f16_at(builder, ws[r], builder.add(base, _c(ity, dpos + 2))), dx, flags=FAST)
                    v = builder.fmul(builder.sitofp(mins, V8F), _splat(builder, dm, 8), flags=FAST)
                    accs = builder.insert_value(accs, builder.fadd(builder.extract_value(accs, ROWS + r), v,
                                                                   flags=FAST), ROWS + r)
            return accs

        accs = _loop(builder, nsb, init, body)
        out = [builder.fsub(_hsum(builder, builder.extract_value(accs, r)),
                            _hsum(builder, builder.extract_value(accs, ROWS + r)), flags=FAST) for r in range(ROWS)]
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


# === kernels ====================================================================================


# --- row groups ------------------------------------------------------------------------------
# Every kernel takes ``rows``: the row indices to compute (the sparse paths' gathered rows) or
# None for all of them. None compiles a specialization that computes the indices instead of
# loading them from a list (measured over the dense matrices of Llama-3.1-8B-dims files, AMD
# EPYC: the list 0..n-1 cost the F16 kernel ~8 %, the block kernels up to a few %).
def _at(rows, j):
    """Row j of a kernel's row list (numba only)."""


@overload(_at, inline="always")
def _at_impl(rows, j):
    if isinstance(rows, types.NoneType):
        return lambda rows, j: j
    return lambda rows, j: rows[j]


def _count(rows, W):
    """How many rows a kernel computes: len(rows), or all of W's (numba only)."""


@overload(_count, inline="always")
def _count_impl(rows, W):
    if isinstance(rows, types.NoneType):
        return lambda rows, W: W.shape[0]
    return lambda rows, W: rows.shape[0]


# The int8 kernels' rows to prefetch: those of the group AHEAD on (AHEAD = 1, the next group,
# was the first choice). Over the matrices of the Llama-3.1-8B- and Falcon-7B-dims preset files,
# 2 threads on a 2-core AMD EPYC (znver4), each kernel against a plain read of the same pages
# (benchmarks' read_rows), the two distances alternated 20 rounds in one process, two runs: 19 of
# 22 (type, run) pairs faster two groups on, by 3 % on average (Q8_0 0.913 -> 0.953 and 0.859 ->
# 0.888, Q4_K 1.053 -> 1.095, Q5_K 1.004 -> 1.057, IQ4_XS 0.826 -> 0.867; Q5_0 0.840 -> 0.819 the
# largest loss); three groups on was no better than two
AHEAD = 2


@njit(fastmath=True, cache=True, inline="always")
def _group(rows, n, g):
    """The 4 rows of group g, side by side: 4g .. 4g + 3 of the n (the last row past the end)."""
    b = 4 * np.int64(g)
    last = n - 1
    return _at(rows, min(b, last)), _at(rows, min(b + 1, last)), _at(rows, min(b + 2, last)), _at(rows, min(b + 3, last))


# The float kernels' groups of eight take their rows G apart (g, g + G, ..., g + 7G; G =
# ceil(n / 8)): consecutive groups advance each position by one row, so over a dense matrix each
# of the eight reads one unbroken stream of consecutive rows, where side-by-side groups started
# eight streams afresh every eight rows. Llama-3.1-8B-dims F16, AMD EPYC (no software prefetch
# there): the k = 4096 matrices read at 0.83-0.89 of a plain read of the same pages side by
# side, 0.95-1.07 strided; one thread 19.6 -> 23.4 GB/s (k = 14336 unchanged, 24 GB/s). The
# block kernels' groups of four stay side by side: they prefetch a later group into L2
# themselves, and strided groups measured 3-6 % slower there on Q4_0 and Q4_K on one thread
# (Q8_0: +3 % on one thread, -6 to +2 % on two).
@njit(fastmath=True, cache=True, inline="always")
def _strided8(rows, n, g, G):
    """The 8 rows of group g, G apart (the last row past the end)."""
    g = np.int64(g)
    last = n - 1
    return (_at(rows, min(g, last)), _at(rows, min(g + G, last)), _at(rows, min(g + 2 * G, last)),
            _at(rows, min(g + 3 * G, last)), _at(rows, min(g + 4 * G, last)),
            _at(rows, min(g + 5 * G, last)), _at(rows, min(g + 6 * G, last)),
            _at(rows, min(g + 7 * G, last)))


@njit(fastmath=True, cache=True, inline="always")
def _store(Y, t, rows, n, b, step, y):
    """Y[t, row b + u·step] = y[u] for the group's len(y) results (those past n dropped):
    step 1 for a side-by-side group (b = 4g), G for a strided one (b = g)."""
    b = np.int64(b)
    for u in range(len(y)):
        if b + u * step < n:
            Y[t, _at(rows, b + u * step)] = y[u]


# --- dense rows: F32, F16, BF16 ---------------------------------------------------------------
# One parallel kernel per family with the element type as a run-time ``kind`` (one predictable
# branch per four rows); the public functions pick it, and the plain fallback when rows are
# not a multiple of 32. (Separate kernels per type would repeat the loop; closures over the
# intrinsic would not cache.)
F32_ROWS, F16_ROWS, BF16_ROWS = 0, 1, 2


@njit(parallel=True, fastmath=True, cache=True)
def _mm_float(W, X, rows, Y, kind):
    T, k = X.shape
    n = _count(rows, W)
    G = (n + FLOAT_ROWS - 1) // FLOAT_ROWS
    for g in prange(G):
        i0, i1, i2, i3, i4, i5, i6, i7 = _strided8(rows, n, g, G)
        for t in range(T):
            if kind == F32_ROWS:
                y = dot8_f32(W[i0], W[i1], W[i2], W[i3], W[i4], W[i5], W[i6], W[i7], X[t], k)
            elif kind == F16_ROWS:
                y = dot8_f16(W[i0], W[i1], W[i2], W[i3], W[i4], W[i5], W[i6], W[i7], X[t], k)
            else:
                y = dot8_bf16(W[i0], W[i1], W[i2], W[i3], W[i4], W[i5], W[i6], W[i7], X[t], k)
            _store(Y, t, rows, n, g, G, y)


def mm_f32(W, X, rows, Y):  # W (n, k) f32; X (T, k); rows (r,) int64 or None (every row); Y (T, n)
    if X.shape[1] % 32:
        _mm_f32_rows(W, X, rows, Y)
    else:
        _mm_float(W, X, rows, Y, F32_ROWS)


def mm_f16(W, X, rows, Y):  # W (n, k) uint16 holding IEEE half bits
    if X.shape[1] % 32:
        _mm_lut_rows(W, LUT_F16, X, rows, Y)
    else:
        _mm_float(W, X, rows, Y, F16_ROWS)


def mm_bf16(W, X, rows, Y):  # W (n, k) uint16 holding bfloat16 bits
    if X.shape[1] % 32:
        _mm_lut_rows(W, LUT_BF16, X, rows, Y)
    else:
        _mm_float(W, X, rows, Y, BF16_ROWS)


# --- F16 weights in llama.cpp's arithmetic: x rounded to fp16 once per matmul ------------------
# What ggml computes for an F16 weight (its vec_dot_type for F16 is F16): each activation rounded
# to fp16, products and sums in float32. Under ``set_arithmetic("int8")`` (the default: llama.cpp's
# arithmetic, named for the block types) the F16 matmuls run so; "float" keeps x float32, exact.
# The halved x also changes which grouping reads fastest. One row at a time with x in fp16 reads
# each thread's rows as one sequential stream, and x (2k bytes) stays in L1 beside it. Llama-3.1-
# 8B-dims F16, AMD EPYC, the k = 4096 matrices, 2 threads, one minute: C loops of these shapes
# (gcc -O3) one row with fp16 x 46-47 GB/s, one row with float32 x 39.8, our strided eight with
# float32 x 40.7. This kernel, in one process alternated step by step with llama.cpp: a decode
# step 1.01-1.08x llama.cpp's where the strided float32 one ran 0.97-1.03x; Falcon-7B dims
# (k = 4544) 1.12-1.13x against 1.06x.
# Past ONE_ROW_X_BYTES of x (k = 14336: 28 KB) one row at a time fell to half the speed of eight
# rows sharing each x load, so longer rows keep the strided eight (with fp16 x as well).
ONE_ROW_X_BYTES = 16 << 10  # half of a 32 KiB L1D


@njit(parallel=True, fastmath=True, cache=True)
def _mm_f16_hx(W, XH, rows, Y):  # XH (T, k) uint16: x as fp16 bits
    T, k = XH.shape
    n = _count(rows, W)
    G = (n + FLOAT_ROWS - 1) // FLOAT_ROWS
    for g in prange(G):
        i0, i1, i2, i3, i4, i5, i6, i7 = _strided8(rows, n, g, G)
        for t in range(T):
            y = dot8_f16_hx(W[i0], W[i1], W[i2], W[i3], W[i4], W[i5], W[i6], W[i7], XH[t], k)
            _store(Y, t, rows, n, g, G, y)


@njit(parallel=True, fastmath=True, cache=True)
def _mm_f16_hx1(W, XH, rows, Y):
    T, k = XH.shape
    for ii in prange(_count(rows, W)):
        i = _at(rows, ii)
        for t in range(T):
            Y[t, i] = dot1_f16_hx(W[i], XH[t], k)[0]


# the float matrices' kernels under public names, for compiled callers (runtime.decode_block)
mm_float_rows, mm_f16_half_x, mm_f16_half_x_one = _mm_float, _mm_f16_hx, _mm_f16_hx1


def mm_f16_arith(W, X, rows, Y):
    """``mm_f16`` in the process's arithmetic: under "int8" (llama.cpp's) x rounded to fp16 first,
    as ggml's vec_dot_f16 does; under "float" x float32 (exact to float32 rounding)."""
    if _ARITHMETIC["name"] != "int8":
        mm_f16(W, X, rows, Y)
        return
    XH = X.astype(np.float16)
    if X.shape[1] % 32:  # the plain fallback, on the same fp16-rounded x
        _mm_lut_rows(W, LUT_F16, XH.astype(np.float32), rows, Y)
    elif 2 * X.shape[1] <= ONE_ROW_X_BYTES:
        _mm_f16_hx1(W, XH.view(np.uint16), rows, Y)
    else:
        _mm_f16_hx(W, XH.view(np.uint16), rows, Y)


# rows whose length is not a multiple of 32: one row at a time, vectorized by LLVM alone
@njit(parallel=True, fastmath=True, cache=True)
def _mm_f32_rows(W, X, rows, Y):
    T, k = X.shape
    for ii in prange(_count(rows, W)):
        i = _at(rows, ii)
        for t in range(T):
            acc = np.float32(0.0)
            for j in range(k):
                acc += W[i, j] * X[t, j]
            Y[t, i] = acc


@njit(parallel=True, fastmath=True, cache=True)
def _mm_lut_rows(W, lut, X, rows, Y):  # W uint16 bits decoded through a 65536-entry table
    T, k = X.shape
    for ii in prange(_count(rows, W)):
        i = _at(rows, ii)
        for t in range(T):
            acc = np.float32(0.0)
            for j in range(k):
                acc += lut[W[i, j]] * X[t, j]
            Y[t, i] = acc


# --- block formats: W is uint8 (n, bytes per row), each row the file's blocks as stored ------------
B32_KIND = {fmt: i for i, fmt in enumerate(B32)}  # the run-time ``kind`` of _mm_b32
KQ_KIND = {fmt: i for i, fmt in enumerate(KQ_TYPES)}  # the run-time ``kind`` of _mm_kq
KQ_XSUM = {"q2_k": QK_K // 16, "q4_k": QK_K // 8, "q5_k": QK_K // 8}  # values per Σx (affine types)


@njit(parallel=True, fastmath=True, cache=True)
def _mm_b32(W, X, rows, Y, kind):  # W (n, k/32 · block bytes) uint8
    T, k = X.shape
    nb = k // QK
    n = _count(rows, W)
    for g in prange((n + 3) // 4):
        i0, i1, i2, i3 = _group(rows, n, g)
        n0, n1, n2, n3 = _group(rows, n, g + 1)
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
            _store(Y, t, rows, n, 4 * g, 1, y)


@njit(parallel=True, fastmath=True, cache=True)
def _mm_kq(W, X, xs, rows, Y, kind):  # W (n, k/QK_K · block bytes) uint8; xs Σx per sub-block
    T, k = X.shape
    nsb = k // QK_K
    n = _count(rows, W)
    for g in prange((n + 3) // 4):
        i0, i1, i2, i3 = _group(rows, n, g)
        n0, n1, n2, n3 = _group(rows, n, g + 1)
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
            _store(Y, t, rows, n, 4 * g, 1, y)


def xsum(X, sub):
    """(T, k) -> (T, k/sub) sums of each sub-block of the input."""
    return X.reshape(X.shape[0], -1, sub).sum(axis=2, dtype=np.float32)


@njit(cache=True)
def quantize_q8(X, xq, xd, xs):
    """Each row of X (T, k) as int8 blocks of QK: xq (T, k) int8, xd (T, k/QK) the scales d in
    float32, xs (T, k/QK) the quants' sums Σq. As ggml's x86 quantize_row_q8_0/q8_1 (AVX): d =
    max|x|/127, q = round half to even of x·(127/max|x|) (0 for an all-zero block); the fp16
    roundings ggml stores are ``quantize_activations``'s. No fastmath: the products stay as
    written, so numpy can repeat them."""
    T, k = X.shape
    nb = k // QK
    for t in range(T):  # one thread: O(k) per token against the matmul's O(n·k)
        for b in range(nb):
            o = b * QK
            amax = np.float32(0.0)
            for i in range(QK):
                amax = max(amax, abs(X[t, o + i]))
            d = amax / np.float32(127.0)
            inv = np.float32(127.0) / amax if amax != 0 else np.float32(0.0)
            s = 0
            for i in range(QK):
                q = np.int32(np.rint(X[t, o + i] * inv))
                xq[t, o + i] = q
                s += q
            xd[t, b] = d
            xs[t, b] = np.float32(s)


@njit(cache=True)
def _quantize_q8_blocks(X):
    """(xq, xd, xs) of ``quantize_q8`` for X (T, k), k a multiple of QK, d and s in float32. Its
    own compiled function, called before the kernel: compiled as a callee of the fastmath kernel,
    d came out one ulp off ggml's max|x|/127 (measured)."""
    T, k = X.shape
    xq = np.empty((T, k), np.int8)
    xd = np.empty((T, k // QK), np.float32)
    xs = np.empty((T, k // QK), np.float32)
    quantize_q8(X, xq, xd, xs)
    return xq, xd, xs


@intrinsic
def round_f16(typingctx, x):
    """float32 x rounded to fp16 and back: nearest even, as F16C's vcvtps2ph, ggml's
    FP32_TO_FP16 and numpy's astype(float16) (LLVM fptrunc/fpext; numba has no float16)."""
    def codegen(context, builder, signature, args):
        return builder.fpext(builder.fptrunc(args[0], HALF), F32)

    return types.float32(types.float32), codegen


@njit(cache=True)
def _quantize_q8_stored(X, affine):
    """``quantize_activations`` in one compiled call: with d and s rounded to fp16 in numpy
    (astype) a call took 5.6 µs at k 4096 and 12.6 at 14336, in one call 4.0 and 9.9."""
    xq, xd, xs = _quantize_q8_blocks(X)
    for t in range(xd.shape[0]):
        for b in range(xd.shape[1]):
            d, isum = xd[t, b], xs[t, b]
            d16 = round_f16(d)
            xd[t, b] = d16
            xs[t, b] = round_f16(d * isum) if affine else d16 * isum
    return xq, xd, xs


def quantize_activations(X, affine: bool = False):
    """X (T, k) as ggml's block_q8_0 / block_q8_1 on x86: (xq int8 (T, k), d (T, k/QK), s
    (T, k/QK)) with d rounded to fp16 as ggml stores it and s the block's Σx as ggml's dot products
    see it: d·Σq for the Q8_0 partners (Q8_0, Q4_0, Q5_0, IQ4_NL; their kernels do not read it:
    ggml subtracts Q4_0/Q5_0's offset from the quants, and so do the kernels, in the integer
    lanes), and for the Q8_1 partners (``affine``: Q4_1, Q5_1) the stored fp16 of d·Σq taken
    before d's rounding, which their kernels read as float32."""
    return _quantize_q8_stored(X, affine)


AFFINE_B32 = frozenset({"q4_1", "q5_1"})  # block types whose ggml dot products take Q8_1 activations


@njit(parallel=True, fastmath=True, cache=True)
def _mm_b32_int(W, xq, xd, xs, rows, Y, kind):  # W (n, k/32 · block bytes) uint8; x quantized
    T = xq.shape[0]
    nb = xd.shape[1]
    n = _count(rows, W)
    for g in prange((n + 3) // 4):
        i0, i1, i2, i3 = _group(rows, n, g)
        n0, n1, n2, n3 = _group(rows, n, g + AHEAD)
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
            _store(Y, t, rows, n, 4 * g, 1, y)


@njit(cache=True)
def quantize_q8_k(X, xq, xd, xb):
    """Each row of X (T, k) as ggml's block_q8_K (quantize_row_q8_K reference): per block of
    QK_K, ``max`` the value of largest magnitude (the first one on ties), iscale = −127/max,
    q = nearest_int(iscale·x) (round half to even, as ggml's 1.5·2²³ trick), at most 127,
    d = 1/iscale (negative when max > 0; d·q is x's rounding either way), an all-zero block
    d = 0 and quants 0; xb (T, k/16) int16: the sum of each 16 quants. No fastmath, so numpy
    can repeat it bit for bit."""
    T, k = X.shape
    nb = k // QK_K
    for t in range(T):
        for b in range(nb):
            o = b * QK_K
            amax = np.float32(0.0)
            mx = np.float32(0.0)
            for i in range(QK_K):
                ax = abs(X[t, o + i])
                if ax > amax:
                    amax = ax
                    mx = X[t, o + i]
            if amax == 0:
                for i in range(QK_K):
                    xq[t, o + i] = 0
                for g in range(QK_K // 16):
                    xb[t, b * (QK_K // 16) + g] = 0
                xd[t, b] = np.float32(0.0)
                continue
            iscale = np.float32(-127.0) / mx
            for g in range(QK_K // 16):
                s = 0
                for i in range(16):
                    q = min(127, np.int32(np.rint(iscale * X[t, o + 16 * g + i])))
                    xq[t, o + 16 * g + i] = q
                    s += q
                xb[t, b * (QK_K // 16) + g] = s
            xd[t, b] = np.float32(1.0) / iscale


@njit(cache=True)
def quantize_activations_k(X):
    """(xq, xd, xb) of ``quantize_q8_k`` for X (T, k), k a multiple of QK_K."""
    T, k = X.shape
    xq = np.empty((T, k), np.int8)
    xd = np.empty((T, k // QK_K), np.float32)
    xb = np.empty((T, k // 16), np.int16)
    quantize_q8_k(X, xq, xd, xb)
    return xq, xd, xb


KQ_INT_KIND = {fmt: i for i, fmt in enumerate(KQ_INT)}  # the run-time ``kind`` of _mm_kq_int


@njit(parallel=True, fastmath=True, cache=True)
def _mm_kq_int(W, xq, xd, xb, rows, Y, kind):  # W (n, k/QK_K · block bytes) uint8; x as Q8_K
    T = xq.shape[0]
    nsb = xd.shape[1]
    n = _count(rows, W)
    for g in prange((n + 3) // 4):
        i0, i1, i2, i3 = _group(rows, n, g)
        n0, n1, n2, n3 = _group(rows, n, g + AHEAD)
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
            _store(Y, t, rows, n, 4 * g, 1, y)


# The input several matmuls of a step share (q/k/v read one normed vector, gate/up another):
# while ``share_input(X)`` holds X, its int8 blocks are computed once per activation format
# rather than once per matrix. The caller (Model) must not change X in place meanwhile.
_SHARED: dict = {"x": None, "q": {}}


def share_input(X: np.ndarray | None) -> None:
    """Quantize ``X`` once for the matmuls that follow (None: stop sharing)."""
    _SHARED["x"] = X
    _SHARED["q"] = {}


def _quantized(X, how):  # how: "k" (Q8_K), False (Q8_0) or True (Q8_1)
    shared = X is _SHARED["x"]
    if shared and how in _SHARED["q"]:
        return _SHARED["q"][how]
    q = quantize_activations_k(X) if how == "k" else quantize_activations(X, how)
    if shared:
        _SHARED["q"][how] = q
    return q


def mm_block_int8(fmt, W, X, rows, Y):
    """``mm_block`` with X quantized to int8 blocks first (one of INT8_TYPES or KQ_INT): integer
    block dot products, what llama.cpp computes (its error is the activations' 8-bit rounding).
    32-value types: Q8_0 activation blocks; KQ_INT: Q8_K blocks of 256 with group sums."""
    if fmt in KQ_INT_KIND:
        _mm_kq_int(W, *_quantized(X, "k"), rows, Y, KQ_INT_KIND[fmt])
    else:
        _mm_b32_int(W, *_quantized(X, fmt in AFFINE_B32), rows, Y, B32_KIND[fmt])


# the int8 kernels and the Q8_0/Q8_1 quantizer under public names, for compiled callers
# (runtime.decode_block calls them from inside its own compiled function)
mm_b32_int8, mm_kq_int8, quantize_q8_blocks = _mm_b32_int, _mm_kq_int, _quantize_q8_stored


def mm_block_arith(fmt, W, X, rows, Y):
    """``mm_block`` in the process's arithmetic: int8 for INT8_ALL under "int8", else float.
    What the runtime's weights call (runtime.weights.KERNELS)."""
    if _ARITHMETIC["name"] == "int8" and fmt in INT8_DEFAULT:
        mm_block_int8(fmt, W, X, rows, Y)
    else:
        mm_block(fmt, W, X, rows, Y)


# --- the process-wide arithmetic of the block kernels ----------------------------------------
ARITHMETICS = ("int8", "float")  # --arithmetic choices; the first is the default
INT8_TYPES = B32  # 32-value block types with an int8-activation kernel (Q8_0 activation blocks)
INT8_ALL = B32 + KQ_INT  # every type with an int8 kernel (``mm_block_int8``); the rest run float
INT8_DEFAULT = frozenset(INT8_ALL)  # the types "int8" runs int8 (all that have a kernel)
_ARITHMETIC = {"name": ARITHMETICS[0]}


def set_arithmetic(name: str) -> str:
    """Run the block kernels with ``name`` arithmetic: "int8" (activations quantized to int8
    blocks per matmul, integer block dot products; types outside INT8_TYPES stay float) or
    "float" (weights decoded to float times float activations). Returns the name in effect."""
    from aios.errors import UsageError

    if name not in ARITHMETICS:
        raise UsageError(f"Unknown arithmetic '{name}'; choose from {', '.join(ARITHMETICS)}.")
    _ARITHMETIC["name"] = name
    return name


def arithmetic() -> str:
    """The block kernels' arithmetic in effect ("int8" or "float")."""
    return _ARITHMETIC["name"]


def arithmetic_label(kinds=None) -> str:
    """The arithmetic in effect for the tensor types ``kinds`` (gguf-py names; None: any), as the
    outputs print it: "int8 (Q8_0 activations, AVX-512 VNNI vpdpbusd)", "fp16 activations (F16
    weights, as ggml's vec_dot_f16)" for a file of F16 matrices, or "float"."""
    lower = None if kinds is None else {k.lower() for k in kinds}
    if arithmetic() == "float":
        return "float"
    if lower is not None and not lower & INT8_DEFAULT:  # no block type: F16 in fp16 (mm_f16_arith)
        return "fp16 activations (F16 weights, as ggml's vec_dot_f16)" if "f16" in lower else "float"
    f16 = "; F16 weights: fp16 activations" if lower is None or "f16" in lower else ""
    pick = set(BLOCK_TYPES) if lower is None else lower
    how = int_dot_features()
    used = [(n, dots[how]) for n, ts, dots in (("Q8_0", B32, INT_DOT_NAMES), ("Q8_K", KQ_INT, KQ_DOT_NAMES))
            if pick & INT8_DEFAULT & set(ts)]
    acts = "/".join(n for n, _ in used) + " activations"
    flt = [t.upper() for t in BLOCK_TYPES if t in pick and t not in INT8_DEFAULT]  # block types still float
    extra = "; " + ", ".join(flt) + " float" if flt else ""
    return f"int8 ({acts}, {' / '.join(d for _, d in used)}{extra}{f16})"


def mm_block(fmt, W, X, rows, Y):
    """Y[:, rows] = X @ W[rows]ᵀ (rows None: every row) for a block type ``fmt`` (our lower-case name: "q8_0", "q4_k",
    ...); W (n, bytes per row) uint8 holds each row's blocks exactly as the file stores them.
    Float arithmetic always; ``mm_block_arith`` follows the process's ``set_arithmetic``."""
    if fmt in B32_KIND:
        _mm_b32(W, X, rows, Y, B32_KIND[fmt])
    else:  # types without a minimum get X in place of the (unused) sums
        _mm_kq(W, X, xsum(X, KQ_XSUM[fmt]) if fmt in KQ_XSUM else X, rows, Y, KQ_KIND[fmt])


BLOCK_TYPES = B32 + KQ_TYPES  # every type mm_block runs


# --- sparse down projection: y = Σ_{j∈active} a[j]·Wt[j, :] over row-contiguous Wᵀ -------------
# The active rows are split between chunks, each adding whole (contiguous) rows four at a time
# into its own partial y while the next four rows are prefetched; the partials are summed.


@njit(fastmath=True, cache=True, inline="always")
def _coef(a, j0, j1, j2, j3, cnt):
    z = np.float32(0.0)
    return a[j0], a[j1] if cnt > 1 else z, a[j2] if cnt > 2 else z, a[j3] if cnt > 3 else z


@njit(fastmath=True, cache=True, inline="always")
def _sum_parts(part, y):
    for col in range(y.shape[0]):
        y[col] = 0.0
    for c in range(part.shape[0]):
        for col in range(y.shape[0]):
            y[col] += part[c, col]


@njit(parallel=True, fastmath=True, cache=True)
def _sparse_rows(Wt, a, active, y, kind):  # Wt (d_ffn, n): F32 or F16/BF16 bits (kind as above)
    n, r = Wt.shape[1], active.shape[0]
    nch = min(SPARSE_CHUNKS, max(1, (r + 3) // 4))
    part = np.zeros((nch, n), np.float32)
    step = (r + nch - 1) // nch
    for c in prange(nch):
        lo, hi = c * step, min(r, (c + 1) * step)
        act = active[lo:hi]
        for g in range((hi - lo + 3) // 4):
            j0, j1, j2, j3 = _group(act, hi - lo, g)
            n0, n1, n2, n3 = _group(act, hi - lo, g + 1)
            coef = _coef(a, j0, j1, j2, j3, hi - lo - 4 * g)
            if kind == F32_ROWS:
                axpy4_f32(part[c], Wt[j0], Wt[j1], Wt[j2], Wt[j3], coef, Wt[n0], Wt[n1], Wt[n2], Wt[n3], n)
            elif kind == F16_ROWS:
                axpy4_f16(part[c], Wt[j0], Wt[j1], Wt[j2], Wt[j3], coef, Wt[n0], Wt[n1], Wt[n2], Wt[n3], n)
            else:
                axpy4_bf16(part[c], Wt[j0], Wt[j1], Wt[j2], Wt[j3], coef, Wt[n0], Wt[n1], Wt[n2], Wt[n3], n)
    _sum_parts(part, y)


def sparse_rows_f32(Wt, a, active, y):  # Wt (d_ffn, n) f32
    if Wt.shape[1] % 32:
        _sparse_f32_cols(Wt, a, active, y)
    else:
        _sparse_rows(Wt, a, active, y, F32_ROWS)


def sparse_rows_f16(Wt, a, active, y):  # Wt (d_ffn, n) uint16 holding IEEE half bits
    if Wt.shape[1] % 32:
        _sparse_lut_cols(Wt, LUT_F16, a, active, y)
    else:
        _sparse_rows(Wt, a, active, y, F16_ROWS)


def sparse_rows_bf16(Wt, a, active, y):  # Wt (d_ffn, n) uint16 holding bfloat16 bits
    if Wt.shape[1] % 32:
        _sparse_lut_cols(Wt, LUT_BF16, a, active, y)
    else:
        _sparse_rows(Wt, a, active, y, BF16_ROWS)


# rows whose length is not a multiple of 32: columns in chunks of 256, one thread per chunk
@njit(parallel=True, fastmath=True, cache=True)
def _sparse_f32_cols(Wt, a, active, y):
    n = Wt.shape[1]
    for c in prange((n + 255) // 256):
        c0, c1 = c * 256, min(n, c * 256 + 256)
        for col in range(c0, c1):
            y[col] = 0.0
        for jj in range(active.shape[0]):
            j = active[jj]
            for col in range(c0, c1):
                y[col] += a[j] * Wt[j, col]


@njit(parallel=True, fastmath=True, cache=True)
def _sparse_lut_cols(Wt, lut, a, active, y):
    n = Wt.shape[1]
    for c in prange((n + 255) // 256):
        c0, c1 = c * 256, min(n, c * 256 + 256)
        for col in range(c0, c1):
            y[col] = 0.0
        for jj in range(active.shape[0]):
            j = active[jj]
            for col in range(c0, c1):
                y[col] += a[j] * lut[Wt[j, col]]


# --- sparse down projection over neuron-major quantized rows (aios-convert gguf --sparse-down) ---
# y = Σ_j a[j]·row_j over the active neurons j, each row ggml's blocks along d_model, in every block
# type. Threads take chunks of the active rows into their own partial sums (as _sparse_rows does),
# so each row is read once, front to back, its blocks decoded in place. A row's sum is one SIMD
# intrinsic, ``axpy_<type>(p, w, wn, a_j, nb)``: per 32 values, the quants as one <32 x float>
# (the dense kernels' decoders: _b32_values; the K-quant bit fields as in _q*_k_row), their scale
# (and minimum) folded with a_j once, one multiply-add into p; the next active row wn is
# prefetched at the same offsets, so a row switch does not wait on memory. One parallel kernel
# takes the type as a run-time ``kind`` (one predictable branch per row; closures over the
# intrinsics would not cache). Measured on this project's 2-core Xeon, one thread, rows in cache:
# 9-18 G values/s (Q8_0 18, Q4_0 12, Q4_K 9.6, Q6_K 9.4), where the plain numba loops of Q8_0/Q4_0
# before reached 2.4 / 0.7; rows from DRAM, the prefetch of the next row gained 1.3-2.4x.
#
# The axpy stays float arithmetic (the scalar a[j] times the dequantized row, as PowerInfer does):
# a sum of rows has no dot product for int8 activations to shorten. The gathered *up/gate* rows of
# the sparse modes are dot products, and run the int8 dense kernels (mm_block_arith with ``rows``).
SPARSE_B = BLOCK_TYPES  # the order of the ``kind`` branches and of the names below
assert SPARSE_B == ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_xs")
SPARSE_B_KIND = {fmt: i for i, fmt in enumerate(SPARSE_B)}  # the run-time ``kind`` of _sparse_block_rows
SPARSE_B_VALUES = np.array([block_size(t) for t in SPARSE_B], np.int64)  # values per (super-)block


def _axpy_groups(fmt, b, p, base, coef):
    """The (super-)block at p[base] as [(values, scale, minimum or None)], one per 32 values: q as
    <32 x float>, and coef·(its scale) / coef·(its minimum) as <32 x float> (halves where a scale
    covers 16 values); the block's values are q·scale − minimum (layouts: ggml-common.h)."""
    off = lambda k: b.add(base, _c(base.type, k))  # noqa: E731
    f16 = lambda k: b.fmul(_f16_at(b, p, off(k)), coef, flags=FAST)  # noqa: E731
    c = lambda v: _c(I32, v)  # noqa: E731
    if fmt in B32:  # d·q (+ m): q from _b32_values (offset and IQ4_NL's table included)
        m = _splat(b, b.fsub(_c(F32, 0.0), f16(2), flags=FAST), 32) if fmt in B32_AFFINE else None
        return [(_b32_values(b, fmt, p, base), _splat(b, f16(0), 32), m)]
    out = []
    if fmt in ("q4_k", "q5_k"):  # sub-block j = 2jj + half: nibbles of qs[32jj:32jj + 32] (| qh bit j)
        q5 = fmt == "q5_k"
        d, dmin = f16(0), f16(2)
        s = [_u8(b, p, off(Q4K_SCALES + i)) for i in range(12)]
        H = _vload(b, p, off(Q5K_QH), V32I8, 1) if q5 else None
        for j in range(8):  # ggml's get_scale_min_k4
            if j < 4:
                sc, m = b.and_(s[j], c(63)), b.and_(s[j + 4], c(63))
            else:
                sc = b.or_(b.and_(s[j + 4], c(15)), b.shl(b.lshr(s[j - 4], c(6)), c(4)))
                m = b.or_(b.lshr(s[j + 4], c(4)), b.shl(b.lshr(s[j], c(6)), c(4)))
            q = _vload(b, p, off((Q5K_QS if q5 else Q4K_QS) + 32 * (j // 2)), V32I8, 1)
            qv = _bits(b, q, 4 * (j % 2), 15)
            if q5:
                qv = b.or_(qv, b.shl(_bits(b, H, j, 1), _c(V32I8, [4] * 32)))
            out.append((b.uitofp(qv, V32F), _splat(b, b.fmul(d, b.uitofp(sc, F32), flags=FAST), 32),
                        _splat(b, b.fmul(dmin, b.uitofp(m, F32), flags=FAST), 32)))
    elif fmt == "q6_k":  # values 128n + 32g: ql nibbles | 2 bits of qh << 4, − 32; int8 scale per 16
        d = f16(Q6K_D)
        sc = [b.fmul(d, b.sitofp(b.load(b.gep(p, [off(Q6K_SCALES + i)])), F32), flags=FAST)
              for i in range(16)]
        for n in range(2):
            A, B = _vload(b, p, off(64 * n), V32I8, 1), _vload(b, p, off(64 * n + 32), V32I8, 1)
            H = _vload(b, p, off(Q6K_QH + 32 * n), V32I8, 1)
            for g, (low, hsh) in enumerate(((_bits(b, A, 0, 15), 0), (_bits(b, B, 0, 15), 2),
                                            (_bits(b, A, 4, None), 4), (_bits(b, B, 4, None), 6))):
                q = b.sub(b.or_(low, b.shl(_bits(b, H, hsh, 3), _c(V32I8, [4] * 32))), _c(V32I8, [32] * 32))
                out.append((b.sitofp(q, V32F), _halves(b, sc[8 * n + 2 * g], sc[8 * n + 2 * g + 1]), None))
    elif fmt == "q2_k":  # values 128n + 32j + l: bits 2j of qs[32n + l]; scale | min << 4 per 16
        d, dmin = f16(Q2K_D), f16(Q2K_D + 2)
        s = [_u8(b, p, off(i)) for i in range(16)]
        dl = [b.fmul(d, b.uitofp(b.and_(v, c(15)), F32), flags=FAST) for v in s]
        ml = [b.fmul(dmin, b.uitofp(b.lshr(v, c(4)), F32), flags=FAST) for v in s]
        for n in range(2):
            Q = _vload(b, p, off(Q2K_QS + 32 * n), V32I8, 1)
            for j in range(4):
                k = 8 * n + 2 * j
                out.append((b.uitofp(_bits(b, Q, 2 * j, 3), V32F), _halves(b, dl[k], dl[k + 1]),
                            _halves(b, ml[k], ml[k + 1])))
    elif fmt == "q3_k":  # values 128n + 32j + l: bits 2j of qs[32n + l], − 4 unless bit 4n + j of hmask[l]
        d = f16(Q3K_D)
        s = [_u8(b, p, off(Q3K_SCALES + i)) for i in range(12)]
        dl = []
        for k in range(16):  # low 4 bits from bytes 0-7, high 2 bits from bytes 8-11, − 32
            lo = b.and_(b.lshr(s[k % 8], c(4 * (k // 8))), c(15))
            hi = b.and_(b.lshr(s[8 + k % 4], c(2 * (k // 4))), c(3))
            dl.append(b.fmul(d, b.sitofp(b.sub(b.or_(lo, b.shl(hi, c(4))), c(32)), F32), flags=FAST))
        H = _vload(b, p, off(0), V32I8, 1)
        for n in range(2):
            Q = _vload(b, p, off(Q3K_QS + 32 * n), V32I8, 1)
            for j in range(4):
                hb = b.shl(_bits(b, H, 4 * n + j, 1), _c(V32I8, [2] * 32))
                q = b.sub(b.or_(_bits(b, Q, 2 * j, 3), hb), _c(V32I8, [4] * 32))
                k = 8 * n + 2 * j
                out.append((b.sitofp(q, V32F), _halves(b, dl[k], dl[k + 1]), None))
    else:  # iq4_xs: sub-block j: kvalues_iq4nl of 16 bytes' nibbles (low ones first), d·(scale − 32)
        assert fmt == "iq4_xs", fmt
        d = f16(0)
        sh = b.or_(_u8(b, p, off(2)), b.shl(_u8(b, p, off(3)), c(8)))
        for j in range(8):
            lo = b.and_(b.lshr(_u8(b, p, off(IQ4XS_SL + j // 2)), c(4 * (j % 2))), c(15))
            hi = b.and_(b.lshr(sh, c(2 * j)), c(3))
            sc = b.fmul(d, b.sitofp(b.sub(b.or_(lo, b.shl(hi, c(4))), c(32)), F32), flags=FAST)
            q = b.sitofp(_lookup16(b, _nibbles(b, p, off(IQ4XS_QS + 16 * j))), V32F)
            out.append((q, _splat(b, sc, 32), None))
    return out


def _axpy_blocks_codegen(fmt):
    nbytes, nvals = type_size(fmt), block_size(fmt)
    lines = (nbytes + 63) // 64

    def codegen(context, builder, sig, args):
        # args: y (float32), w, wn (uint8 rows of blocks), coef (float32), nb: y[:nb·B] += coef·w
        y = _data(context, builder, sig.args[0], args[0])
        w = _data(context, builder, sig.args[1], args[1])
        wn = _data(context, builder, sig.args[2], args[2])
        coef, nb = args[3], args[4]
        ity = nb.type

        def body(blk, carry):
            base = builder.mul(blk, _c(ity, nbytes))
            _prefetch_lines(builder, wn, base, lines)
            yo = builder.mul(blk, _c(ity, nvals))
            for u, (q, scale, minimum) in enumerate(_axpy_groups(fmt, builder, w, base, coef)):
                o = builder.add(yo, _c(ity, 32 * u))
                t = builder.fmul(q, scale, flags=FAST)
                if minimum is not None:
                    t = builder.fsub(t, minimum, flags=FAST)
                _vstore(builder, builder.fadd(_vload(builder, y, o, V32F, 4), t, flags=FAST), y, o, 4)
            return carry

        _loop(builder, nb, _c(I32, 0), body)
        return context.get_dummy_value()

    return codegen


def _axpy_blocks(fmt):
    gen = _axpy_blocks_codegen(fmt)

    def typer(typingctx, y, w, wn, coef, nb):
        return types.void(y, w, wn, coef, nb), gen

    typer.__name__ = f"axpy_{fmt}"
    return intrinsic(typer)


# y[:nb·B] += coef · (row w's nb (super-)blocks of B values, decoded); row wn is prefetched
(axpy_q8_0, axpy_q4_0, axpy_q4_1, axpy_q5_0, axpy_q5_1, axpy_iq4_nl,
 axpy_q2_k, axpy_q3_k, axpy_q4_k, axpy_q5_k, axpy_q6_k, axpy_iq4_xs) = (_axpy_blocks(t) for t in SPARSE_B)


@njit(fastmath=True, cache=True, inline="always")
def _axpy_kind(kind, p, w, wn, coef, nb):  # p += coef · row w (``kind``: SPARSE_B order), wn prefetched
    if kind == 0:
        axpy_q8_0(p, w, wn, coef, nb)
    elif kind == 1:
        axpy_q4_0(p, w, wn, coef, nb)
    elif kind == 2:
        axpy_q4_1(p, w, wn, coef, nb)
    elif kind == 3:
        axpy_q5_0(p, w, wn, coef, nb)
    elif kind == 4:
        axpy_q5_1(p, w, wn, coef, nb)
    elif kind == 5:
        axpy_iq4_nl(p, w, wn, coef, nb)
    elif kind == 6:
        axpy_q2_k(p, w, wn, coef, nb)
    elif kind == 7:
        axpy_q3_k(p, w, wn, coef, nb)
    elif kind == 8:
        axpy_q4_k(p, w, wn, coef, nb)
    elif kind == 9:
        axpy_q5_k(p, w, wn, coef, nb)
    elif kind == 10:
        axpy_q6_k(p, w, wn, coef, nb)
    else:
        axpy_iq4_xs(p, w, wn, coef, nb)


@njit(parallel=True, fastmath=True, cache=True)
def _sparse_block_rows(W, a, active, y, kind):  # W (d_ffn, nb · block bytes) uint8; kind: SPARSE_B
    n, r = y.shape[0], active.shape[0]
    nb = n // SPARSE_B_VALUES[kind]
    nch = min(SPARSE_CHUNKS, max(1, (r + 3) // 4))
    part = np.zeros((nch, n), np.float32)
    step = (r + nch - 1) // nch
    for c in prange(nch):
        p = part[c]
        hi = min(r, (c + 1) * step)
        for jj in range(c * step, hi):
            _axpy_kind(kind, p, W[active[jj]], W[active[min(jj + 1, hi - 1)]], a[active[jj]], nb)
    _sum_parts(part, y)


@njit(parallel=True, fastmath=True, cache=True)
def _decode_block_rows(W, out, kind):  # W (n, nb · block bytes) uint8 -> out (n, nb · B) float32
    n = W.shape[0]
    nb = out.shape[1] // SPARSE_B_VALUES[kind]
    one = np.float32(1.0)
    for i in prange(n):
        o = out[i]
        for col in range(o.shape[0]):
            o[col] = 0.0
        _axpy_kind(kind, o, W[i], W[min(i + 1, n - 1)], one, nb)


@njit(cache=True)
def _decode_rows_at(W, rows, out, kind):  # out[i] = row rows[i] of W decoded, serially
    nb = out.shape[1] // SPARSE_B_VALUES[kind]
    one = np.float32(1.0)
    for i in range(rows.shape[0]):
        o = out[i]
        for col in range(o.shape[0]):
            o[col] = -0.0  # -0 + v is v to the bit, -0 included (gguf-py's decoded zeros keep their sign)
        _axpy_kind(kind, o, W[rows[i]], W[rows[i]], one, nb)


def decode_rows_at(fmt: str, W: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Rows ``rows`` of W (the file's blocks of type ``fmt``) decoded to float32 (len(rows), values
    per row) on the calling thread: the embedding look-up of a decode step, one row. One compiled
    call, where gguf-py's dequantizer runs a dozen numpy operations: in a decode step, right after
    the output matrix has streamed through the caches, those took ~0.3 ms cold (Llama-3.1-8B-dims
    Q4_0, AMD EPYC), this ~0.03 ms; no thread is woken for a row."""
    out = np.empty((len(rows), W.shape[1] // type_size(fmt) * block_size(fmt)), np.float32)
    _decode_rows_at(W, np.asarray(rows, np.int64), out, SPARSE_B_KIND[fmt])
    return out


def decode_block_rows(fmt: str, W: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Every row of W (the file's blocks of type ``fmt``, our lower-case name) decoded into ``out``
    (rows, values per row) float32: the sparse kernels' per-type decoders with coefficient 1, one
    row per thread step. For readers of whole matrices (the checker's R3 streams every layer's
    weights): gguf-py's numpy dequantizer decodes ~50 M values/s here, this ~20x that."""
    _decode_block_rows(W, out, SPARSE_B_KIND[fmt])
    return out


def _sparse_rows_of(fmt):
    kind = SPARSE_B_KIND[fmt]

    def sparse_rows(W, a, active, y):
        _sparse_block_rows(W, a, active, y, kind)

    sparse_rows.__name__ = sparse_rows.__qualname__ = f"sparse_rows_{fmt}"
    sparse_rows.__doc__ = f"y = Σ_(j ∈ active) a[j]·W[j], W's rows {fmt} blocks (the file's bytes)"
    return sparse_rows


# sparse_rows_<type>(W, a, active, y): W (d_ffn, bytes per row) uint8, the file's neuron-major rows;
# a (d_ffn,) float32; active (k,) int64; y (n,) float32 is overwritten
SPARSE_BLOCK_ROWS = {t: _sparse_rows_of(t) for t in SPARSE_B}  # every block type's, by our name
(sparse_rows_q8_0, sparse_rows_q4_0, sparse_rows_q4_1, sparse_rows_q5_0, sparse_rows_q5_1, sparse_rows_iq4_nl,
 sparse_rows_q2_k, sparse_rows_q3_k, sparse_rows_q4_k, sparse_rows_q5_k, sparse_rows_q6_k,
 sparse_rows_iq4_xs) = SPARSE_BLOCK_ROWS.values()


def sparse_block_rows(fmt, W, a, active, y):
    """``sparse_rows_<fmt>``: y = Σ_{j ∈ active} a[j] · row_j for a block type (our lower-case name)."""
    SPARSE_BLOCK_ROWS[fmt](W, a, active, y)
