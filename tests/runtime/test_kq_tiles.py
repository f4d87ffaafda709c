"""The K-quants' integer register tiles (runtime.kernels.kq_tiles): the lane layout holds the
file's values, the products equal the one-token int8 kernels' to float32 rounding, for odd
super-block counts, ragged row and token counts and chunks of rows, on this CPU's integer dot
and on AVX2's."""

from __future__ import annotations

import numpy as np
import pytest

from runtime import kernels as K
from runtime.kernels import amx, dispatch, gemm, kq_row_tiles, kq_tiles, row_tiles
from runtime.kernels import kept as kept_mod
from runtime.kernels.quantize import quantize_activations_k
from tests.runtime.quant_blocks import arithmetic_errors, random_blocks

RNG = np.random.default_rng(11)


def _unpacked(fmt, W, k):
    nu = kq_tiles.units(fmt, k)
    words = kq_tiles.LANE_VALUES[fmt] // 4
    n = W.shape[0]
    Q = np.empty((n, nu * 16 * words), np.uint32)
    S = np.empty((n, nu * 16), np.float32)
    C = np.empty_like(S)
    unpack = kq_tiles.unpack_b32_rows if fmt in kq_tiles.B32_TILES else kq_tiles.unpack_rows
    unpack(W, kq_tiles.TILE_KIND[fmt], kq_tiles.TILE_BYTES[fmt], nu, Q, S, C, C.view(np.int32))
    return Q, S, C


def _natural(fmt, lanes_words, k):
    """(n, nu·16·G) bytes in the values' order from the lane layout's (n, nu·16·G/4) uint32
    words (Q4_K/Q5_K: a padding super-block after an odd count)."""
    G = kq_tiles.LANE_VALUES[fmt]
    n = lanes_words.shape[0]
    nu = kq_tiles.units(fmt, k)
    b = lanes_words.view(np.uint8).reshape(n, nu, G // 4, 16, 4)  # unit, word j, lane, byte
    # lane l: its G values in order; lanes in order are consecutive groups (G = 32: lane 8·s' + j
    # of a unit is sub-block j of the unit's super-block s'; G = 16: group l of its super-block)
    return b.transpose(0, 1, 3, 2, 4).reshape(n, -1)


@pytest.mark.parametrize("fmt", kq_tiles.TILE_TYPES)
def test_lane_layout_holds_the_files_values(fmt):
    b32 = fmt in kq_tiles.B32_TILES
    nsb = 21 if b32 else 3  # the last unit padded with zeros: 11 blocks of 32, a Q4_K/Q5_K super-block
    W = random_blocks(fmt, 6, nsb, RNG)
    k = (32 if b32 else 256) * nsb
    Q, S, C = _unpacked(fmt, W, k)
    G = kq_tiles.LANE_VALUES[fmt]
    full = _natural(fmt, Q, k)
    signed = fmt in kq_tiles.SIGNED
    q = (full[:, :k].view(np.int8) if signed else full[:, :k]).astype(np.float64)
    lanes = k // G
    scale = np.repeat(S[:, :lanes].astype(np.float64), G, axis=1)
    ref = K.decode_rows_at(fmt, W, np.arange(W.shape[0])).astype(np.float64)
    if signed:  # the quants as they are signed; each lane's integer sums start at −128·Σq
        values = scale * q
        np.testing.assert_array_equal(C.view(np.int32)[:, :lanes], -128 * q.reshape(6, lanes, G).sum(axis=2))
    else:
        values = scale * q - np.repeat(C[:, :lanes].astype(np.float64), G, axis=1)
    np.testing.assert_allclose(values, ref, rtol=1e-6, atol=1e-6 * np.abs(ref).max())
    assert not full[:, k:].any()  # the padding is zero, scales included
    assert (S[:, lanes:] == 0).all() and (C[:, lanes:] == 0).all()


@pytest.mark.parametrize("fmt", kq_tiles.TILE_TYPES)
def test_activations_arranged_as_the_weights(fmt):
    b32 = fmt in kq_tiles.B32_TILES
    k, T = 256 * 3, 5
    X = RNG.standard_normal((T, k)).astype(np.float32)
    if b32:
        xq, xd, _ = K.quantize_activations(X)
        XQ, XD, XB = kq_tiles.arranged(fmt, xq, xd)
    else:
        xq, xd, xb = quantize_activations_k(X)
        XQ, XD, XB = kq_tiles.arranged(fmt, xq, xd, xb)
    G = kq_tiles.LANE_VALUES[fmt]
    assert XQ.shape[0] == 8 and not XQ[T:].any() and not XD[T:].any()  # zero tokens to a whole tile
    XQ, XD, XB = XQ[:T], XD[:T], XB[:T]
    got = _natural(fmt, XQ, k)[:, :k]
    if fmt in kq_tiles.SIGNED:  # plus 128, unsigned: the weights' quants are the signed operand
        got = got ^ np.uint8(128)
    assert (got.view(np.int8) == xq).all()
    lanes = k // G
    d = xd if b32 else np.repeat(xd, 256 // G, axis=1)
    np.testing.assert_array_equal(XD[:, :lanes], d)
    sums = xq.reshape(T, lanes, G).astype(np.int64).sum(axis=2)
    np.testing.assert_allclose(XB[:, :lanes], d * sums, rtol=1e-7)


I8 = K.Arithmetic("int8", batched=True)


@pytest.fixture
def int8_gemm(monkeypatch):  # the register tiles, also on a CPU with AMX (tests/runtime/test_kernels_amx.py)
    monkeypatch.setitem(amx._STATE, "ok", False)


def _one_token_and_tiles(fmt, W, X):
    out = []
    for on in (False, True):
        Y = np.full((X.shape[0], W.shape[0]), np.nan, np.float32)
        K.mm_block_arith(fmt, W, X, None, Y, K.Arithmetic("int8", batched=on))
        out.append(Y.astype(np.float64))
    return out


@pytest.mark.parametrize("fmt", kq_tiles.TILE_TYPES)
@pytest.mark.parametrize("nsb", [1, 3, 4])
def test_tiles_equal_the_one_token_kernels(fmt, nsb, int8_gemm):
    b32 = fmt in kq_tiles.B32_TILES
    block = 32 if b32 else 256
    nb = 5 * nsb + 1 if b32 else nsb  # 32-value types: 6, 16 and 21 blocks (units of 16, padded)
    W = random_blocks(fmt, 39, nb, RNG)  # 39 rows: a ragged last tile of rows
    T = K.GEMM_MIN_TOKENS + kq_tiles.TOKEN_BLOCK + 2  # two token blocks, a ragged tile of tokens
    X = RNG.standard_normal((T, block * nb)).astype(np.float32)
    per_token, tiled = _one_token_and_tiles(fmt, W, X)
    assert np.isfinite(tiled).all()
    Wf = np.abs(K.decode_rows_at(fmt, W, np.arange(W.shape[0])).astype(np.float64))
    Xq = np.abs(dispatch._dequantized(X, fmt, I8).astype(np.float64))
    # the affine types' minimum meets Q8_1's fp16-rounded block sum in the one-token kernel and
    # d_x·Σq_x here (as in the float32 GEMM form): 2⁻¹¹ of that term
    tol = 2e-3 if fmt in K.AFFINE_B32 else 1e-5
    assert (np.abs(tiled - per_token) <= tol * (Xq @ Wf.T) + 1e-30).all()


@pytest.mark.parametrize("fmt", kq_tiles.TILE_TYPES)
def test_int16_two_planes_equal_the_float_product(fmt, monkeypatch):
    """``--arithmetic int16`` without AMX: the register tiles on 16-bit activations (two int8
    planes, the first's sums shifted by 7 bits before the second's) give the float product of
    the decoded weights to ~1e-4 of its scale, where one int8 plane (llama.cpp's rounding) is
    ~100x further off; two token blocks, ragged rows and tokens, a padded unit."""
    if not kq_tiles.tiled(fmt):
        pytest.skip(f"{fmt} keeps the float32 GEMM on this CPU")
    monkeypatch.setattr(amx, "amx_runs", lambda fmt, k: False)
    monkeypatch.setattr(dispatch, "INT16_TILES_MIN_VALUES", 0)  # these small matrices too
    planes = []
    monkeypatch.setattr(dispatch, "mm_tiles", lambda f, W, xs, Y, c, kept: planes.append(len(xs) - 2) or kq_tiles.mm_tiles(f, W, xs, Y, c, kept))
    # Q8_0, Q4_0, Q5_0: the row tiles (runtime.kernels.row_tiles), whose second plane is its own array
    monkeypatch.setattr(dispatch, "mm_rows", lambda f, W, xs, Y, c, kept: planes.append(1 + (xs[2] is not xs[0])) or row_tiles.mm_rows(f, W, xs, Y, c, kept))
    # the K-quants: their row tiles (runtime.kernels.kq_row_tiles), likewise
    monkeypatch.setattr(dispatch, "mm_kq_rows", lambda f, W, xs, Y, kept: planes.append(1 + (xs[2] is not xs[0])) or kq_row_tiles.mm_kq_rows(f, W, xs, Y, kept))
    b32 = fmt in kq_tiles.B32_TILES
    block = 32 if b32 else 256
    nb = 21 if b32 else 3
    W = random_blocks(fmt, 39, nb, RNG)
    T = K.GEMM_MIN_TOKENS + kq_tiles.TOKEN_BLOCK + 3
    X = RNG.standard_normal((T, block * nb)).astype(np.float32)
    X[:, ::7] *= 20  # outliers: the int8 blocks round the rest of their block coarsely
    err = arithmetic_errors(fmt, W, X)
    assert err["int16"] < 1e-4 and err["int8"] > 30 * err["int16"], err
    assert planes == [1, 2]  # each in the tiles


@pytest.mark.parametrize("fmt", ["q4_1"])  # (Q8_0, Q4_0, Q5_0, the K-quants: test_row_tiles.py, test_kq_row_tiles.py)
def test_kept_rows_in_the_lane_layout(fmt, monkeypatch, int8_gemm):
    """Inside ``kept_unpacked`` (perplexity's windows, R1's passes) the register tiles unpack a
    matrix once and reuse it: the same products as unpacking per matmul, in int8 and int16."""
    nb = 20  # 640 values: a padded unit
    W = random_blocks(fmt, 41, nb, RNG)
    X = RNG.standard_normal((K.GEMM_MIN_TOKENS + 3, 640)).astype(np.float32)
    fresh = np.empty((X.shape[0], 41), np.float32)
    K.mm_block_arith(fmt, W, X, None, fresh, I8)
    monkeypatch.setattr(dispatch, "INT16_TILES_MIN_VALUES", 0)  # this small matrix too
    calls = []
    for mod in (kept_mod, kq_tiles):
        for name in ("unpack_rows", "unpack_b32_rows"):
            real = getattr(mod, name)
            monkeypatch.setattr(mod, name, lambda *a, real=real: (calls.append(1), real(*a))[1])
    tiles_planes = []
    monkeypatch.setattr(dispatch, "mm_tiles", lambda f, W, xs, Y, c, kept=None: tiles_planes.append((len(xs) - 2, kept is not None))
                        or kq_tiles.mm_tiles(f, W, xs, Y, c, kept))
    with K.kept_unpacked(matrices=[(fmt, 41, X.shape[1])]) as store:
        for _ in range(3):
            Y = np.empty_like(fresh)
            K.mm_block_arith(fmt, W, X, None, Y, I8.keeping(store))
            np.testing.assert_array_equal(Y, fresh)
        layout = kept_mod.kept_layout(fmt, X.shape[1])
        assert len(calls) == 1 and store.nbytes == kept_mod.unpacked_bytes(fmt, 41, X.shape[1], layout)
        K.mm_block_arith(fmt, W, X, None, Y, K.Arithmetic("int16").keeping(store))
        Wf = K.decode_rows_at(fmt, W, np.arange(41)).astype(np.float64)
        scale = np.abs(X).astype(np.float64) @ np.abs(Wf).T
        assert (np.abs(Y - X.astype(np.float64) @ Wf.T) / scale).max() < 1e-4
    assert len(calls) == 1 and tiles_planes == [(1, True)] * 3 + [(2, True)]
    assert store.mats == {}
    K.mm_block_arith(fmt, W, X, None, Y, K.Arithmetic("int16"))  # no store: unpacked again
    assert tiles_planes[-1] == (2, False) and len(calls) > 1


def test_chunks_of_rows_equal_one_chunk(monkeypatch, int8_gemm):  # the output head's chunks
    W = random_blocks("q4_k", 50, 2, RNG)
    X = RNG.standard_normal((K.GEMM_MIN_TOKENS, 512)).astype(np.float32)
    whole = np.empty((X.shape[0], 50), np.float32)
    K.mm_block_arith("q4_k", W, X, None, whole, I8)
    monkeypatch.setattr(gemm, "CHUNK_VALUES", 7 * 512)  # 7 rows a chunk: 8 chunks, the last of 1
    chunked = np.empty_like(whole)
    K.mm_block_arith("q4_k", W, X, None, chunked, I8)
    np.testing.assert_array_equal(chunked, whole)  # the same sums per output, in the same order


_AVX2_CHECK = """
import numpy as np
from runtime import kernels as K
from runtime.kernels import dispatch, gemm
from tests.runtime.quant_blocks import random_blocks
assert K.int_dot_features() == "avx2", K.int_dot_features()
rng = np.random.default_rng(0)
for fmt in ("q4_k", "q5_k", "q6_k", "q8_0", "q5_0", "q4_1"):
    W = random_blocks(fmt, 9, 3 if fmt.endswith("_k") else 24, rng)
    X = rng.standard_normal((K.GEMM_MIN_TOKENS + 1, 768)).astype(np.float32)
    ys = []
    for on in (False, True):
        Y = np.empty((X.shape[0], 9), np.float32)
        K.mm_block_arith(fmt, W, X, None, Y, K.Arithmetic("int8", batched=on))
        ys.append(Y)
    assert np.allclose(ys[0], ys[1], rtol=1e-4, atol=3e-3 * np.abs(ys[0]).max()), fmt
    # int16: two activation planes (pmaddubsw's 16-bit pair sums hold both)
    dispatch.INT16_TILES_MIN_VALUES = 0  # in the tiles, however small the matrix
    Y = np.empty((X.shape[0], 9), np.float32)
    K.mm_block_arith(fmt, W, X, None, Y, K.Arithmetic("int16"))
    Wf = K.decode_rows_at(fmt, W, np.arange(9)).astype(np.float64)
    scale = np.abs(X).astype(np.float64) @ np.abs(Wf).T
    assert (np.abs(Y - X.astype(np.float64) @ Wf.T) / scale).max() < 1e-4, fmt
print("ok")
"""


def test_tiles_on_avx2(tmp_path):
    """The tiles compiled for an AVX2 CPU (pmaddubsw + pmaddwd in place of vpdpbusd), run here."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from llvmlite import binding

    if not binding.get_host_cpu_features().get("avx2"):
        pytest.skip("this CPU cannot run AVX2 code")
    env = dict(os.environ, NUMBA_CPU_NAME="haswell", NUMBA_CPU_FEATURES="+avx2,+fma,+f16c,+bmi2",
               NUMBA_CACHE_DIR=str(tmp_path), NUMBA_NUM_THREADS="1")
    res = subprocess.run([sys.executable, "-c", _AVX2_CHECK], check=False, env=env, cwd=Path(__file__).resolve().parents[2],
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr[-2000:]
