"""Many tokens times a block-quantized matrix in int8: Q4_K, Q5_K, Q6_K times llama.cpp's Q8_K
activations, Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 times its Q8_0 activations. The integer sums are the
one-token kernels' (runtime.kernels.kquants_int, blocks32_int), computed as a matrix-matrix
product in register tiles of 4 rows × 4 tokens. (Q8_0, Q4_0 and Q5_0 take runtime.kernels.row_tiles,
16 rows in the lanes, where their rows are kept or this layout would pad them: dispatch._rows.)

The one-token kernels unpack every super-block's nibbles and six-bit scales again for each token
(about 45 instructions per row, super-block and token), far below llama.cpp's many-token rate at
8B dimensions (docs/benchmarks.md, "Measurements behind code choices"). Here each chunk of rows is
unpacked once per matmul into a lane layout, and the product is then G/4 integer dot
instructions (vpdpbusd) per unit and pair (row, token), plus two or three float operations.

The lane layout: a *unit* is 16 lanes of G values, G the values that share one scale: 32 for
Q4_K/Q5_K (a unit is two super-blocks) and for the 32-value blocks (a unit is 16 blocks), 16 for
Q6_K (a unit is one super-block). Lane l of a unit holds its G values in G/4 words of 4 bytes,
word j of every lane side by side in one 64-byte vector. vpdpbusd of the weights' vector j with
the activations' vector j (arranged the same way) adds each lane's four products into that
lane's int32, so after the G/4 vectors lane l holds Σ q_w·q_x over its group, exact, and float
multiply-adds apply the scales:

    y[r, t] = Σ_units Σ_l d_x(l)·(ws[r, l]·Σ q_w·q_x − c[r, l]·bsum_x(l))

ws is the group's scale (d·sc, or the block's d). The affine types (Q4_K, Q5_K, Q4_1, Q5_1)
store their quants unsigned with c their minimum term (dmin·m, or −m) and bsum_x the
activations' sum over the group (Q8_K's group sums of 16, two for G = 32). The SIGNED types
(Q6_K: q − 32, Q8_0, Q4_0: q − 8, Q5_0: q − 16) store their quants signed and the activations
plus 128 (vpdpbusd takes one unsigned operand): each pair's integer sums start at the row's
−128·Σq_w, which takes the 128 off exactly, and no float offset term is left. What differs from
llama.cpp is the order of the float sums (to float32 rounding, as the float32 GEMM form).

The module's parts: ``kq_lanes`` (the lane layout: the types' tables, the weights unpacked into
it, the activations arranged the same way), ``kq_tile_kernel`` (the 4 × 4 tile's IR and its
compiled loop); here, which types run tiled, the activations arranged for a matmul and the whole
matmul.
"""

from __future__ import annotations

import numpy as np

from aios.quant import QK_K
from runtime.kernels.blocks32 import QK
from runtime.kernels.ir_helpers import int_dot_features
from runtime.kernels.kq_lanes import (  # noqa: F401  (this module's API)
    B32_TILES,
    KQ_TILES,
    LANE_VALUES,
    LANES,
    SIGNED,
    SPREAD4,
    TILE_BYTES,
    TILE_KIND,
    TILE_TYPES,
    arrange_x,
    arrange_x32,
    byte_sum4,
    f16_le,
    units,
    unpack_b32_rows,
    unpack_rows,
    word_at,
    word_at_i8,
)
from runtime.kernels.kq_tile_kernel import (
    RT,
    SLAB_VALUES,  # noqa: F401  (this module's API)
    TT,
    tiles,
)
from runtime.kernels.quantize import LO_STEPS, residual_plane


def tiled(fmt: str) -> bool:
    """Whether ``fmt`` runs in the tiles on the CPU the kernels are compiled for. The activations
    plus 128 (up to 255) times Q8_0's quants (down to −128) overflow the 16-bit pair sums of
    AVX2's pmaddubsw (saturating): without VNNI's vpdpbusd (32-bit sums) Q8_0 keeps the float32
    GEMM."""
    return fmt in TILE_TYPES and (fmt != "q8_0" or int_dot_features() in ("avx512vnni", "avxvnni", "generic"))


TOKEN_BLOCK = 64  # tokens whose activations stay in L2 while every row tile passes them, at most
TOKEN_BLOCK_BYTES = 1 << 18  # and at most this many bytes of their quants (L2 holds the block)


# --- a whole matrix ---------------------------------------------------------------------------
_BUFS: dict = {}  # reused buffers by name: fresh pages per matmul are page-faulted in each time


def reused_buffer(name: str, n: int, dtype) -> np.ndarray:
    """n elements of ``dtype`` from the buffer kept under ``name`` (grown when too small): the
    tiles' unpacked chunks, here and in runtime.kernels.amx."""
    b = _BUFS.get(name)
    if b is None or b.size < n or b.dtype != dtype:
        b = _BUFS[name] = np.empty(n, dtype)
    return b[:n]


def arranged(fmt: str, xq: np.ndarray, xd: np.ndarray, xb: np.ndarray | None = None):
    """The activations' int8 blocks in ``fmt``'s lane layout: (XQ, XD, XB); Q8_K blocks
    (``quantize_activations_k``: xq, xd, xb) for the K-quants, Q8_0 blocks (xq, xd) for the
    32-value types."""
    T, k = xq.shape
    nu = units(fmt, k)
    words = LANE_VALUES[fmt] // 4
    Tp = -(-T // TT) * TT  # tokens padded with zeros to whole tiles
    XQ = np.empty((Tp, nu * LANES * words), np.uint32)
    XD = np.empty((Tp, nu * LANES), np.float32)
    XB = np.empty((Tp, nu * LANES), np.float32)
    for a in (XQ, XD, XB):
        a[T:] = 0
    if fmt in B32_TILES:
        arrange_x32(xq, xd, fmt in SIGNED, nu, XQ[:T], XD[:T], XB[:T])
    else:
        arrange_x(xq, xd, xb, LANE_VALUES[fmt] == 32, nu, XQ[:T], XD[:T], XB[:T])
    return XQ, XD, XB


def arranged_two(fmt: str, X: np.ndarray, xq: np.ndarray, xd: np.ndarray, xb: np.ndarray | None = None):
    """``arranged`` of X's int8 blocks (xq, xd[, xb]) plus their second plane
    (quantize.residual_plane) in the same layout: (XQ, XD, XB, XQ2) with XD each lane's d/128
    and XB the lane's d/128·Σ(128·q + q_lo), what the two-plane tiles multiply."""
    XQ, XD, XB = arranged(fmt, xq, xd, xb)
    lo = residual_plane(np.ascontiguousarray(X, np.float32), xq, xd, xq.shape[1] // xd.shape[1])
    lo_sums = None if fmt in B32_TILES else lo.reshape(lo.shape[0], -1, 16).sum(axis=2, dtype=np.int16)
    XQ2, _, XB2 = arranged(fmt, lo, xd, lo_sums)
    XD /= np.float32(LO_STEPS)
    XB += XB2 / np.float32(LO_STEPS)
    return XQ, XD, XB, XQ2


def mm_tiles(fmt: str, W: np.ndarray, xs, Y: np.ndarray, chunk_values: int, kept=None) -> None:
    """Y (T, n) = the int8 products of every row of W (``fmt`` in TILE_TYPES, the file's bytes)
    with the tokens ``xs`` (``arranged``; ``arranged_two``: 16-bit activations in two planes),
    the rows unpacked in chunks of at most ``chunk_values`` values (each chunk then meets every
    token), or taken unpacked from ``kept`` ((Q, S, C, rows padded) of every row: amx.kept_rows)."""
    XQ, XD, XB = xs[:3]
    XQ2 = xs[3] if len(xs) == 4 else XQ
    T = Y.shape[0]
    n = W.shape[0]
    k = W.shape[1] // TILE_BYTES[fmt] * (QK if fmt in B32_TILES else QK_K)
    nu = units(fmt, k)
    words = LANE_VALUES[fmt] // 4
    g32 = LANE_VALUES[fmt] == 32
    tblock = max(TT, min(TOKEN_BLOCK, TOKEN_BLOCK_BYTES // (4 * XQ.shape[1] * (len(xs) - 2))) // TT * TT)
    if kept is not None:
        Q, S, C = kept[:3]
        tiles(Q, S, C, XQ, XD, XB, XQ2, len(xs) == 4, g32, fmt in SIGNED, nu, n, T, tblock, Y, 0)
        return
    step = max(RT, min(n, chunk_values // max(1, nu * LANES * LANE_VALUES[fmt])) // RT * RT)
    rows = step + RT  # whole tiles, the last one's padding rows zero
    Q = reused_buffer("q", rows * nu * LANES * words, np.uint32).reshape(rows, -1)
    S = reused_buffer("s", rows * nu * LANES, np.float32).reshape(rows, -1)
    C = reused_buffer("c", rows * nu * LANES, np.float32).reshape(rows, -1)
    for r0 in range(0, n, step):
        r1 = min(n, r0 + step)
        m = r1 - r0
        unpack = unpack_b32_rows if fmt in B32_TILES else unpack_rows
        unpack(W[r0:r1], TILE_KIND[fmt], TILE_BYTES[fmt], nu, Q[:m], S[:m], C[:m], C[:m].view(np.int32))
        mp = -(-m // RT) * RT
        for a in (Q, S, C):
            a[m:mp] = 0
        tiles(Q, S, C, XQ, XD, XB, XQ2, len(xs) == 4, g32, fmt in SIGNED, nu, m, T, tblock, Y, r0)
