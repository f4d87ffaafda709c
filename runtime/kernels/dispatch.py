"""What the runtime calls: a block type's matmul in float (``mm_block``), in int8
(``mm_block_int8``) or in the process's arithmetic (``mm_block_arith``, and ``mm_f16_arith`` for
F16 weights; ``set_arithmetic``), the int8 blocks of one input shared by the matmuls that read it
(``share_input``), and the arithmetic as the outputs print it (``arithmetic_label``)."""

from __future__ import annotations

import contextlib

import numpy as np

from runtime.kernels import amx, gemm
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
from runtime.kernels.gemm import gemm_rows, q8_0_values, q8_k_values, use_gemm
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

# --- the process-wide arithmetic of the block kernels ----------------------------------------
ARITHMETICS = ("int8", "float", "int16", "llamacpp")  # --arithmetic choices; the first is the default
GGML_ARITHMETICS = ("int8", "llamacpp")  # llama.cpp's arithmetic: int8 blocks, ggml's small operations
INT8_TYPES = B32  # 32-value block types with an int8-activation kernel (Q8_0 activation blocks)
INT8_ALL = B32 + KQ_INT  # every type with an int8 kernel (``mm_block_int8``); the rest run float
INT8_DEFAULT = frozenset(INT8_ALL)  # the types "int8" runs int8 (all that have a kernel)
_ARITHMETIC = {"name": ARITHMETICS[0], "head": False}


def set_arithmetic(name: str) -> str:
    """Run the block kernels with ``name`` arithmetic: "int8" (activations quantized to int8
    blocks per matmul, integer block dot products; types outside INT8_TYPES stay float),
    "float" (weights decoded to float times float activations) or "int16" (float, except that
    many-token matmuls on the AMX tiles take the activations as two int8 planes, 16-bit values:
    the float results to ~1/32,000 of a block's largest activation, at the tiles' speed; what
    perplexity is measured in) or "llamacpp" (int8, each sum in llama.cpp's order where a kernel
    mirrors it, ``_mm_llamacpp``: bit-identical logits on its plain CPU buffers, slower). Returns
    the name in effect."""
    from aios.errors import UsageError

    if name not in ARITHMETICS:
        raise UsageError(f"Unknown arithmetic '{name}'; choose from {', '.join(ARITHMETICS)}.")
    _ARITHMETIC["name"] = name
    return name


def arithmetic() -> str:
    """The block kernels' arithmetic in effect (one of ARITHMETICS)."""
    return _ARITHMETIC["name"]


@contextlib.contextmanager
def output_head():
    """Within: the model's output head (runtime.model). Under "int16" its many-token matmul takes
    the activations in one int8 plane where integer tiles run it (its input's 8-bit rounding
    reaches the logits once, not through later layers' roundings: held-out perplexity of the
    real Gemma 3 270M moved by +0.05 %, docs/benchmarks.md), at half the integer work of two
    planes: the head is most of a perplexity window's work at 8B dimensions. Other arithmetics:
    no change."""
    before = _ARITHMETIC["head"]
    _ARITHMETIC["head"] = True
    try:
        yield
    finally:
        _ARITHMETIC["head"] = before


def mm_block(fmt, W, X, rows, Y):
    """Y[:, rows] = X @ W[rows]ᵀ (rows None: every row) for a block type ``fmt`` (our lower-case name: "q8_0", "q4_k",
    ...); W (n, bytes per row) uint8 holds each row's blocks exactly as the file stores them.
    Float arithmetic always; ``mm_block_arith`` follows the process's ``set_arithmetic``."""
    if fmt in B32_KIND:
        mm_b32(W, X, rows, Y, B32_KIND[fmt])
    else:  # types without a minimum get X in place of the (unused) sums
        mm_kq(W, X, xsum(X, KQ_XSUM[fmt]) if fmt in KQ_XSUM else X, rows, Y, KQ_KIND[fmt])


BLOCK_TYPES = B32 + KQ_TYPES  # every type mm_block runs


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
    # the every-type kernels, as runtime.decode_block calls them: kernels built per type compile
    # faster but, under fastmath, were not always the same bits (docs/benchmarks.md, start-up)
    if fmt in KQ_INT_KIND:
        mm_kq_int8(W, *_quantized(X, "k"), rows, Y, KQ_INT_KIND[fmt])
    else:
        mm_b32_int8(W, *_quantized(X, fmt in AFFINE_B32), rows, Y, B32_KIND[fmt])


def _shared(X, key, make):
    """``make()``, kept for the other matmuls of X while ``share_input(X)`` holds X."""
    shared = X is _SHARED["x"]
    if shared and key in _SHARED["q"]:
        return _SHARED["q"][key]
    out = make()
    if shared:
        _SHARED["q"][key] = out
    return out


def _blocks(X, fmt):  # the int8 blocks fmt's tiles take: Q8_0 (xq, xd) or Q8_K (xq, xd, xb)
    return _quantized(X, False)[:2] if fmt in B32_TILES else _quantized(X, "k")


def _dequantized(X, fmt):
    """The int8 activation blocks ``fmt``'s int8 kernel would multiply, as float32 values."""
    how = "k" if fmt in KQ_INT_KIND else fmt in AFFINE_B32
    return _shared(X, ("values", how), lambda: q8_k_values(X) if how == "k" else q8_0_values(X))


def _layout_key(fmt):  # activations arranged for fmt serve every type with the same key
    return "b32" + "s" * (fmt in SIGNED) if fmt in B32_TILES else LANE_VALUES[fmt]


def _arranged(X, fmt):
    """X's int8 blocks in ``fmt``'s lane layout (runtime.kernels.kq_tiles: Q8_K for the
    K-quants, Q8_0 for the 32-value types)."""
    return _shared(X, ("lanes", _layout_key(fmt)), lambda: arranged(fmt, *_blocks(X, fmt)))


def _arranged_two(X, fmt):
    """X's int8 blocks and their second plane in ``fmt``'s lane layout (``kq_tiles.arranged_two``)."""
    return _shared(X, ("lanes2", _layout_key(fmt)), lambda: arranged_two(fmt, X, *_blocks(X, fmt)))


def _arranged_rows(X, two: bool):
    """X's Q8_0 blocks (and with ``two`` their second plane) as the row tiles take them
    (``row_tiles.arranged_rows``)."""
    return _shared(X, ("rows", two), lambda: arranged_rows(*_quantized(X, False)[:2], X if two else None))


def _rows(fmt, W, X, Y, two: bool) -> bool:
    """The row tiles, where they are faster than the lane tiles: on rows kept unpacked
    (perplexity's windows, R1's passes: 1.06-1.7x) and on rows the lane layout pads by an eighth
    or more (d 640: 1.3-2.9x); unpacked per call, rows of 4096 values and more run 0.81-0.92x
    the lane tiles (the move into groups of 16 rows costs more than the padding it saves).
    Whether they ran."""
    kept = amx.kept_rows(fmt, W, X.shape[1], "rows")
    if kept is None and not pads_lanes(X.shape[1]):
        return False
    mm_rows(fmt, W, _arranged_rows(X, two), Y, gemm.CHUNK_VALUES, kept)
    return True


def _arranged_kq(X, fmt, two: bool = False):
    """X's Q8_K blocks (and with ``two`` their second plane) as the K-quant row tiles of ``fmt``
    take them (``kq_row_tiles.arranged_kq``)."""
    return _shared(X, ("kq_rows", fmt == "q6_k", two), lambda: arranged_kq(fmt, *_quantized(X, "k")[:2], X if two else None))


def _arranged_amx(X, fmt):
    """X's int8 blocks as the AMX tiles load them (runtime.kernels.amx)."""
    key = ("amx", "b32" if fmt in B32_TILES else LANE_VALUES[fmt])
    return _shared(X, key, lambda: amx.arranged_amx(fmt, *_blocks(X, fmt)))


def _arranged_amx2(X, fmt):
    """X's int8 blocks and their second plane as the AMX tiles load them (``amx.arranged_amx2``)."""
    key = ("amx2", "b32" if fmt in B32_TILES else LANE_VALUES[fmt])
    return _shared(X, key, lambda: amx.arranged_amx2(fmt, X, *_blocks(X, fmt)))


def mm_block_gemm(fmt, W, X, Y, int8: bool):
    """Y = X @ Wᵀ over every row of W (the file's blocks of type ``fmt``) for many tokens. In
    int8, kq_tiles.TILE_TYPES (Q4_K, Q5_K, Q6_K, Q8_0 (with VNNI), Q4_0, Q4_1, Q5_0, Q5_1) run on
    AMX tiles where the CPU has them (runtime.kernels.amx), else integer register tiles: 16 rows
    in a vector's lanes for Q8_0, Q4_0 and Q5_0 where those are faster (runtime.kernels.row_tiles,
    ``_rows``), the lane layout otherwise (runtime.kernels.kq_tiles); all form the one-token kernels' integer sums; the
    other types, and every type under float, are decoded once, in chunks, and multiplied in
    float32 GEMMs (runtime.kernels.gemm), X first rounded to the int8 kernel's activation blocks
    under ``int8``."""
    if int8 and amx.amx_runs(fmt, X.shape[1]):
        amx.mm_amx(fmt, W, _arranged_amx(X, fmt), Y, gemm.CHUNK_VALUES)
        return
    if int8 and tiled(fmt) and fmt in ROW_TYPES and _rows(fmt, W, X, Y, two=False):
        return
    if int8 and tiled(fmt) and fmt in KQ_ROW_TYPES:  # faster than the lane tiles at every shape measured, and llama.cpp's sums
        mm_kq_rows(fmt, W, _arranged_kq(X, fmt), Y, amx.kept_rows(fmt, W, X.shape[1], "rows"))
        return
    if int8 and tiled(fmt):
        mm_tiles(fmt, W, _arranged(X, fmt), Y, gemm.CHUNK_VALUES, amx.kept_rows(fmt, W, X.shape[1], "lanes"))
        return
    Xf = _dequantized(X, fmt) if int8 else X
    gemm_rows(W, Xf, Y, lambda Wc, out: decode_block_rows(fmt, Wc, out))


# Matrices of at least this many values run "int16" in the two-plane lane tiles where the CPU has
# no AMX (Q4_1, Q5_1, and Q8_0/Q4_0/Q5_0 where ``_rows`` leaves them there); smaller ones in the
# float32 GEMM, which is then faster (the K-quants always take their row tiles, runtime.kernels.
# kq_row_tiles, faster than both; Q8_0, Q4_0 and Q5_0 the row tiles where ``_rows`` picks them). Measured
# before the row tiles, when the K-quants ran here: the second plane
# doubles the tiles' integer work (even with their unpacked rows kept across perplexity's
# windows the tiles lost on the real Gemma's d-640 matrices: 139 against 205 tok/s). 128 tokens,
# 2 threads, AMD EPYC znver4 (AVX-512 VNNI), ms per matmul, int16 tiles / float GEMM: Q4_K
# 640 × 2048 2.2-3.8 / 2.2; Q5_0 2048 × 640 2.5-6.3 / 2.4-2.5; a Q8_0 16,384 × 640 chunk of the
# real Gemma's output head 17.2-18.1 / 19.3-19.9; Q4_K 4096 × 4096 17.8-19.4 / 31.7-32.0.
INT16_TILES_MIN_VALUES = 1 << 22


# From this many tokens the K-quants' int8 matmuls take their row tiles (where the batched forms
# are on, ``set_batched_gemm``, and below GEMM_MIN_TOKENS too), whose sums are llama.cpp's tiled
# K-quant path's. That path starts at 8 tokens (ggml_tiled_min_batch); below 16 ours keeps the
# one-token kernels, faster there: a whole prompt, tok/s row tiles / one-token kernels (AMD
# EPYC, 2 threads): real Gemma 3 270M 8 tokens 0.91, 16: 0.98, 24: 1.12; Llama-3.1-8B-dims
# Q4_K_M 8: 0.63, 16: 0.95, 24: 1.23 (each group's unpacking then serves only a few tokens).
KQ_ROWS_MIN_TOKENS = 16


# llama.cpp's tiled K-quant kernel runs from this many tokens (ggml_tiled_min_batch); below, its
# one-token vec_dot kernels, token by token
LLAMACPP_TILED_MIN_TOKENS = 8


def _mm_llamacpp(fmt, W, X, rows, Y) -> bool:
    """``fmt``'s matmul summed as llama.cpp's CPU backend sums it on its plain buffers (the
    "llamacpp" arithmetic), where a kernel mirrors it; whether one ran. Q8_0, Q4_0, Q5_0 at any
    token count (runtime.kernels.ggml_order's blockwise kernels: its vec_dot_*_q8_0 and
    tinyBLAS_Q0); Q4_K, Q5_K, Q6_K from 8 tokens (the K-quant row tiles: its tiled kernel) and
    below (its vec_dot_q4_K/q5_K/q6_K_q8_K). The other types keep the int8 kernels."""
    T = X.shape[0]
    if fmt in KQ_ROW_TYPES and rows is None and T >= LLAMACPP_TILED_MIN_TOKENS and tiled(fmt):
        mm_kq_rows(fmt, W, _arranged_kq(X, fmt), Y, amx.kept_rows(fmt, W, X.shape[1], "rows"))
    elif fmt in GGML_KQ_KIND:
        xq, xd, xb = _quantized(X, "k")
        mm_kq_ggml(W, xq, xd, xb, rows, Y, GGML_KQ_KIND[fmt])
    elif fmt in GGML_B32_KIND:
        mm_b32_ggml(W, *_quantized(X, False), rows, Y, GGML_B32_KIND[fmt])
    else:
        return False
    return True


def mm_block_arith(fmt, W, X, rows, Y):
    """``mm_block`` in the process's arithmetic: int8 for INT8_ALL under "int8", else float.
    What the runtime's weights call (runtime.weights.KERNELS). From GEMM_MIN_TOKENS tokens on, a
    whole-matrix product decodes the weights once (``gemm.use_gemm``) (``mm_block_gemm``) in the same arithmetic."""
    int8 = _ARITHMETIC["name"] in GGML_ARITHMETICS and fmt in INT8_DEFAULT
    if int8 and _ARITHMETIC["name"] == "llamacpp" and _mm_llamacpp(fmt, W, X, rows, Y):
        return
    T = X.shape[0]
    if (int8 and rows is None and fmt in KQ_ROW_TYPES and tiled(fmt) and KQ_ROWS_MIN_TOKENS <= T
            and use_gemm(max(T, gemm.GEMM_MIN_TOKENS)) and not (use_gemm(T) and amx.amx_runs(fmt, X.shape[1]))):
        mm_kq_rows(fmt, W, _arranged_kq(X, fmt), Y, amx.kept_rows(fmt, W, X.shape[1], "rows"))
        return
    if rows is None and use_gemm(T):
        if (_ARITHMETIC["name"] == "int16" and _ARITHMETIC["head"] and fmt in INT8_DEFAULT
                and (amx.amx_runs(fmt, X.shape[1]) or tiled(fmt))):  # the head: one plane (``output_head``)
            mm_block_gemm(fmt, W, X, Y, True)
            return
        if _ARITHMETIC["name"] == "int16" and amx.amx_runs(fmt, X.shape[1]):
            amx.mm_amx(fmt, W, _arranged_amx2(X, fmt), Y, gemm.CHUNK_VALUES)
            return
        if _ARITHMETIC["name"] == "int16" and tiled(fmt) and fmt in ROW_TYPES and _rows(fmt, W, X, Y, two=True):
            return
        if _ARITHMETIC["name"] == "int16" and tiled(fmt) and fmt in KQ_ROW_TYPES:
            mm_kq_rows(fmt, W, _arranged_kq(X, fmt, two=True), Y, amx.kept_rows(fmt, W, X.shape[1], "rows"))
            return
        if _ARITHMETIC["name"] == "int16" and tiled(fmt) and W.shape[0] * X.shape[1] >= INT16_TILES_MIN_VALUES:
            mm_tiles(fmt, W, _arranged_two(X, fmt), Y, gemm.CHUNK_VALUES, amx.kept_rows(fmt, W, X.shape[1], "lanes"))
            return
        mm_block_gemm(fmt, W, X, Y, int8)
    elif int8:
        mm_block_int8(fmt, W, X, rows, Y)
    else:
        mm_block(fmt, W, X, rows, Y)


def mm_f16_arith(W, X, rows, Y):
    """``mm_f16`` in the process's arithmetic: under "int8" (llama.cpp's) x rounded to fp16 first,
    as ggml's vec_dot_f16 does; under "float" x float32 (exact to float32 rounding)."""
    if _ARITHMETIC["name"] not in GGML_ARITHMETICS:
        mm_f16(W, X, rows, Y)
        return
    XH = X.astype(np.float16)
    if X.shape[1] % 32:  # the plain fallback, on the same fp16-rounded x
        mm_lut_rows(W, LUT_F16, XH.astype(np.float32), rows, Y)
    elif 2 * X.shape[1] <= ONE_ROW_X_BYTES:
        mm_f16_half_x_one(W, XH.view(np.uint16), rows, Y)
    else:
        mm_f16_half_x(W, XH.view(np.uint16), rows, Y)


def arithmetic_label(kinds=None) -> str:
    """The arithmetic in effect for the tensor types ``kinds`` (gguf-py names; None: any), as the
    outputs print it: "int8 (Q8_0 activations, AVX-512 VNNI vpdpbusd)" (plus "; from 32 tokens: AMX
    tiles" where the AMX tiles run the many-token matmuls), "fp16 activations (F16
    weights, as ggml's vec_dot_f16)" for a file of F16 matrices, or "float"."""
    lower = None if kinds is None else {k.lower() for k in kinds}
    if arithmetic() == "llamacpp":
        exact = [t.upper() for t in BLOCK_TYPES if (t in GGML_B32_KIND or t in GGML_KQ_KIND) and (lower is None or t in lower)]
        # the order mirrored is llama.cpp's x86 AVX-512 VNNI build's (its tiled K-quant kernel and
        # ggml_ops' 16-lane reductions); elsewhere the same kernels run, in that order, not the CPU's
        where = "" if int_dot_features() == "avx512vnni" else ", as its AVX-512 VNNI build sums (not this CPU's build)"
        return (f"llamacpp (int8 summed in llama.cpp's order{': ' + '/'.join(exact) if exact else ''}{where}; "
                "other types int8)")
    if arithmetic() == "float":
        return "float"
    if arithmetic() == "int16":
        tiled_types = {t for t in amx.AMX_TYPES if tiled(t)} if lower is None else {t for t in lower if tiled(t)}
        if not tiled_types:
            return "int16 (float here: no integer tiles for these types)"
        if amx.amx_available():
            return f"int16 (float; from {gemm.GEMM_MIN_TOKENS} tokens: AMX tiles on two int8 activation planes)"
        which = [n for n, ts in (("Q4_K/Q5_K/Q6_K", KQ_ROW_TYPES), ("Q8_0/Q4_0/Q5_0 with short or kept rows", ROW_TYPES))
                 if tiled_types & set(ts)]
        if tiled_types - set(KQ_ROW_TYPES) - set(ROW_TYPES) or tiled_types & set(ROW_TYPES):
            which.append(f"other matrices of {INT16_TILES_MIN_VALUES >> 20} M values and more")
        return (f"int16 (float; from {gemm.GEMM_MIN_TOKENS} tokens, {', '.join(which)}: register tiles "
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
    tiles = f"; from {gemm.GEMM_MIN_TOKENS} tokens: AMX tiles" if pick & set(amx.AMX_TYPES) and amx.amx_available() else ""
    return f"int8 ({acts}, {' / '.join(d for _, d in used)}{tiles}{extra}{f16})"
