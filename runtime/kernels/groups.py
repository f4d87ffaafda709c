"""Row groups of the parallel kernels: the rows a kernel computes (a list, or None for all of
them) and how it groups them (four side by side, or eight G apart); numba functions inlined
into every kernel."""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.extending import overload


# --- row groups ------------------------------------------------------------------------------
# Every kernel takes ``rows``: the row indices to compute (the sparse paths' gathered rows) or
# None for all of them. None compiles a specialization that computes the indices instead of
# loading them from a list (measured over the dense matrices of Llama-3.1-8B-dims files, AMD
# EPYC: the list 0..n-1 cost the F16 kernel ~8 %, the block kernels up to a few %).
def row_at(rows, j):
    """Row j of a kernel's row list (numba only)."""


@overload(row_at, inline="always")
def _row_at_impl(rows, j):
    if isinstance(rows, types.NoneType):
        return lambda rows, j: j
    return lambda rows, j: rows[j]


def row_count(rows, W):
    """How many rows a kernel computes: len(rows), or all of W's (numba only)."""


@overload(row_count, inline="always")
def _row_count_impl(rows, W):
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
def group4(rows, n, g):
    """The 4 rows of group g, side by side: 4g .. 4g + 3 of the n (the last row past the end)."""
    b = 4 * np.int64(g)
    last = n - 1
    return row_at(rows, min(b, last)), row_at(rows, min(b + 1, last)), row_at(rows, min(b + 2, last)), row_at(rows, min(b + 3, last))


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
def strided8(rows, n, g, G):
    """The 8 rows of group g, G apart (the last row past the end)."""
    g = np.int64(g)
    last = n - 1
    return (row_at(rows, min(g, last)), row_at(rows, min(g + G, last)), row_at(rows, min(g + 2 * G, last)),
            row_at(rows, min(g + 3 * G, last)), row_at(rows, min(g + 4 * G, last)),
            row_at(rows, min(g + 5 * G, last)), row_at(rows, min(g + 6 * G, last)),
            row_at(rows, min(g + 7 * G, last)))


@njit(fastmath=True, cache=True, inline="always")
def store_group(Y, t, rows, n, b, step, y):
    """Y[t, row b + u·step] = y[u] for the group's len(y) results (those past n dropped):
    step 1 for a side-by-side group (b = 4g), G for a strided one (b = g)."""
    b = np.int64(b)
    for u in range(len(y)):
        if b + u * step < n:
            Y[t, row_at(rows, b + u * step)] = y[u]
