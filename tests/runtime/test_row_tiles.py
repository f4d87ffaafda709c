"""The row tiles (runtime.kernels.row_tiles): 16 rows of Q8_0, Q4_0 or Q5_0 in a vector's lanes.
They take these types' many-token int8 and int16 matmuls on CPUs without AMX, give the one-token
kernels' products to float32 rounding (tests/runtime/test_kq_tiles.py runs every tiled type
through ``mm_block_arith``), and here: the path taken, ragged groups of rows and tokens, chunks
of rows, and rows kept in the tiles' layout across passes."""

from __future__ import annotations

import numpy as np
import pytest

from runtime import kernels as K
from runtime.kernels import dispatch, gemm, kq_tiles, row_tiles
from runtime.kernels import kept as kept_mod
from tests.runtime.quant_blocks import random_blocks

RNG = np.random.default_rng(23)


def _float_error(fmt, W, X, Y):
    Wf = K.decode_rows_at(fmt, W, np.arange(W.shape[0])).astype(np.float64)
    return (np.abs(Y - X.astype(np.float64) @ Wf.T) / (np.abs(X).astype(np.float64) @ np.abs(Wf).T)).max()


@pytest.mark.parametrize("fmt", row_tiles.ROW_TYPES)
@pytest.mark.parametrize("nb", [1, 20, 37])  # 640 values (the real Gemma's rows), more than two units of 16
def test_row_tiles_take_the_signed_32_value_types(fmt, nb, no_amx, monkeypatch):
    """int8: the one-token kernels' products; int16: the float product within 3e-4 of its scale
    (the 16-bit activations' rounding; a single block with outliers is the worst case) where int8
    is > 30x further off; both in the row tiles (33 rows: a group of one row; tokens
    not a whole tile)."""
    if not kq_tiles.tiled(fmt):
        pytest.skip(f"{fmt} keeps the float32 GEMM on this CPU (no VNNI)")
    seen = []
    monkeypatch.setattr(dispatch, "mm_rows", lambda f, W, xs, Y, c, kept: seen.append(xs[2] is not xs[0])
                        or row_tiles.mm_rows(f, W, xs, Y, c, kept))
    W = random_blocks(fmt, 33, nb, RNG)
    X = RNG.standard_normal((K.GEMM_MIN_TOKENS + 5, 32 * nb)).astype(np.float32)
    X[:, ::5] *= 20  # outliers
    ys = {}
    for arith, batched in (("int8", False), ("int8", True), ("int16", True)):
        Y = np.full((X.shape[0], 33), np.nan, np.float32)
        K.mm_block_arith(fmt, W, X, None, Y, K.Arithmetic(arith, batched=batched))
        ys[arith, batched] = Y.astype(np.float64)
    assert seen == [False, True]  # int8 one plane, int16 two, each in the row tiles
    one_token, tiles = ys["int8", False], ys["int8", True]
    assert np.abs(tiles - one_token).max() <= 1e-5 * np.abs(one_token).max()
    err16, err8 = _float_error(fmt, W, X, ys["int16", True]), _float_error(fmt, W, X, tiles)
    assert err16 < 3e-4 and err8 > 30 * err16, (err16, err8)


def test_chunks_of_rows_equal_one_chunk(no_amx, monkeypatch):  # the output head, in chunks
    if not kq_tiles.tiled("q8_0"):  # (the float32 GEMM's sums depend on the chunk: BLAS's order)
        pytest.skip("q8_0 keeps the float32 GEMM on this CPU (no VNNI)")
    i8 = K.Arithmetic("int8")
    W = random_blocks("q8_0", 70, 20, RNG)
    X = RNG.standard_normal((K.GEMM_MIN_TOKENS, 640)).astype(np.float32)
    whole = np.empty((X.shape[0], 70), np.float32)
    K.mm_block_arith("q8_0", W, X, None, whole, i8)
    monkeypatch.setattr(gemm, "CHUNK_VALUES", 20 * 640)  # 16 rows a chunk (whole groups): 5 chunks
    chunked = np.empty_like(whole)
    K.mm_block_arith("q8_0", W, X, None, chunked, i8)
    np.testing.assert_array_equal(chunked, whole)


@pytest.mark.parametrize("fmt", ["q5_0", "q4_0"])
def test_rows_kept_in_the_tiles_layout(fmt, no_amx, monkeypatch):
    """Inside ``kept_unpacked`` a matrix is unpacked once, kept in the row tiles' groups of 16
    rows and reused: the same products as unpacking per matmul, in int8 and int16; freed on exit."""
    W = random_blocks(fmt, 41, 20, RNG)
    X = RNG.standard_normal((K.GEMM_MIN_TOKENS + 3, 640)).astype(np.float32)
    fresh = {}
    for arith in ("int8", "int16"):
        fresh[arith] = np.empty((X.shape[0], 41), np.float32)
        K.mm_block_arith(fmt, W, X, None, fresh[arith], K.Arithmetic(arith))
    calls, kept = [], []
    for mod in (kept_mod, row_tiles):
        monkeypatch.setattr(mod, "unpack_b32_rows", lambda *a, real=mod.unpack_b32_rows: (calls.append(1), real(*a))[1])
    monkeypatch.setattr(dispatch, "mm_rows", lambda f, W, xs, Y, c, k=None: kept.append(k is not None)
                        or row_tiles.mm_rows(f, W, xs, Y, c, k))
    assert kept_mod.kept_layout(fmt, 640) == "rows"
    with K.kept_unpacked(matrices=[(fmt, 41, 640)]) as store:
        for arith in ("int8", "int8", "int16"):
            Y = np.empty_like(fresh[arith])
            K.mm_block_arith(fmt, W, X, None, Y, K.Arithmetic(arith).keeping(store))
            np.testing.assert_array_equal(Y, fresh[arith])
        assert len(calls) == 1 and store.nbytes == kept_mod.unpacked_bytes(fmt, 41, 640, "rows")
    assert kept == [True] * 3 and store.mats == {}
    K.mm_block_arith(fmt, W, X, None, Y, K.Arithmetic("int8"))  # no store: unpacked again
    assert kept[-1] is False and len(calls) > 1


def test_row_tiles_where_the_lanes_pad_or_rows_are_kept(no_amx, monkeypatch):
    """Unpacked per call, rows whose lane layout pads an eighth or more (640 values: 20 blocks in
    32 lanes) take the row tiles; whole units of 16 blocks (4096) and Falcon's 4544 (142 of 144
    lanes) the lane tiles; kept rows the row tiles whatever their length."""
    assert row_tiles.pads_lanes(640) and row_tiles.pads_lanes(32)
    assert not row_tiles.pads_lanes(4096) and not row_tiles.pads_lanes(4544)
    if not kq_tiles.tiled("q8_0"):
        pytest.skip("q8_0 keeps the float32 GEMM on this CPU (no VNNI)")
    seen = []
    monkeypatch.setattr(dispatch, "mm_rows", lambda *a: seen.append("rows") or row_tiles.mm_rows(*a))
    monkeypatch.setattr(dispatch, "mm_tiles", lambda *a: seen.append("lanes") or kq_tiles.mm_tiles(*a))
    W = random_blocks("q8_0", 20, 128, RNG)
    X = RNG.standard_normal((K.GEMM_MIN_TOKENS, 4096)).astype(np.float32)
    Y = np.empty((X.shape[0], 20), np.float32)
    K.mm_block_arith("q8_0", W, X, None, Y, K.Arithmetic("int8"))
    with K.kept_unpacked(matrices=[("q8_0", 20, 4096)]) as store:
        K.mm_block_arith("q8_0", W, X, None, Y, K.Arithmetic("int8").keeping(store))
    assert seen == ["lanes", "rows"]
