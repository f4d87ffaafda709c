"""The sparse down-projection kernels over neuron-major block rows (``runtime.kernels.sparse_rows_<type>``,
every block type): y = Σ_{j ∈ active} a[j]·row_j against gguf-py's dequantized rows, the blocks read
in place from the file's bytes."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from aios.quant import block_size, type_size
from runtime import kernels as K
from runtime.weights import BLOCK_TYPES, KERNELS
from tests.runtime.quant_blocks import random_blocks

TYPES = [k.lower() for k in BLOCK_TYPES]
GGUF_ENCODES = ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1")  # gguf.quants.quantize
KQUANT_ENCODES = ("q2_k", "q3_k", "q4_k", "q5_k", "q6_k")  # convert.kquants.quantize
AFFINE = ("q4_1", "q5_1", "q2_k", "q4_k", "q5_k")  # values d·q − m: float32 cancels to below the terms


def _encoded(fmt: str, n: int, nblk: int, rng) -> np.ndarray:
    """(n, nblk · block bytes) uint8: random float rows quantized by a real encoder where one
    exists (gguf-py, convert.kquants), else random valid blocks."""
    X = rng.standard_normal((n, nblk * block_size(fmt))).astype(np.float32)
    if fmt in GGUF_ENCODES:
        return np.ascontiguousarray(gguf.quantize(X, gguf.GGMLQuantizationType[fmt.upper()])).reshape(n, -1)
    if fmt in KQUANT_ENCODES:
        from convert import kquants

        return np.ascontiguousarray(kquants.quantize(X, fmt)).reshape(n, -1)
    return random_blocks(fmt, n, nblk, rng)


def _check(fmt: str, W: np.ndarray, a: np.ndarray, active: np.ndarray) -> None:
    n = W.shape[1] // type_size(fmt) * block_size(fmt)
    D = gguf.dequantize(W, gguf.GGMLQuantizationType[fmt.upper()]).reshape(W.shape[0], n).astype(np.float64)
    y = np.full(n, np.nan, np.float32)  # overwritten, whatever it held
    K.SPARSE_BLOCK_ROWS[fmt](W, a, active, y)
    ref = a[active].astype(np.float64) @ D[active]
    mag = np.abs(D[active])
    if fmt in AFFINE:  # a value d·q − m is rounded (here and in gguf-py) relative to its terms, which
        # are about the largest |value| of its 32: |w| + that, not |w|, is the scale of the error
        mag = mag + np.repeat(mag.reshape(len(active), -1, 32).max(axis=2), 32, axis=1)
    bound = 1e-5 * (np.abs(a[active]).astype(np.float64) @ mag) + 1e-30
    bad = np.flatnonzero(~(np.abs(y - ref) <= bound))
    assert bad.size == 0, (fmt, len(active), bad[:8], y[bad[:8]], ref[bad[:8]])


@pytest.mark.parametrize("fmt", TYPES)
@pytest.mark.parametrize("source", ["random_bytes", "encoded"])
def test_sparse_rows_equal_gguf_dequantize(fmt, source):
    """Random subsets (sorted, unsorted, every row, one row) of 40 rows, rows of 1, 2 and 5
    (super-)blocks: within 1e-5 of Σ|a·w| per output (the affine types: of Σ|a|·(|w| + the
    largest |w| of its 32)), from random bytes (every bit pattern, finite fp16 scales) or a
    real encoding."""
    rng = np.random.default_rng(17)
    for nblk in (1, 2, 5):
        W = (random_blocks(fmt, 40, nblk, rng) if source == "random_bytes" else _encoded(fmt, 40, nblk, rng))
        a = rng.standard_normal(40).astype(np.float32)
        subsets = [np.sort(rng.choice(40, 13, replace=False)), rng.permutation(40)[:29], np.arange(40),
                   np.array([int(rng.integers(40))]), np.array([39])]
        for active in subsets:
            _check(fmt, W, a, active.astype(np.int64))


@pytest.mark.parametrize("fmt", TYPES)
def test_empty_active_set_gives_zeros(fmt):
    W = random_blocks(fmt, 4, 2)
    y = np.full(2 * block_size(fmt), np.nan, np.float32)
    K.SPARSE_BLOCK_ROWS[fmt](W, np.ones(4, np.float32), np.zeros(0, np.int64), y)
    assert np.all(y == 0.0)


@pytest.mark.parametrize("fmt", ["q8_0", "q4_k", "q6_k", "q5_0"])
def test_real_size_rows_across_threads(fmt):
    """A real-size layer (d_model 4096, Falcon's 4544 for the 32-value types) with ~13 % of 1024
    neurons active: every chunk of partial sums holds many rows, and the result does not depend
    on the thread count."""
    import numba

    rng = np.random.default_rng(3)
    n = 4544 if block_size(fmt) == 32 else 4096
    W = random_blocks(fmt, 1024, n // block_size(fmt), rng)
    a = np.maximum(rng.standard_normal(1024), 0).astype(np.float32)
    active = np.sort(rng.choice(1024, 134, replace=False)).astype(np.int64)
    _check(fmt, W, a, active)
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        y1 = np.empty(n, np.float32)
        K.SPARSE_BLOCK_ROWS[fmt](W, a, active, y1)
    finally:
        numba.set_num_threads(before)
    y2 = np.empty(n, np.float32)
    K.SPARSE_BLOCK_ROWS[fmt](W, a, active, y2)
    np.testing.assert_array_equal(y1, y2)  # the same chunks of rows, whichever thread sums them


def test_every_block_type_has_its_sparse_kernel():
    """No block type falls back to decoding rows with gguf-py in the sparse modes."""
    assert set(K.SPARSE_BLOCK_ROWS) == set(TYPES)
    for kind in BLOCK_TYPES:
        assert KERNELS[kind].sparse_blocks is K.SPARSE_BLOCK_ROWS[kind.lower()], kind
