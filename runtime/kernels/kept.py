"""Unpacked weights kept across passes: what a caller that runs the same matrices many times
(a perplexity run's windows, R1's calibration passes) lends its many-token matmuls.

The integer tiles (runtime.kernels.amx, kq_tiles, row_tiles, kq_row_tiles) unpack a matrix's
blocks before they multiply; a prompt or a single pass unpacks per matmul and keeps nothing
(llama.cpp's AMX buffers repack the weights once at load, for the file's whole life). A
``KeptRows`` store, made by ``kept_unpacked`` and carried to the kernels by the caller's
``Arithmetic.keeping(store)``, keeps each matrix's unpacked form after its first matmul, up to a
budget of bytes, and frees it when the caller's block ends. Nothing here is process-wide: two
runs keep two stores.

KEEP_BYTES: 384 MB holds the real Gemma 3 270M's whole unpacked form (its output head in the row
tiles' layout, 210 MB, with its layers), so its head is not unpacked again every perplexity
window (docs/benchmarks.md, "Measurements behind code choices").
"""

from __future__ import annotations

import contextlib
import os
import weakref

import numpy as np

from runtime.kernels.amx import amx_runs
from runtime.kernels.amx_kernel import AMX_ROWS
from runtime.kernels.blocks32 import QK
from runtime.kernels.kq_row_tiles import KQ_ROW_TYPES, group_kq_rows, kq_rows_bytes
from runtime.kernels.kq_tiles import (
    B32_TILES,
    LANE_VALUES,
    RT,
    TILE_BYTES,
    TILE_KIND,
    tiled,
    units,
    unpack_b32_rows,
    unpack_rows,
)
from runtime.kernels.row_tiles import ROW_TYPES, grouped_shapes, to_rows

KEEP_BYTES = int(os.environ.get("AIOS_KEEP_UNPACKED_MB", "384")) << 20


def kept_layout(fmt: str, k: int) -> str:
    """How ``fmt``'s many-token matmuls keep its rows: "values" (their order: the AMX tiles),
    "rows" (16 rows in a vector's lanes: runtime.kernels.row_tiles, kq_row_tiles) or "lanes" (the register
    tiles' lane layout, runtime.kernels.kq_tiles)."""
    return "values" if amx_runs(fmt, k) else "rows" if fmt in ROW_TYPES + KQ_ROW_TYPES else "lanes"


def unpacked_bytes(fmt: str, n: int, k: int, layout: str = "values") -> int:
    """What keeping one matrix of ``fmt`` (n rows of k values) unpacked holds in ``layout``
    (``kept_layout``): quants, scales and minimums, rows padded to the AMX tiles' 16 ("values"),
    to groups of 16 ("rows") or to the register tiles' 4 ("lanes")."""
    if layout == "lanes":
        mp = -(-n // RT) * RT + RT
        return mp * 4 * units(fmt, k) * 16 * (LANE_VALUES[fmt] // 4 + 2)
    if layout == "rows" and fmt in KQ_ROW_TYPES:
        return kq_rows_bytes(fmt, n, k)
    if layout == "rows":
        q, s = grouped_shapes(n, k // QK)
        return 4 * q[0] * (q[1] + 2 * s[1])
    mp = -(-n // AMX_ROWS) * AMX_ROWS
    return mp * (4 * (k // 4 + 16) + 8 * units(fmt, k) * 16)


def _root(a: np.ndarray):  # the object that owns an array's memory (the file's mmap, usually)
    while isinstance(a, np.ndarray) and a.base is not None:
        a = a.base
    return a


class KeptRows:
    """Matrices' unpacked rows, kept until ``budget`` bytes are held (``kept_unpacked``)."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.nbytes = 0  # held now
        self.mats: dict = {}  # (fmt, layout, address, shape, strides) -> (weak owner, unpacked form)

    def rows(self, fmt: str, W: np.ndarray, k: int, layout: str = "values"):
        """The matrix's kept (Q, S, C, rows padded), unpacked now if the budget allows; else None.
        ``layout`` (``kept_layout``): "values" the values' order (the AMX tiles'), "lanes" the
        register tiles' lane layout (``kq_tiles.mm_tiles``' ``kept``), "rows" the row tiles'
        groups ((QT, ST, ZT, groups): ``row_tiles.mm_rows``; the K-quants' ``group_kq_rows``)."""
        key = (fmt, layout, W.__array_interface__["data"][0], W.shape, W.strides)
        hit = self.mats.get(key)
        if hit is not None and hit[0]() is not None:  # the memory's owner alive: the same bytes
            return hit[1]
        n = W.shape[0]
        nbytes = unpacked_bytes(fmt, n, k, layout)
        if self.nbytes + nbytes > self.budget:
            return None
        try:
            ref = weakref.ref(_root(W))
        except TypeError:  # an owner without weak references: not kept
            return None
        if layout == "rows" and fmt in KQ_ROW_TYPES:  # (QT, SC, MN, D, DM): kq_row_tiles.mm_kq_rows' kept
            kept = group_kq_rows(fmt, W)
        else:
            kept = _unpacked(fmt, W, k, layout)
        self.nbytes += nbytes
        self.mats[key] = (ref, kept)
        return kept

    def clear(self) -> None:
        self.mats, self.nbytes = {}, 0


def _unpacked(fmt: str, W: np.ndarray, k: int, layout: str):
    """W's rows unpacked in ``layout`` ("values", "lanes" or the 32-value types' "rows")."""
    n, nu = W.shape[0], units(fmt, k)
    lanes = layout == "lanes"
    if lanes:  # rows padded to whole tiles of RT, plus the RT the last tile may read past them
        mp = -(-n // RT) * RT
        shape = (mp + RT, nu * 16 * (LANE_VALUES[fmt] // 4))
    else:
        mp = -(-n // AMX_ROWS) * AMX_ROWS
        shape = (mp, k // 4 + 16)
    Q = np.zeros(shape, np.uint32)
    S, C = np.zeros((shape[0], nu * 16), np.float32), np.zeros((shape[0], nu * 16), np.float32)
    unpack = unpack_b32_rows if fmt in B32_TILES else unpack_rows
    unpack(W, TILE_KIND[fmt], TILE_BYTES[fmt], nu, Q[:n], S[:n], C[:n], C[:n].view(np.int32), not lanes)
    if layout != "rows":
        return Q, S, C, mp
    # the values' order moved into groups of 16 rows; the first form freed
    shape_q, shape_s = grouped_shapes(n, k // QK)
    kept = (np.empty(shape_q, np.uint32), np.empty(shape_s, np.float32), np.empty(shape_s, np.int32), shape_q[0])
    to_rows(Q, S, C.view(np.int32), k // QK, n, *kept[:3])
    return kept


@contextlib.contextmanager
def kept_unpacked(budget: int | None = None, matrices=None):
    """A ``KeptRows`` store for the block (None where keeping would not pay), freed on exit: pass
    it to the matmuls with ``Arithmetic.keeping(store)``. The AMX tiles keep rows in the values'
    order, the register tiles (CPUs without AMX) in theirs (``kept_layout``).

    ``matrices``: the (fmt, rows, values per row) of every matrix the passes will multiply, in
    any order. Passes go through them in a cycle, so kept rows save unpacking in proportion to
    the share of them that fits: when less than half of their unpacked bytes fit the budget,
    nothing is kept (a small share kept saves as small a share of the unpacking, for all the
    memory it holds: docs/benchmarks.md, "Measurements behind code choices")."""
    budget = KEEP_BYTES if budget is None else budget
    need = sum(unpacked_bytes(f, n, k, kept_layout(f, k)) for f, n, k in matrices or () if amx_runs(f, k) or tiled(f))
    store = KeptRows(budget) if 2 * budget >= need else None
    try:
        yield store
    finally:
        if store is not None:
            store.clear()
