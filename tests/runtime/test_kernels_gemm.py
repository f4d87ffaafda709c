"""The many-token GEMM form of the block matmuls (runtime.kernels.gemm): the same arithmetic as
the one-token kernels, to float32 rounding, in int8 and in float, for every block type."""

from __future__ import annotations

import numpy as np
import pytest

from runtime import kernels as K
from runtime.kernels import dispatch, gemm
from tests.runtime.quant_blocks import random_blocks

RNG = np.random.default_rng(7)


def _both(kind, W, X, arith):
    """Y of the one-token kernels (GEMM off) and of the GEMM form, in ``arith``."""
    out = []
    for on in (False, True):
        Y = np.empty((X.shape[0], W.shape[0]), np.float32)
        K.mm_block_arith(kind, W, X, None, Y, K.Arithmetic(arith, batched=on))
        out.append(Y)
    return out


def _scale(kind, W, X, arith):
    """|Ŵ|·|X̂|ᵀ: the size of each output's terms, what float32 rounding is relative to."""
    Wf = np.abs(K.decode_rows_at(kind, W, np.arange(W.shape[0])).astype(np.float64))
    if arith == "int8":
        X = dispatch._dequantized(X, kind, K.Arithmetic(arith))
    return np.abs(X.astype(np.float64)) @ Wf.T


@pytest.mark.parametrize("arith", ["int8", "float"])
@pytest.mark.parametrize("kind", K.BLOCK_TYPES)
def test_gemm_equals_the_one_token_kernels(kind, arith):
    block = 256 if kind in K.KQ_TYPES else 32
    nb = 4 if block == 256 else 24
    W = random_blocks(kind, 37, nb, RNG)  # 37 rows: groups of 4 with a ragged tail
    X = RNG.standard_normal((K.GEMM_MIN_TOKENS + 3, block * nb)).astype(np.float32)
    per_token, batched = _both(kind, W, X, arith)
    assert np.isfinite(batched).all()
    # the affine types' minimum meets Q8_1's fp16-rounded block sum in the one-token kernel and
    # d_x·Σq_x here (runtime.kernels.gemm's docstring): 2⁻¹¹ of that term
    tol = 2e-3 if arith == "int8" and kind in K.AFFINE_B32 else 1e-5
    err = np.abs(batched.astype(np.float64) - per_token)
    assert (err <= tol * _scale(kind, W, X, arith) + 1e-30).all(), float((err / _scale(kind, W, X, arith)).max())


@pytest.mark.parametrize("kind, tokens", [("q5_0", K.GEMM_MIN_TOKENS - 1), ("q4_k", dispatch.KQ_ROWS_MIN_TOKENS - 1)])
def test_below_the_threshold_nothing_changes(kind, tokens):
    """Below GEMM_MIN_TOKENS (the K-quants' int8: below KQ_ROWS_MIN_TOKENS, where their row
    tiles start as llama.cpp's tiled path does) the batched forms run the one-token kernels."""
    W = random_blocks(kind, 9, 2 if kind == "q4_k" else 16, RNG)
    X = RNG.standard_normal((tokens, 512)).astype(np.float32)
    per_token, batched = _both(kind, W, X, "int8")
    assert per_token.tobytes() == batched.tobytes()


def test_chunks_of_rows_equal_one_chunk(monkeypatch):
    # the output head is decoded and multiplied in chunks of CHUNK_VALUES values
    W = random_blocks("q5_0", 50, 8, RNG)
    X = RNG.standard_normal((20, 256)).astype(np.float32)
    whole = np.empty((20, 50), np.float32)
    K.mm_block_arith("q5_0", W, X, None, whole, K.Arithmetic("float"))
    monkeypatch.setattr(gemm, "CHUNK_VALUES", 7 * 256)  # 7 rows a chunk: 8 chunks, the last of 1
    chunked = np.empty((20, 50), np.float32)
    K.mm_block_arith("q5_0", W, X, None, chunked, K.Arithmetic("float"))
    np.testing.assert_allclose(chunked, whole, rtol=1e-6, atol=1e-6)


def test_rows_subset_keeps_the_one_token_kernels():
    # the sparse modes pass ``rows``: those products stay on the kernels that read only them
    W = random_blocks("q8_0", 16, 4, RNG)
    X = RNG.standard_normal((24, 128)).astype(np.float32)
    rows = np.array([1, 5, 9], np.int64)
    Y = np.zeros((24, 16), np.float32)
    K.mm_block_arith("q8_0", W, X, rows, Y, K.Arithmetic("int8"))
    assert not Y[:, np.setdiff1d(np.arange(16), rows)].any() and Y[:, rows].any()


def test_switched_off_by_the_environment(tmp_path):
    import subprocess
    import sys

    code = "from runtime import kernels as K; a = K.Arithmetic(); print(a.use_gemm(512), a.use_gemm(8))"
    env_on = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    import os

    env = {**os.environ, "AIOS_BATCHED_GEMM": "0"}
    env_off = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert env_on.stdout.split() == ["True", "False"] and env_off.stdout.split() == ["False", "False"]


@pytest.mark.parametrize("k", [256, 2048])
def test_activation_values_are_the_int8_blocks_to_the_bit(k):
    # q8_0_values / q8_k_values skip the int8 storage: the same rounding as quantize_activations*
    X = (RNG.standard_normal((9, k)) * np.exp(RNG.uniform(-8, 8, (9, 1)))).astype(np.float32)
    X[0, :32] = 0  # an all-zero block
    X[1, 5], X[1, 9] = 3.0, -3.0  # equal magnitudes: the first one sets the sign of d
    xq, xd, _ = K.quantize_activations(X)
    ref0 = (xq.reshape(9, -1, 32) * xd[..., None]).reshape(9, k)
    np.testing.assert_array_equal(gemm.q8_0_values(X), ref0.astype(np.float32))  # (a zero's sign may differ)
    xq, xd, _ = K.quantize_activations_k(X)
    refk = (xq.reshape(9, -1, 256) * xd[..., None]).reshape(9, k)
    np.testing.assert_array_equal(gemm.q8_k_values(X), refk.astype(np.float32))
