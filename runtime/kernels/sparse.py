"""The sparse down projection, y = Σ_{j∈active} a[j]·row_j over the rows of a transposed (or
neuron-major) matrix: F32/F16/BF16 rows (``sparse_rows_f32`` ...) and every block type
(``sparse_block_rows``), through per-type ``axpy_*`` intrinsics, which also decode whole block
rows to float32 (``decode_rows_at``, ``decode_block_rows``)."""

from __future__ import annotations

import numpy as np
from numba import njit, prange, types
from numba.extending import intrinsic

from aios.quant import block_size, type_size
from runtime.kernels.blocks32 import B32, B32_AFFINE, b32_values, lookup16, nibbles
from runtime.kernels.kquants import KQ_TYPES
from runtime.kernels.float_rows import (
    BF16_ROWS,
    F16_ROWS,
    F32_ROWS,
    LUT_BF16,
    LUT_F16,
    axpy4_bf16,
    axpy4_f16,
    axpy4_f32,
)
from runtime.kernels.groups import group4
from runtime.kernels.ir_helpers import (
    F32,
    FAST,
    I32,
    V32F,
    V32I8,
    array_data,
    bitfield,
    const,
    f16_at,
    ir_loop,
    prefetch_lines,
    splat,
    splat_halves,
    u8_at,
    vload,
    vstore,
)
from runtime.kernels.kquants import (
    IQ4XS_QS,
    IQ4XS_SL,
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
from runtime.kernels.type_traits import TYPE_TRAITS

SPARSE_CHUNKS = 8  # partial sums per sparse down-projection call: balances two to eight threads


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
def _sparse_rows(Wt, a, active, y, kind):  # Wt (d_ffn, n): F32 or F16/BF16 bits (kind: F32_ROWS, F16_ROWS, BF16_ROWS)
    n, r = Wt.shape[1], active.shape[0]
    nch = min(SPARSE_CHUNKS, max(1, (r + 3) // 4))
    part = np.zeros((nch, n), np.float32)
    step = (r + nch - 1) // nch
    for c in prange(nch):
        lo, hi = c * step, min(r, (c + 1) * step)
        act = active[lo:hi]
        for g in range((hi - lo + 3) // 4):
            j0, j1, j2, j3 = group4(act, hi - lo, g)
            n0, n1, n2, n3 = group4(act, hi - lo, g + 1)
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
# (the dense kernels' decoders: b32_values; the K-quant bit fields as in _q*_k_row), their scale
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
SPARSE_B = B32 + KQ_TYPES  # = dispatch.BLOCK_TYPES; the order of the ``kind`` branches and of the names below
assert SPARSE_B == ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_xs")
SPARSE_B_KIND = {fmt: i for i, fmt in enumerate(SPARSE_B)}  # the run-time ``kind`` of _sparse_block_rows
# values per (super-)block
SPARSE_B_VALUES = np.array([TYPE_TRAITS[t].block_values for t in SPARSE_B], np.int64)


def _axpy_groups(fmt, b, p, base, coef):
    """The (super-)block at p[base] as [(values, scale, minimum or None)], one per 32 values: q as
    <32 x float>, and coef·(its scale) / coef·(its minimum) as <32 x float> (halves where a scale
    covers 16 values); the block's values are q·scale − minimum (layouts: ggml-common.h)."""
    off = lambda k: b.add(base, const(base.type, k))  # noqa: E731
    f16 = lambda k: b.fmul(f16_at(b, p, off(k)), coef, flags=FAST)  # noqa: E731
    c = lambda v: const(I32, v)  # noqa: E731
    if fmt in B32:  # d·q (+ m): q from b32_values (offset and IQ4_NL's table included)
        m = splat(b, b.fsub(const(F32, 0.0), f16(2), flags=FAST), 32) if fmt in B32_AFFINE else None
        return [(b32_values(b, fmt, p, base), splat(b, f16(0), 32), m)]
    out = []
    if fmt in ("q4_k", "q5_k"):  # sub-block j = 2jj + half: nibbles of qs[32jj:32jj + 32] (| qh bit j)
        q5 = fmt == "q5_k"
        d, dmin = f16(0), f16(2)
        s = [u8_at(b, p, off(Q4K_SCALES + i)) for i in range(12)]
        H = vload(b, p, off(Q5K_QH), V32I8, 1) if q5 else None
        for j in range(8):  # ggml's get_scale_min_k4
            if j < 4:
                sc, m = b.and_(s[j], c(63)), b.and_(s[j + 4], c(63))
            else:
                sc = b.or_(b.and_(s[j + 4], c(15)), b.shl(b.lshr(s[j - 4], c(6)), c(4)))
                m = b.or_(b.lshr(s[j + 4], c(4)), b.shl(b.lshr(s[j], c(6)), c(4)))
            q = vload(b, p, off((Q5K_QS if q5 else Q4K_QS) + 32 * (j // 2)), V32I8, 1)
            qv = bitfield(b, q, 4 * (j % 2), 15)
            if q5:
                qv = b.or_(qv, b.shl(bitfield(b, H, j, 1), const(V32I8, [4] * 32)))
            out.append((b.uitofp(qv, V32F), splat(b, b.fmul(d, b.uitofp(sc, F32), flags=FAST), 32),
                        splat(b, b.fmul(dmin, b.uitofp(m, F32), flags=FAST), 32)))
    elif fmt == "q6_k":  # values 128n + 32g: ql nibbles | 2 bits of qh << 4, − 32; int8 scale per 16
        d = f16(Q6K_D)
        sc = [b.fmul(d, b.sitofp(b.load(b.gep(p, [off(Q6K_SCALES + i)])), F32), flags=FAST)
              for i in range(16)]
        for n in range(2):
            A, B = vload(b, p, off(64 * n), V32I8, 1), vload(b, p, off(64 * n + 32), V32I8, 1)
            H = vload(b, p, off(Q6K_QH + 32 * n), V32I8, 1)
            for g, (low, hsh) in enumerate(((bitfield(b, A, 0, 15), 0), (bitfield(b, B, 0, 15), 2),
                                            (bitfield(b, A, 4, None), 4), (bitfield(b, B, 4, None), 6))):
                q = b.sub(b.or_(low, b.shl(bitfield(b, H, hsh, 3), const(V32I8, [4] * 32))), const(V32I8, [32] * 32))
                out.append((b.sitofp(q, V32F), splat_halves(b, sc[8 * n + 2 * g], sc[8 * n + 2 * g + 1]), None))
    elif fmt == "q2_k":  # values 128n + 32j + l: bits 2j of qs[32n + l]; scale | min << 4 per 16
        d, dmin = f16(Q2K_D), f16(Q2K_D + 2)
        s = [u8_at(b, p, off(i)) for i in range(16)]
        dl = [b.fmul(d, b.uitofp(b.and_(v, c(15)), F32), flags=FAST) for v in s]
        ml = [b.fmul(dmin, b.uitofp(b.lshr(v, c(4)), F32), flags=FAST) for v in s]
        for n in range(2):
            Q = vload(b, p, off(Q2K_QS + 32 * n), V32I8, 1)
            for j in range(4):
                k = 8 * n + 2 * j
                out.append((b.uitofp(bitfield(b, Q, 2 * j, 3), V32F), splat_halves(b, dl[k], dl[k + 1]),
                            splat_halves(b, ml[k], ml[k + 1])))
    elif fmt == "q3_k":  # values 128n + 32j + l: bits 2j of qs[32n + l], − 4 unless bit 4n + j of hmask[l]
        d = f16(Q3K_D)
        s = [u8_at(b, p, off(Q3K_SCALES + i)) for i in range(12)]
        dl = []
        for k in range(16):  # low 4 bits from bytes 0-7, high 2 bits from bytes 8-11, − 32
            lo = b.and_(b.lshr(s[k % 8], c(4 * (k // 8))), c(15))
            hi = b.and_(b.lshr(s[8 + k % 4], c(2 * (k // 4))), c(3))
            dl.append(b.fmul(d, b.sitofp(b.sub(b.or_(lo, b.shl(hi, c(4))), c(32)), F32), flags=FAST))
        H = vload(b, p, off(0), V32I8, 1)
        for n in range(2):
            Q = vload(b, p, off(Q3K_QS + 32 * n), V32I8, 1)
            for j in range(4):
                hb = b.shl(bitfield(b, H, 4 * n + j, 1), const(V32I8, [2] * 32))
                q = b.sub(b.or_(bitfield(b, Q, 2 * j, 3), hb), const(V32I8, [4] * 32))
                k = 8 * n + 2 * j
                out.append((b.sitofp(q, V32F), splat_halves(b, dl[k], dl[k + 1]), None))
    else:  # iq4_xs: sub-block j: kvalues_iq4nl of 16 bytes' nibbles (low ones first), d·(scale − 32)
        assert fmt == "iq4_xs", fmt
        d = f16(0)
        sh = b.or_(u8_at(b, p, off(2)), b.shl(u8_at(b, p, off(3)), c(8)))
        for j in range(8):
            lo = b.and_(b.lshr(u8_at(b, p, off(IQ4XS_SL + j // 2)), c(4 * (j % 2))), c(15))
            hi = b.and_(b.lshr(sh, c(2 * j)), c(3))
            sc = b.fmul(d, b.sitofp(b.sub(b.or_(lo, b.shl(hi, c(4))), c(32)), F32), flags=FAST)
            q = b.sitofp(lookup16(b, nibbles(b, p, off(IQ4XS_QS + 16 * j))), V32F)
            out.append((q, splat(b, sc, 32), None))
    return out


def _axpy_blocks_codegen(fmt):
    nbytes, nvals = type_size(fmt), block_size(fmt)
    lines = (nbytes + 63) // 64

    def codegen(context, builder, sig, args):
        # args: y (float32), w, wn (uint8 rows of blocks), coef (float32), nb: y[:nb·B] += coef·w
        y = array_data(context, builder, sig.args[0], args[0])
        w = array_data(context, builder, sig.args[1], args[1])
        wn = array_data(context, builder, sig.args[2], args[2])
        coef, nb = args[3], args[4]
        ity = nb.type

        def body(blk, carry):
            base = builder.mul(blk, const(ity, nbytes))
            prefetch_lines(builder, wn, base, lines)
            yo = builder.mul(blk, const(ity, nvals))
            for u, (q, scale, minimum) in enumerate(_axpy_groups(fmt, builder, w, base, coef)):
                o = builder.add(yo, const(ity, 32 * u))
                t = builder.fmul(q, scale, flags=FAST)
                if minimum is not None:
                    t = builder.fsub(t, minimum, flags=FAST)
                vstore(builder, builder.fadd(vload(builder, y, o, V32F, 4), t, flags=FAST), y, o, 4)
            return carry

        ir_loop(builder, nb, const(I32, 0), body)
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
