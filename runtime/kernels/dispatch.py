"""What the runtime calls: a block type's matmul in float (``mm_block``), in int8
(``mm_block_int8``) or in the caller's arithmetic (``mm_block_arith``, and ``mm_f16_arith`` for
F16 weights; an ``Arithmetic`` value, runtime.kernels.arithmetic, passed by the caller), and the
arithmetic as the outputs print it (``arithmetic_label``)."""

from __future__ import annotations

import numpy as np

from runtime.kernels import amx, gemm
from runtime.kernels.arithmetic import DEFAULT, GEMM_MIN_TOKENS, Arithmetic
from runtime.kernels.blocks32 import B32, B32_KIND, mm_b32
from runtime.kernels.blocks32_int import AFFINE_B32, INT_DOT_NAMES, mm_b32_int8
from runtime.kernels.float_rows import (
    LUT_F16,
    ONE_ROW_X_BYTES,
    mm_f16,
    mm_f16_half_x,
    mm_f16_half_x_one,
    mm_lut_rows,
)
from runtime.kernels.gemm import gemm_rows, q8_0_values, q8_k_values
from runtime.kernels.ggml_order import GGML_B32_KIND, GGML_KQ_KIND, mm_b32_ggml, mm_kq_ggml
from runtime.kernels.ir_helpers import int_dot_features
from runtime.kernels.kq_row_tiles import KQ_ROW_TYPES, arranged_kq, mm_kq_rows
from runtime.kernels.kq_tiles import (
    B32_TILES,
    LANE_VALUES,
    SIGNED,
    arranged,
    arranged_two,
    mm_tiles,
    tiled,
)
from runtime.kernels.kquants import KQ_KIND, KQ_TYPES, KQ_XSUM, mm_kq, xsum
from runtime.kernels.kquants_int import KQ_DOT_NAMES, KQ_INT, KQ_INT_KIND, mm_kq_int8
from runtime.kernels.quantize import quantize_activations, quantize_activations_k
from runtime.kernels.row_tiles import ROW_TYPES, arranged_rows, mm_rows, pads_lanes
from runtime.kernels.sparse import decode_block_rows
from runtime.kernels.type_traits import names

# 32-value block types with an int8-activation kernel (Q8_0 / Q8_1 activation blocks)
INT8_TYPES = names("b32", by="int8_kind")
assert INT8_TYPES == B32  # mm_b32_int8 takes mm_b32's kinds
INT8_ALL = B32 + KQ_INT  # every type with an int8 kernel (``mm_block_int8``); the rest run float
INT8_DEFAULT = frozenset(INT8_ALL)  # the types "int8" runs int8 (all that have a kernel)


def mm_block(fmt, W, X, rows, Y):
    """Y[:, rows] = X @ W[rows]ᵀ (rows None: every row) for a block type ``fmt`` (our lower-case name: "q8_0", "q4_k",
    ...); W (n, bytes per row) uint8 holds each row's blocks exactly as the file stores them.
    Float arithmetic always; ``mm_block_arith`` follows the caller's ``Arithmetic``."""
    if fmt in B32_KIND:
        mm_b32(W, X, rows, Y, B32_KIND[fmt])
    else:  # types without a minimum get X in place of the (unused) sums
        mm_kq(W, X, xsum(X, KQ_XSUM[fmt]) if fmt in KQ_XSUM else X, rows, Y, KQ_KIND[fmt])


BLOCK_TYPES = names(("b32", "kq"))  # every type mm_block runs (every block row of type_traits)
assert BLOCK_TYPES == B32 + KQ_TYPES


def _quantized(X, how, arith: Arithmetic):  # how: "k" (Q8_K), False (Q8_0) or True (Q8_1)
    """X's int8 activation blocks, made once for the matmuls sharing X (``Arithmetic.sharing``)."""
    return arith.cached(X, how, lambda: quantize_activations_k(X) if how == "k" else quantize_activations(X, how))


def mm_block_int8(fmt, W, X, rows, Y, arith: Arithmetic = DEFAULT):
    """``mm_block`` with X quantized to int8 blocks first (one of INT8_TYPES or KQ_INT): integer
    block dot products, what llama.cpp computes (its error is the activations' 8-bit rounding).
    32-value types: Q8_0 activation blocks; KQ_INT: Q8_K blocks of 256 with group sums."""
    # the every-type kernels, as runtime.decode_block calls them: kernels built per type compile
    # faster but, under fastmath, were not always the same bits (docs/benchmarks.md, start-up)
    if fmt in KQ_INT_KIND:
        mm_kq_int8(W, *_quantized(X, "k", arith), rows, Y, KQ_INT_KIND[fmt])
    else:
        mm_b32_int8(W, *_quantized(X, fmt in AFFINE_B32, arith), rows, Y, B32_KIND[fmt])


def _kept(arith: Arithmetic, fmt, W, X, layout: str):
    """The matrix's unpacked rows kept in ``arith.kept`` (a KeptRows: perplexity's windows, R1's
    passes), unpacked now if its budget allows; None without a store."""
    return None if arith.kept is None else arith.kept.rows(fmt, W, X.shape[1], layout)


def _blocks(X, fmt, arith):  # the int8 blocks fmt's tiles take: Q8_0 (xq, xd) or Q8_K (xq, xd, xb)
    return _quantized(X, False, arith)[:2] if fmt in B32_TILES else _quantized(X, "k", arith)


def _dequantized(X, fmt, arith):
    """The int8 activation blocks ``fmt``'s int8 kernel would multiply, as float32 values."""
    how = "k" if fmt in KQ_INT_KIND else fmt in AFFINE_B32
    return arith.cached(X, ("values", how), lambda: q8_k_values(X) if how == "k" else q8_0_values(X))


def _layout_key(fmt):  # activations arranged for fmt serve every type with the same key
    return "b32" + "s" * (fmt in SIGNED) if fmt in B32_TILES else LANE_VALUES[fmt]


def _arranged(X, fmt, arith, two: bool = False):
    """X's int8 blocks (and with ``two`` their second plane) in ``fmt``'s lane layout
    (runtime.kernels.kq_tiles: Q8_K for the K-quants, Q8_0 for the 32-value types)."""
    if two:
        return arith.cached(X, ("lanes2", _layout_key(fmt)), lambda: arranged_two(fmt, X, *_blocks(X, fmt, arith)))
    return arith.cached(X, ("lanes", _layout_key(fmt)), lambda: arranged(fmt, *_blocks(X, fmt, arith)))


def _arranged_rows(X, two: bool, arith):
    """X's Q8_0 blocks (and with ``two`` their second plane) as the row tiles take them
    (``row_tiles.arranged_rows``)."""
    return arith.cached(X, ("rows", two), lambda: arranged_rows(*_quantized(X, False, arith)[:2], X if two else None))


def _rows(fmt, W, X, Y, two: bool, arith) -> bool:
    """The row tiles, where they are faster than the lane tiles: on rows kept unpacked
    (perplexity's windows, R1's passes) and on rows the lane layout pads by an eighth or more
    (d 640); unpacked per call, rows of 4096 values and more run slower than the lane tiles (the
    move into groups of 16 rows costs more than the padding it saves; docs/benchmarks.md, "row
    tiles"). Whether they ran."""
    kept = _kept(arith, fmt, W, X, "rows")
    if kept is None and not pads_lanes(X.shape[1]):
        return False
    mm_rows(fmt, W, _arranged_rows(X, two, arith), Y, gemm.CHUNK_VALUES, kept)
    return True


def _kq_rows(fmt, W, X, Y, arith, two: bool = False) -> None:
    """The K-quant row tiles (runtime.kernels.kq_row_tiles) over every row of W: X's Q8_K blocks
    (and with ``two`` their second plane) arranged once per input."""
    Xa = arith.cached(X, ("kq_rows", fmt == "q6_k", two),
                      lambda: arranged_kq(fmt, *_quantized(X, "k", arith)[:2], X if two else None))
    mm_kq_rows(fmt, W, Xa, Y, _kept(arith, fmt, W, X, "rows"))


def _amx(fmt, W, X, Y, arith, two: bool = False) -> None:
    """The AMX tiles (runtime.kernels.amx) over every row of W: X's int8 blocks (and with ``two``
    their second plane) as the tiles load them."""
    key = ("amx2" if two else "amx", "b32" if fmt in B32_TILES else LANE_VALUES[fmt])
    make = (lambda: amx.arranged_amx2(fmt, X, *_blocks(X, fmt, arith))) if two else (
        lambda: amx.arranged_amx(fmt, *_blocks(X, fmt, arith)))
    amx.mm_amx(fmt, W, arith.cached(X, key, make), Y, gemm.CHUNK_VALUES, _kept(arith, fmt, W, X, "values"))


def _lane_tiles(fmt, W, X, Y, arith, two: bool = False) -> None:
    """The lane-layout register tiles (runtime.kernels.kq_tiles) over every row of W."""
    mm_tiles(fmt, W, _arranged(X, fmt, arith, two), Y, gemm.CHUNK_VALUES, _kept(arith, fmt, W, X, "lanes"))


def mm_block_gemm(fmt, W, X, Y, int8: bool, arith: Arithmetic = DEFAULT):
    """Y = X @ Wᵀ over every row of W (the file's blocks of type ``fmt``) for many tokens. In
    int8, kq_tiles.TILE_TYPES (Q4_K, Q5_K, Q6_K, Q8_0 (with VNNI), Q4_0, Q4_1, Q5_0, Q5_1) run on
    AMX tiles where the CPU has them (runtime.kernels.amx), else integer register tiles: 16 rows
    in a vector's lanes for Q8_0, Q4_0 and Q5_0 where those are faster (runtime.kernels.row_tiles,
    ``_rows``), the K-quant row tiles, the lane layout otherwise (runtime.kernels.kq_tiles); all
    form the one-token kernels' integer sums; the other types, and every type under float, are
    decoded once, in chunks, and multiplied in float32 GEMMs (runtime.kernels.gemm), X first
    rounded to the int8 kernel's activation blocks under ``int8``."""
    if int8 and amx.amx_runs(fmt, X.shape[1]):
        _amx(fmt, W, X, Y, arith)
    elif int8 and tiled(fmt) and fmt in ROW_TYPES and _rows(fmt, W, X, Y, False, arith):
        pass
    elif int8 and tiled(fmt) and fmt in KQ_ROW_TYPES:  # faster than the lane tiles at every shape measured
        _kq_rows(fmt, W, X, Y, arith)
    elif int8 and tiled(fmt):
        _lane_tiles(fmt, W, X, Y, arith)
    else:
        Xf = _dequantized(X, fmt, arith) if int8 else X
        gemm_rows(W, Xf, Y, lambda Wc, out: decode_block_rows(fmt, Wc, out))


# Matrices of at least this many values run "int16" in the two-plane lane tiles where the CPU has
# no AMX (Q4_1, Q5_1, and Q8_0/Q4_0/Q5_0 where ``_rows`` leaves them there); smaller ones in the
# float32 GEMM, which is then faster (docs/benchmarks.md, "int16 tiles").
INT16_TILES_MIN_VALUES = 1 << 22

# From this many tokens the K-quants' int8 matmuls take their row tiles (with ``batched`` on, and
# below GEMM_MIN_TOKENS too), whose sums are llama.cpp's tiled K-quant path's. That path starts at
# 8 tokens (ggml_tiled_min_batch); below 16 ours keeps the one-token kernels, faster there
# (docs/benchmarks.md, "K-quant row tiles").
KQ_ROWS_MIN_TOKENS = 16

# llama.cpp's tiled K-quant kernel runs from this many tokens (ggml_tiled_min_batch); below, its
# one-token vec_dot kernels, token by token
LLAMACPP_TILED_MIN_TOKENS = 8


def _mm_llamacpp(fmt, W, X, rows, Y, arith) -> bool:
    """``fmt``'s matmul summed as llama.cpp's CPU backend sums it on its plain buffers (the
    "llamacpp" arithmetic), where a kernel mirrors it; whether one ran. Q8_0, Q4_0, Q5_0 at any
    token count (runtime.kernels.ggml_order's blockwise kernels: its vec_dot_*_q8_0 and
    tinyBLAS_Q0); Q4_K, Q5_K, Q6_K from 8 tokens (the K-quant row tiles: its tiled kernel) and
    below (its vec_dot_q4_K/q5_K/q6_K_q8_K). The other types keep the int8 kernels."""
    T = X.shape[0]
    if fmt in KQ_ROW_TYPES and rows is None and T >= LLAMACPP_TILED_MIN_TOKENS and tiled(fmt):
        _kq_rows(fmt, W, X, Y, arith)
    elif fmt in GGML_KQ_KIND:
        xq, xd, xb = _quantized(X, "k", arith)
        mm_kq_ggml(W, xq, xd, xb, rows, Y, GGML_KQ_KIND[fmt])
    elif fmt in GGML_B32_KIND:
        mm_b32_ggml(W, *_quantized(X, False, arith), rows, Y, GGML_B32_KIND[fmt])
    else:
        return False
    return True


def _mm_int16(fmt, W, X, Y, arith) -> bool:
    """A many-token product under "int16" on integer tiles, two int8 activation planes (one for
    the output head, ``Arithmetic.for_head``); whether one ran (else the float GEMM runs)."""
    k = X.shape[1]
    if arith.head and fmt in INT8_DEFAULT and (amx.amx_runs(fmt, k) or tiled(fmt)):
        mm_block_gemm(fmt, W, X, Y, True, arith)
    elif amx.amx_runs(fmt, k):
        _amx(fmt, W, X, Y, arith, two=True)
    elif tiled(fmt) and fmt in ROW_TYPES and _rows(fmt, W, X, Y, True, arith):
        pass
    elif tiled(fmt) and fmt in KQ_ROW_TYPES:
        _kq_rows(fmt, W, X, Y, arith, two=True)
    elif tiled(fmt) and W.shape[0] * k >= INT16_TILES_MIN_VALUES:
        _lane_tiles(fmt, W, X, Y, arith, two=True)
    else:
        return False
    return True


def mm_block_arith(fmt, W, X, rows, Y, arith: Arithmetic = DEFAULT):
    """``mm_block`` in ``arith``: int8 for INT8_ALL under "int8", else float. What the runtime's
    weights call (runtime.weights.KERNELS). A whole-matrix product of many tokens
    (``Arithmetic.use_gemm``) decodes the weights once (``mm_block_gemm``), in the same arithmetic."""
    int8 = arith.ggml and fmt in INT8_DEFAULT
    if int8 and arith.name == "llamacpp" and _mm_llamacpp(fmt, W, X, rows, Y, arith):
        return
    T, k = X.shape
    if (int8 and rows is None and fmt in KQ_ROW_TYPES and tiled(fmt) and KQ_ROWS_MIN_TOKENS <= T
            and arith.batched and not (arith.use_gemm(T) and amx.amx_runs(fmt, k))):
        _kq_rows(fmt, W, X, Y, arith)
    elif rows is None and arith.use_gemm(T):
        if not (arith.name == "int16" and _mm_int16(fmt, W, X, Y, arith)):
            mm_block_gemm(fmt, W, X, Y, int8, arith)
    elif int8:
        mm_block_int8(fmt, W, X, rows, Y, arith)
    else:
        mm_block(fmt, W, X, rows, Y)


def mm_f16_arith(W, X, rows, Y, arith: Arithmetic = DEFAULT):
    """``mm_f16`` in ``arith``: under llama.cpp's ("int8", "llamacpp") x rounded to fp16 first,
    as ggml's vec_dot_f16 does; otherwise x float32 (exact to float32 rounding)."""
    if not arith.ggml:
        mm_f16(W, X, rows, Y)
        return
    XH = X.astype(np.float16)
    if X.shape[1] % 32:  # the plain fallback, on the same fp16-rounded x
        mm_lut_rows(W, LUT_F16, XH.astype(np.float32), rows, Y)
    elif 2 * X.shape[1] <= ONE_ROW_X_BYTES:
        mm_f16_half_x_one(W, XH.view(np.uint16), rows, Y)
    else:
        mm_f16_half_x(W, XH.view(np.uint16), rows, Y)


def arithmetic_label(arith: Arithmetic | str = DEFAULT, kinds=None) -> str:
    """The arithmetic ``arith`` for the tensor types ``kinds`` (gguf-py names; None: any), as the
    outputs print it: "int8 (Q8_0 activations, AVX-512 VNNI vpdpbusd)" (plus "; from 32 tokens: AMX
    tiles" where the AMX tiles run the many-token matmuls), "fp16 activations (F16
    weights, as ggml's vec_dot_f16)" for a file of F16 matrices, or "float"."""
    name = Arithmetic.of(arith).name
    lower = None if kinds is None else {k.lower() for k in kinds}
    if name == "llamacpp":
        exact = [t.upper() for t in BLOCK_TYPES if (t in GGML_B32_KIND or t in GGML_KQ_KIND) and (lower is None or t in lower)]
        # the order mirrored is llama.cpp's x86 AVX-512 VNNI build's (its tiled K-quant kernel and
        # ggml_ops' 16-lane reductions); elsewhere the same kernels run, in that order, not the CPU's
        where = "" if int_dot_features() == "avx512vnni" else ", as its AVX-512 VNNI build sums (not this CPU's build)"
        return (f"llamacpp (int8 summed in llama.cpp's order{': ' + '/'.join(exact) if exact else ''}{where}; "
                "other types int8)")
    if name == "float":
        return "float"
    if name == "int16":
        tiled_types = {t for t in amx.AMX_TYPES if tiled(t)} if lower is None else {t for t in lower if tiled(t)}
        if not tiled_types:
            return "int16 (float here: no integer tiles for these types)"
        if amx.amx_available():
            return f"int16 (float; from {GEMM_MIN_TOKENS} tokens: AMX tiles on two int8 activation planes)"
        which = [n for n, ts in (("Q4_K/Q5_K/Q6_K", KQ_ROW_TYPES), ("Q8_0/Q4_0/Q5_0 with short or kept rows", ROW_TYPES))
                 if tiled_types & set(ts)]
        if tiled_types - set(KQ_ROW_TYPES) - set(ROW_TYPES) or tiled_types & set(ROW_TYPES):
            which.append(f"other matrices of {INT16_TILES_MIN_VALUES >> 20} M values and more")
        return (f"int16 (float; from {GEMM_MIN_TOKENS} tokens, {', '.join(which)}: register tiles "
                f"({INT_DOT_NAMES[int_dot_features()]}) on two int8 activation planes)")
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
    tiles = f"; from {GEMM_MIN_TOKENS} tokens: AMX tiles" if pick & set(amx.AMX_TYPES) and amx.amx_available() else ""
    return f"int8 ({acts}, {' / '.join(d for _, d in used)}{tiles}{extra}{f16})"
