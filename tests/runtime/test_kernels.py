"""The SIMD kernels against float64 references, on shapes that reach every code path.

Paths: four-row groups and a partial last group (row counts 1..9), rows in any order and
repeated, several tokens, row lengths that are and are not multiples of 32 (the plain
fallbacks), 32-value block rows whose block count is and is not a multiple of 16 (the
unrolled chunk and the one-by-one tail), every block type on random bytes, sparse sums with no, one and many active rows.
Quantized references decode the stored bits independently of the kernels (gguf-py's own
dequantizer for the GGUF block bytes).
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType, dequantize, quantize

from runtime import kernels as K
from tests.runtime.quant_blocks import F16_FIELDS, random_blocks

RNG = np.random.default_rng(7)


def _ref(W: np.ndarray, X: np.ndarray, rows: np.ndarray) -> np.ndarray:
    Y = np.zeros((X.shape[0], W.shape[0]), np.float64)
    Y[:, rows] = X.astype(np.float64) @ W[rows].astype(np.float64).T
    return Y


def _tol(W: np.ndarray, X: np.ndarray) -> float:
    # float32 accumulation in a different order than the float64 reference
    return 1e-5 * float(np.abs(W).max() * np.abs(X).max() * W.shape[1]) + 1e-6


def _rows(n: int) -> list[np.ndarray]:
    return [np.arange(n), np.arange(n)[::-1].copy(), np.array([n - 1]), RNG.permutation(n)[: max(1, n // 2)],
            np.array([0, 0, n - 1, 0, n - 1])]


def _float_bits(W: np.ndarray, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """(stored array, the float32 values it decodes to) for F32/F16/BF16."""
    if kind == "f32":
        return W, W
    if kind == "f16":
        h = W.astype(np.float16)
        return h.view(np.uint16), h.astype(np.float32)
    b = (W.view(np.uint32) >> 16).astype(np.uint16)
    return b, (b.astype(np.uint32) << 16).view(np.float32)


MM = {"f32": K.mm_f32, "f16": K.mm_f16, "bf16": K.mm_bf16}
SPARSE = {"f32": K.sparse_rows_f32, "f16": K.sparse_rows_f16, "bf16": K.sparse_rows_bf16}


@pytest.mark.parametrize("kind", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("n,k,T", [(1, 32, 1), (5, 64, 1), (9, 96, 3), (13, 2048, 2), (6, 33, 2), (3, 100, 1)])
def test_float_rows_match_reference(kind: str, n: int, k: int, T: int) -> None:
    stored, W = _float_bits(RNG.standard_normal((n, k), dtype=np.float32), kind)
    X = RNG.standard_normal((T, k), dtype=np.float32)
    for rows in _rows(n):
        Y = np.full((T, n), np.nan, np.float32)
        Y[:, np.setdiff1d(np.arange(n), rows)] = 0
        MM[kind](stored, X, rows.astype(np.int64), Y)
        np.testing.assert_allclose(Y, _ref(W, X, np.unique(rows)), atol=_tol(W, X), rtol=0)
    Y = np.full((T, n), np.nan, np.float32)  # rows None: every row, each written
    MM[kind](stored, X, None, Y)
    np.testing.assert_allclose(Y, _ref(W, X, np.arange(n)), atol=_tol(W, X), rtol=0)


def _every_kernel():
    """(name, call(W, X, rows, Y), stored W for n rows of k values) for each dense kernel entry."""
    out = [(kind, MM[kind], lambda n, k, kind=kind: _float_bits(RNG.standard_normal((n, k), dtype=np.float32), kind)[0])
           for kind in MM]
    f16 = lambda n, k: _float_bits(RNG.standard_normal((n, k), dtype=np.float32), "f16")[0]  # noqa: E731
    for arith in K.ARITHMETICS:  # mm_f16_arith in each setting (int8: fp16 x, one row or strided)
        out.append((f"f16_{arith}", lambda W, X, r, Y, arith=arith: K.mm_f16_arith(W, X, r, Y, K.Arithmetic(arith)), f16))
    for kind in K.BLOCK_TYPES:
        vals = K.QK_K if kind in K.KQ_TYPES else K.QK
        out.append((kind, lambda W, X, r, Y, kind=kind: K.mm_block(kind, W, X, r, Y),
                    lambda n, k, kind=kind, vals=vals: random_blocks(kind, n, k // vals, RNG)))
        if kind in K.INT8_ALL:
            out.append((kind + "_int8", lambda W, X, r, Y, kind=kind: K.mm_block_int8(kind, W, X, r, Y),
                        lambda n, k, kind=kind, vals=vals: random_blocks(kind, n, k // vals, RNG)))
        if kind in ("q8_0", "q4_0", "q5_0", "q4_k", "q5_k", "q6_k"):  # llama.cpp's order (runtime.kernels.ggml_order)
            out.append((kind + "_llamacpp", lambda W, X, r, Y, kind=kind: K.mm_block_arith(
                kind, W, X, r, Y, K.Arithmetic("llamacpp")),
                lambda n, k, kind=kind, vals=vals: random_blocks(kind, n, k // vals, RNG)))
    return out


@pytest.mark.parametrize("name,call,make", _every_kernel(), ids=lambda v: v if isinstance(v, str) else "")
def test_rows_none_is_every_row_bit_for_bit(name, call, make) -> None:
    """rows=None (the dense matmul: indices computed, not loaded) gives exactly what the list
    0..n-1 gives, on row counts that leave partial groups of four and of eight (strided)."""
    for n in (1, 3, 8, 13, 37):
        k = 512 if name.split("_")[0] not in ("f32", "f16", "bf16") else (64 if n % 2 else 40)
        k = 8256 if name == "f16_int8" and n == 37 else k  # past ONE_ROW_X_BYTES: the strided eight
        W, X = make(n, k), RNG.standard_normal((2, k), dtype=np.float32)
        Y0, Y1 = np.full((2, n), np.nan, np.float32), np.full((2, n), np.nan, np.float32)
        call(W, X, np.arange(n, dtype=np.int64), Y0)
        call(W, X, None, Y1)
        assert not np.isnan(Y1).any(), (name, n)
        np.testing.assert_array_equal(Y1, Y0, err_msg=f"{name} n={n}")


def test_every_block_type_has_its_fp16_fields_listed() -> None:
    assert set(F16_FIELDS) == set(K.BLOCK_TYPES)


@pytest.mark.parametrize("kind", ["q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl"])
@pytest.mark.parametrize("n,nb,T", [(1, 1, 1), (7, 15, 1), (4, 16, 2), (9, 17, 1), (6, 64, 3), (5, 67, 1)])
def test_block_rows_match_gguf_dequantize(kind: str, n: int, nb: int, T: int) -> None:
    """32-value blocks read in place (the file's interleaved bytes), gguf-py's real encodings
    where it has an encoder and random bytes for every type; the chunk of 16 blocks and the
    one-by-one tail both run."""
    raws = [random_blocks(kind, n, nb, RNG)]
    if kind != "iq4_nl":
        raws.append(quantize(RNG.standard_normal((n, 32 * nb), dtype=np.float32) * 0.1,
                             GGMLQuantizationType[kind.upper()]).reshape(n, -1))
    X = RNG.standard_normal((T, 32 * nb), dtype=np.float32)
    for raw in raws:
        W = dequantize(raw, GGMLQuantizationType[kind.upper()]).reshape(n, 32 * nb)
        for rows in _rows(n):
            Y = np.zeros((T, n), np.float32)
            K.mm_block(kind, raw, X, rows.astype(np.int64), Y)
            np.testing.assert_allclose(Y, _ref(W, X, np.unique(rows)), atol=_tol(W, X), rtol=0)


@pytest.mark.parametrize("kind", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("d_ffn,n", [(352, 128), (64, 2048), (40, 33)])
def test_sparse_rows_match_reference(kind: str, d_ffn: int, n: int) -> None:
    stored, W = _float_bits(RNG.standard_normal((d_ffn, n), dtype=np.float32), kind)
    a = RNG.standard_normal(d_ffn).astype(np.float32)
    for active in ([], [d_ffn - 1], [3, 1, 2], list(range(0, d_ffn, 3)), list(range(d_ffn))):
        act = np.asarray(active, np.int64)
        y = np.full(n, np.nan, np.float32)
        SPARSE[kind](stored, a, act, y)
        ref = a[act].astype(np.float64) @ W[act].astype(np.float64) if len(act) else np.zeros(n)
        np.testing.assert_allclose(y, ref, atol=1e-5 * np.abs(W).max() * max(1, len(act)), rtol=0)


def test_rows_outside_the_selection_are_not_written() -> None:
    W = RNG.standard_normal((10, 64), dtype=np.float32)
    Y = np.full((1, 10), 123.0, np.float32)
    K.mm_f32(W, RNG.standard_normal((1, 64), dtype=np.float32), np.array([2, 5, 7], np.int64), Y)
    assert (Y[0, [0, 1, 3, 4, 6, 8, 9]] == 123.0).all()
    assert (Y[0, [2, 5, 7]] != 123.0).all()


@pytest.mark.parametrize("kind", ["q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_xs"])
@pytest.mark.parametrize("n,nsb,T", [(1, 1, 1), (6, 2, 3), (9, 8, 1)])
def test_kquant_rows_match_gguf_dequantize(kind: str, n: int, nsb: int, T: int) -> None:
    """K-quant rows (our encoder's bytes where it has the type, random bytes for every type)
    against gguf-py's dequantizer of the same bytes."""
    from convert import kquants

    k = 256 * nsb
    raws = [random_blocks(kind, n, nsb, RNG)]
    if kind in kquants.TYPES:
        raws.append(kquants.quantize(RNG.standard_normal((n, k), dtype=np.float32), kind).reshape(n, -1))
    X = RNG.standard_normal((T, k), dtype=np.float32)
    for raw in raws:
        W = dequantize(raw, GGMLQuantizationType[kind.upper()]).reshape(n, k)
        for rows in _rows(n):
            Y = np.zeros((T, n), np.float32)
            K.mm_block(kind, raw, X, rows.astype(np.int64), Y)
            np.testing.assert_allclose(Y, _ref(W, X, np.unique(rows)), atol=_tol(W, X), rtol=0)


_FLOAT_ASM = """
from numba import types
from runtime import kernels as K
A = lambda dt: types.Array(dt, 2, "C")
sig = (A(types.uint16), A(types.float32), types.Array(types.int64, 1, "C"), A(types.float32), types.int64)
K.mm_float_rows.compile(sig)
asm = K.mm_float_rows.inspect_asm(sig)
print(K.float_row_prefetch(), "prefetcht0" in asm)
"""


@pytest.mark.parametrize("cpu, prefetch", [("znver4", False), ("znver2", False), ("skylake-avx512", True),
                                           ("haswell", True)])
def test_float_rows_prefetch_is_chosen_by_cpu(tmp_path, cpu: str, prefetch: bool) -> None:
    """The float-row kernels are compiled for the CPU numba targets: software prefetch of each
    row on Intel names, none on AMD Zen (``float_row_prefetch``). Compiled only (not run), in a
    subprocess with its own cache, so any host can check any target."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = dict(os.environ, NUMBA_CPU_NAME=cpu, NUMBA_CACHE_DIR=str(tmp_path))
    env.pop("NUMBA_CPU_FEATURES", None)
    res = subprocess.run([sys.executable, "-c", _FLOAT_ASM], env=env, cwd=Path(__file__).resolve().parents[2],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split() == [str(prefetch), str(prefetch)]
