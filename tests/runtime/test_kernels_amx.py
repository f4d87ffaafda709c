"""The AMX tiles (runtime.kernels.amx): the values' order the unpackers write for them, the
activations as the B tile loads them, and products equal to the one-token int8 kernels' for every
tiled type, ragged rows and tokens, several token blocks and chunks of rows. The products need a
CPU with AMX-INT8 (and a kernel that grants it); elsewhere they skip and the register tiles run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from runtime import kernels as K
from runtime.kernels import amx, dispatch, gemm, kq_tiles
from runtime.kernels import kept as kept_mod
from runtime.kernels.quantize import quantize_activations_k
from tests.runtime.quant_blocks import arithmetic_errors, random_blocks

RNG = np.random.default_rng(5)
needs_amx = pytest.mark.skipif(not amx.amx_available(), reason="this CPU or kernel has no AMX-INT8 tiles")


def test_tile_config_names_the_shapes():
    cfg = amx.amx_tile_config(32)
    assert cfg[0] == 1 and cfg.size == 64
    colsb = cfg[16:32].view(np.uint16)
    rows = cfg[48:56]
    # sums 16 × 16 int32 (64 bytes a row), weights 16 rows × 32 bytes, activations 8 rows × 64 bytes
    assert list(colsb[:8]) == [64, 64, 64, 64, 32, 64, 32, 64]
    assert list(rows[:8]) == [16, 16, 16, 16, 16, 8, 16, 8]


@pytest.mark.parametrize("fmt", kq_tiles.TILE_TYPES)
def test_unpacked_in_the_values_order(fmt):
    b32 = fmt in kq_tiles.B32_TILES
    nb = 21 if b32 else 3
    k = (32 if b32 else 256) * nb
    W = random_blocks(fmt, 5, nb, RNG)
    nu = kq_tiles.units(fmt, k)
    Q = np.zeros((5, k // 4), np.uint32)
    S = np.empty((5, nu * 16), np.float32)
    C = np.empty_like(S)
    unpack = kq_tiles.unpack_b32_rows if b32 else kq_tiles.unpack_rows
    unpack(W, kq_tiles.TILE_KIND[fmt], kq_tiles.TILE_BYTES[fmt], nu, Q, S, C, C.view(np.int32), True)
    G = kq_tiles.LANE_VALUES[fmt]
    q = (Q.view(np.int8) if fmt in kq_tiles.SIGNED else Q.view(np.uint8)).astype(np.float64)
    values = np.repeat(S[:, :k // G].astype(np.float64), G, axis=1) * q
    if fmt not in kq_tiles.SIGNED:
        values -= np.repeat(C[:, :k // G].astype(np.float64), G, axis=1)
    ref = K.decode_rows_at(fmt, W, np.arange(5)).astype(np.float64)
    np.testing.assert_allclose(values, ref, rtol=1e-6, atol=1e-6 * np.abs(ref).max())


@pytest.mark.parametrize("fmt", ["q4_k", "q6_k", "q8_0", "q4_1"])
def test_activations_as_the_b_tile_loads_them(fmt):
    b32 = fmt in kq_tiles.B32_TILES
    k, T = 512, 19  # two token blocks, the second padded
    X = RNG.standard_normal((T, k)).astype(np.float32)
    if b32:
        xq, xd, _ = K.quantize_activations(X)
        XA, XD, XB, n = amx.arranged_amx(fmt, xq, xd)
    else:
        xq, xd, xb = quantize_activations_k(X)
        XA, XD, XB, n = amx.arranged_amx(fmt, xq, xd, xb)
    G = kq_tiles.LANE_VALUES[fmt]
    assert n == T and XA.shape == (2, k // G, G // 4, 16)
    # block b, group g, word j, token t: values 4j..4j+3 of group g of token 16b + t
    got = XA.view(np.int8).reshape(2, k // G, G // 4, 16, 4).transpose(0, 3, 1, 2, 4).reshape(32, k)
    np.testing.assert_array_equal(got[:T], xq)
    assert not got[T:].any() and not XD[:, T:].any() and not XB[:, T:].any()
    d = xd.T if b32 else np.repeat(xd.T, 256 // G, axis=0)
    np.testing.assert_array_equal(XD[:, :T], d)
    sums = xq.reshape(T, k // G, G).astype(np.int64).sum(axis=2).T
    np.testing.assert_allclose(XB[:, :T], d * sums, rtol=1e-7)


I8 = K.Arithmetic("int8", batched=True)


@needs_amx
@pytest.mark.parametrize("fmt", kq_tiles.TILE_TYPES)
@pytest.mark.parametrize("nb", [1, 3])
def test_amx_equals_the_one_token_kernels(fmt, nb):
    b32 = fmt in kq_tiles.B32_TILES
    block = 32 if b32 else 256
    nblocks = 7 * nb if b32 else nb  # 32-value types: 7 and 21 blocks (odd group counts)
    W = random_blocks(fmt, 39, nblocks, RNG)  # a ragged last tile of 7 rows
    T = K.GEMM_MIN_TOKENS + amx.AMX_TOKENS + 3  # three token blocks, the last of 3 tokens
    X = RNG.standard_normal((T, block * nblocks)).astype(np.float32)
    assert amx.amx_runs(fmt, X.shape[1])
    out = []
    for on in (False, True):
        Y = np.full((T, 39), np.nan, np.float32)
        K.mm_block_arith(fmt, W, X, None, Y, K.Arithmetic("int8", batched=on))
        out.append(Y.astype(np.float64))
    per_token, tiles = out
    assert np.isfinite(tiles).all()
    Wf = np.abs(K.decode_rows_at(fmt, W, np.arange(39)).astype(np.float64))
    Xq = np.abs(dispatch._dequantized(X, fmt, I8).astype(np.float64))
    tol = 2e-3 if fmt in K.AFFINE_B32 else 1e-5  # Q8_1's fp16 block sums in the one-token kernel
    assert (np.abs(tiles - per_token) <= tol * (Xq @ Wf.T) + 1e-30).all()


@needs_amx
def test_chunks_of_rows_and_a_row_offset(monkeypatch):
    W = random_blocks("q5_k", 70, 2, RNG)
    X = RNG.standard_normal((K.GEMM_MIN_TOKENS, 512)).astype(np.float32)
    whole = np.empty((X.shape[0], 70), np.float32)
    K.mm_block_arith("q5_k", W, X, None, whole, I8)
    monkeypatch.setattr(gemm, "CHUNK_VALUES", 20 * 512)  # 16 rows a chunk: 5 chunks, the last of 6
    chunked = np.empty_like(whole)
    K.mm_block_arith("q5_k", W, X, None, chunked, I8)
    np.testing.assert_array_equal(chunked, whole)
    wide = np.zeros((X.shape[0], 90), np.float32)  # a strided Y: computed aside, then copied in
    amx.mm_amx("q5_k", W, amx.arranged_amx("q5_k", *K.quantize_activations_k(X)), wide[:, 10:80], gemm.CHUNK_VALUES)
    np.testing.assert_array_equal(wide[:, 10:80], whole)
    assert not wide[:, :10].any() and not wide[:, 80:].any()
    monkeypatch.setitem(amx._STATE, "ok", False)  # the register tiles: the same sums to float rounding
    tiles = np.empty_like(whole)
    K.mm_block_arith("q5_k", W, X, None, tiles, I8)
    np.testing.assert_allclose(tiles, whole, rtol=1e-4, atol=1e-5 * np.abs(whole).max())


@pytest.mark.parametrize("env", [{"AIOS_AMX": "0"}, {"NUMBA_CPU_NAME": "haswell"}])
def test_off_when_asked_or_compiling_for_another_cpu(env):
    code = "from runtime.kernels import amx; print(amx.amx_available(), amx.amx_runs('q4_k', 4096))"
    res = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, **env), cwd=Path(__file__).resolve().parents[2],
                         capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0 and res.stdout.split() == ["False", "False"], res.stderr[-2000:]


@needs_amx
def test_kept_unpacked_rows_are_reused_and_freed(monkeypatch):
    W = random_blocks("q4_k", 40, 2, RNG)
    X = RNG.standard_normal((K.GEMM_MIN_TOKENS, 512)).astype(np.float32)
    fresh = np.empty((X.shape[0], 40), np.float32)
    K.mm_block_arith("q4_k", W, X, None, fresh, I8)
    calls = []
    for mod in (amx, kept_mod):  # per matmul's chunks, and the kept form
        monkeypatch.setattr(mod, "unpack_rows", lambda *a, real=mod.unpack_rows: (calls.append(1), real(*a))[1])
    with K.kept_unpacked() as store:
        for _ in range(3):
            Y = np.empty_like(fresh)
            K.mm_block_arith("q4_k", W, X, None, Y, I8.keeping(store))
            np.testing.assert_array_equal(Y, fresh)
        assert len(calls) == 1 and store.nbytes > 0  # unpacked once, then kept
    assert store.mats == {}
    calls.clear()
    K.mm_block_arith("q4_k", W, X, None, Y, I8)
    per_matmul = len(calls)  # its chunks of rows
    with K.kept_unpacked(budget=1000) as store:  # over the budget: unpacked per matmul, nothing kept
        for _ in range(2):
            K.mm_block_arith("q4_k", W, X, None, Y, I8.keeping(store))
        assert len(calls) == 3 * per_matmul and store.mats == {}
    np.testing.assert_array_equal(Y, fresh)
    one = kept_mod.unpacked_bytes("q4_k", 40, 512)
    calls.clear()
    with K.kept_unpacked(budget=one, matrices=[("q4_k", 40, 512), ("q4_k", 40, 512), ("f32", 9, 9)]) as store:
        for _ in range(2):  # half the passes' matrices fit: kept
            K.mm_block_arith("q4_k", W, X, None, Y, I8.keeping(store))
        assert len(calls) == 1 and store.nbytes == one
    calls.clear()
    with K.kept_unpacked(budget=one, matrices=[("q4_k", 40, 512)] * 3) as store:
        assert store is None  # a third fits: a cycle through them would gain a third, nothing is kept
        for _ in range(2):
            K.mm_block_arith("q4_k", W, X, None, Y, I8.keeping(store))
        assert len(calls) == 2 * per_matmul
    np.testing.assert_array_equal(Y, fresh)


@needs_amx
@pytest.mark.parametrize("fmt", kq_tiles.TILE_TYPES)
def test_int16_two_planes_equal_the_float_product(fmt):
    """``--arithmetic int16``: the tiles on 16-bit activations (two int8 planes) give the float
    product of the decoded weights to ~1e-4 of its scale, where one int8 plane (llama.cpp's
    rounding) is ~100× further off; a padded token block, ragged rows and several chunks."""
    b32 = fmt in kq_tiles.B32_TILES
    block = 32 if b32 else 256
    nblocks = 21 if b32 else 3
    W = random_blocks(fmt, 39, nblocks, RNG)
    T = K.GEMM_MIN_TOKENS + amx.AMX_TOKENS + 3
    X = RNG.standard_normal((T, block * nblocks)).astype(np.float32)
    X[:, ::7] *= 20  # outliers: the int8 blocks round the rest of their block coarsely
    err = arithmetic_errors(fmt, W, X)
    assert err["int16"] < 1e-4 and err["int8"] > 30 * err["int16"], err


def test_int16_label_says_where_it_runs(monkeypatch):
    monkeypatch.setitem(amx._STATE, "ok", True)
    assert "AMX tiles on two int8 activation planes" in K.arithmetic_label("int16", ["Q4_K"])
    monkeypatch.setitem(amx._STATE, "ok", False)
    assert "register tiles" in K.arithmetic_label("int16", ["Q4_K"])
    assert K.arithmetic_label("int16", ["IQ4_NL"]).startswith("int16 (float here")
