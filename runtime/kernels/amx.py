"""Many tokens times a block-quantized matrix on Intel AMX: the int8 tile instructions (TDPBUSD,
TDPBSSD) for the integer sums, AVX-512 for the scales. The same types, activation blocks and
integer sums as runtime.kernels.kq_tiles (Q4_K, Q5_K, Q6_K times Q8_K; Q8_0, Q4_0, Q4_1, Q5_0,
Q5_1 times Q8_0); what differs is the instruction that forms them.

One TDPBUSD multiplies a tile of 16 weight rows × G bytes (G the values that share one scale: 32,
16 for Q6_K) by G/4 rows × 64 bytes of activations (16 tokens, four values per token and row of
the tile) into 16 × 16 int32 sums: 8,192 multiply-adds in one instruction, where vpdpbusd does
64. Each group's sums then meet the scales in float, as in the register tiles:

    y[r, t] = Σ_g ws[r, g]·d_x[t, g]·Σ q_w·q_x − c[r, g]·d_x[t, g]·bsum_x[t, g]

(16 vector loads, conversions and multiply-adds per group and tile: the float part now costs more
than the integer part; docs/benchmarks.md, "AMX tiles", has the variants that did not help). The signed types (Q6_K, Q8_0, Q4_0, Q5_0) use TDPBSSD on their signed
quants and signed activations, so no +128 and no start term; the affine types (Q4_K, Q5_K, Q4_1,
Q5_1) TDPBUSD on unsigned quants, with the minimum term c in float.

The weights are unpacked per chunk of rows in the values' own order (kq_tiles' unpackers with
``natural``), a row's G values of one group consecutive, so a tile is 16 rows at the row stride.
The activations are arranged per 16 tokens and group as the B tile wants them: word j (values
4j..4j+3) of the 16 tokens side by side. The 16 × 16 float sums are transposed in registers and
stored as 16 tokens' rows of Y.

Linux lets a process use the AMX registers only after it asks (arch_prctl ARCH_REQ_XCOMP_PERM);
``amx_available`` asks once and says whether the tiles run here: the CPU numba compiles for has
AMX-INT8, the kernel granted it, and AIOS_AMX is not "0" (set it to compare with the register
tiles). Where not, kq_tiles runs.

The module's parts: ``amx_kernel`` (the tile configuration, the tile kernel's IR and its compiled
loops), ``amx_arrange`` (the activations as the B tile loads them); here, whether the tiles run,
and the whole matmul (runtime.kernels.kept keeps unpacked weights across passes).
"""

from __future__ import annotations

import ctypes
import os
import platform

import numpy as np

from aios.quant import QK_K
from runtime.kernels.amx_arrange import arrange_amx, arrange_amx_lo, arranged_amx, arranged_amx2  # noqa: F401  (this module's API)
from runtime.kernels.amx_kernel import (  # noqa: F401  (this module's API)
    AMX_AHEAD,
    AMX_ROW_TILES,
    AMX_ROWS,
    AMX_TOKENS,
    amx_tile_config,
    amx_tiles,
    amx_tiles2,
)
from runtime.kernels.blocks32 import QK
from runtime.kernels.ir_helpers import compile_features
from runtime.kernels.kq_tiles import (
    B32_TILES,
    LANE_VALUES,
    SIGNED,
    TILE_BYTES,
    TILE_KIND,
    TILE_TYPES,
    reused_buffer,
    units,
    unpack_b32_rows,
    unpack_rows,
)
from runtime.kernels.type_traits import TYPE_TRAITS

# the lane tiles' types whose type_traits row takes "amx" (their unpackers and TILE_KIND)
AMX_TYPES = tuple(t for t in TILE_TYPES if "amx" in TYPE_TRAITS[t].tiles)

_STATE: dict = {"ok": None}
_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA = 158, 0x1023, 18  # x86-64 Linux


def amx_available() -> bool:
    """Whether the AMX tiles run here (asked of the kernel once per process)."""
    if _STATE["ok"] is None:
        _STATE["ok"] = _request()
    return _STATE["ok"]


def _request() -> bool:
    if os.environ.get("AIOS_AMX", "1") == "0":
        return False
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return False
    from numba.core import config

    if config.CPU_NAME not in (None, "host") and config.CPU_FEATURES is None:
        return False  # compiling for a named CPU whose features are not listed: no AMX assumed
    if not {"amx-tile", "amx-int8", "avx512f"} <= compile_features():
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.syscall(_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA) == 0
    except (OSError, AttributeError):
        return False


def amx_runs(fmt: str, k: int) -> bool:
    """Whether a matrix of ``fmt`` rows of k values runs on the AMX tiles here: a tiled type whose
    groups per row are a multiple of AMX_AHEAD + 1 (with none ahead, any count), on a CPU and
    kernel that allow AMX."""
    return fmt in AMX_TYPES and (k // LANE_VALUES[fmt]) % (AMX_AHEAD + 1) == 0 and amx_available()


def mm_amx(fmt: str, W: np.ndarray, xs, Y: np.ndarray, chunk_values: int, kept=None) -> None:
    """Y (T, n) = the int8 products of every row of W (``fmt`` in AMX_TYPES, the file's bytes)
    with the tokens ``xs`` (``arranged_amx``), the rows unpacked in chunks of at most
    ``chunk_values`` values, or taken from ``kept`` ((Q, S, C, rows padded) in the values' order:
    runtime.kernels.kept). Only where ``amx_available()`` (which asks Linux for the registers)."""
    if not amx_available():
        raise RuntimeError("AMX tiles are not available on this CPU or kernel")
    if not Y.flags.c_contiguous:  # the tiles store whole rows of 16 outputs into a dense Y
        out = np.empty(Y.shape, np.float32)
        mm_amx(fmt, W, xs, out, chunk_values, kept)
        Y[...] = out
        return
    XA, XD, XB = xs[:3]
    lo = xs[4] if len(xs) > 4 else None  # the second plane (``arranged_amx2``)
    n = W.shape[0]
    b32 = fmt in B32_TILES
    k = W.shape[1] // TILE_BYTES[fmt] * (QK if b32 else QK_K)
    G = LANE_VALUES[fmt]
    nu = units(fmt, k)
    sl = nu * 16
    cfg = amx_tile_config(G)
    if kept is not None:
        Q, S, C, mp = kept
        _tiles(cfg, Q, S, C, XA, lo, XD, XB, Y, G, fmt in SIGNED, n, mp, 4 * Q.shape[1], sl, k // G, 0)
        return
    step = max(AMX_ROWS, min(n, chunk_values // k) // AMX_ROWS * AMX_ROWS)
    rows = step + AMX_ROWS
    # a row's bytes plus one line: at a stride of 4,096 bytes the 16 rows of a tile would all
    # fall in one L1 set (12 ways) and evict each other
    qw = k // 4 + 16
    Q = reused_buffer("amx_q", rows * qw, np.uint32).reshape(rows, qw)
    S = reused_buffer("amx_s", rows * sl, np.float32).reshape(rows, sl)
    C = reused_buffer("amx_c", rows * sl, np.float32).reshape(rows, sl)
    unpack = unpack_b32_rows if b32 else unpack_rows
    for r0 in range(0, n, step):
        m = min(n, r0 + step) - r0
        unpack(W[r0:r0 + m], TILE_KIND[fmt], TILE_BYTES[fmt], nu, Q[:m], S[:m], C[:m], C[:m].view(np.int32), True)
        mp = -(-m // AMX_ROWS) * AMX_ROWS
        for a in (Q, S, C):
            a[m:mp] = 0
        _tiles(cfg, Q, S, C, XA, lo, XD, XB, Y, G, fmt in SIGNED, m, mp, 4 * qw, sl, k // G, r0)


def _tiles(cfg, Q, S, C, XA, lo, XD, XB, Y, G, signed, n, mp, kbytes, sl, ng, y0) -> None:
    """``amx_tiles`` (one plane) or ``amx_tiles2`` (``lo``, the second plane's words) on flat views."""
    flat = [a.reshape(-1) for a in (Q, S, C, XA)]
    if lo is None:
        amx_tiles(cfg, *flat, XD.reshape(-1), XB.reshape(-1), Y, G, signed, n, mp, kbytes, sl, ng, XD.shape[1], y0)
    else:
        amx_tiles2(cfg, *flat, lo.reshape(-1), XD.reshape(-1), XB.reshape(-1), Y, G, signed, n, mp, kbytes, sl, ng,
                   XD.shape[1], y0)
