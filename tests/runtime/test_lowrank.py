"""Low-rank + residual GGUFs in the runtime: values against a materialized reference, exact bytes."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from aios.errors import UsageError
from convert.svd_residual import SvdResidualConfig, svd_residual
from runtime.evaluate import evaluate_gguf
from runtime.kernels import Arithmetic
from runtime.lowrank import FlatResidual, LowRankLinear
from runtime.model import Model
from runtime.weights import Matrix

PROMPT = [5, 17, 300, 42, 1000, 7, 88, 1999, 3, 64, 512, 9]

CASES = {  # fixture -> converter config (plain SVD: no calibration run, so the tests stay quick)
    "tiny-falcon": SvdResidualConfig(rank=8, method="plain", residual="q2_k", factor_type="f16", outtype="f32"),
    "tiny-llama": SvdResidualConfig(rank=12, method="plain", residual="q8_0", factor_type="q8_0", outtype="f32"),
}


@pytest.fixture(scope="module")
def lowrank(tmp_path_factory):
    root = tmp_path_factory.mktemp("lowrank")
    cache: dict = {}

    def make(fixture: str, src: str | None = None):
        if fixture not in cache:
            cache[fixture] = svd_residual(src or fixture, root / f"{fixture}.gguf", CASES[fixture]).output
        return cache[fixture]

    return make


def _deq(t) -> np.ndarray:
    """A GGUF tensor as float64 in numpy order, by gguf-py's dequantizer (not the runtime's)."""
    return gguf.dequantize(t.data, t.tensor_type).astype(np.float64)


def materialized_reference(lowrank_path, dense_path) -> Model:
    """The plain f32 export with each factorized W replaced by deq(U)·deq(V) + deq(E) (F32 Matrix)."""
    ref = Model(dense_path, arithmetic="float")
    tensors = {t.name: t for t in gguf.GGUFReader(lowrank_path).tensors}
    for i, L in enumerate(ref.layers):
        for key in list(L):
            base = f"blk.{i}.{key.removesuffix('.weight')}"
            if base + ".lr_u" not in tensors:
                continue
            u, v = _deq(tensors[base + ".lr_u"]), _deq(tensors[base + ".lr_v"])
            W = u @ v
            if base + ".residual" in tensors:
                W += _deq(tensors[base + ".residual"]).reshape(W.shape)
            assert W.shape == (L[key].n_out, L[key].n_in)
            L[key] = Matrix(key, "F32", W.shape[0], W.shape[1], W.astype(np.float32))
    return ref


@pytest.mark.parametrize("fixture", list(CASES))
def test_logits_equal_materialized_reference(fixture, lowrank, exported):
    dense, _ = exported(fixture, "f32")
    got = Model(lowrank(fixture), arithmetic="float").forward(PROMPT, all_logits=True)
    want = materialized_reference(lowrank(fixture), dense).forward(PROMPT, all_logits=True)
    assert got.shape == (len(PROMPT), 2048)
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
    base = Model(dense, arithmetic="float").forward(PROMPT, all_logits=True)
    assert np.abs(got - base).max() > 1e-2  # the factorization really changed the model


def _expected_decode_weight_bytes(path) -> int:
    """Bytes one decode step must read, from the GGUF's own tensor sizes.

    Every block tensor once (norm weights are not counted by the runtime), one embedding row,
    the whole output head (the embedding when tied); kernels read the stored bytes.
    """
    tensors = {t.name: t for t in gguf.GGUFReader(path).tensors}
    total = 0
    for name, t in tensors.items():
        if not name.startswith("blk.") or name.endswith("_norm.weight") or name.endswith("_norm.bias"):
            continue
        total += int(t.n_bytes)
    emb = tensors["token_embd.weight"]
    total += int(emb.n_bytes) // int(emb.shape[1])
    total += int(tensors.get("output.weight", emb).n_bytes)
    return total


@pytest.mark.parametrize("fixture", list(CASES))
def test_measured_bytes_per_token_equal_tensor_sizes(fixture, lowrank):
    path = lowrank(fixture)
    m = evaluate_gguf(path, eval_tokens=32, decode_tokens=2)
    assert m["weights_mb_per_token"] * 1e6 == pytest.approx(_expected_decode_weight_bytes(path), abs=0.5)
    assert any(k.endswith(".residual") for k in m["weights_bytes_per_tensor"])
    assert 1 < m["heldout_perplexity"] < 1e4 and 1 < m["pydoc_perplexity"] < 1e4


def test_full_rank_without_residual_reproduces_dense(tmp_path, exported):
    dense, _ = exported("tiny-llama", "f32")
    cfg = SvdResidualConfig(rank="full", method="plain", residual="none", factor_type="f32", outtype="f32")
    out = svd_residual("tiny-llama", tmp_path / "full.gguf", cfg).output
    got = Model(out, arithmetic="float").forward(PROMPT, all_logits=True)
    want = Model(dense, arithmetic="float").forward(PROMPT, all_logits=True)
    np.testing.assert_allclose(got, want, atol=2e-4, rtol=0)


def test_sparse_mode_refuses_a_lowrank_down_projection(tmp_path, exported):
    _, relu_src = exported("tiny-falcon", "f32", relu=True)
    cfg = SvdResidualConfig(rank=4, method="plain", residual="q8_0", outtype="f32")
    out = svd_residual(str(relu_src), tmp_path / "relu-lr.gguf", cfg).output
    Model(out, mode="dense", arithmetic="float")  # loads
    with pytest.raises(UsageError, match="low-rank factors"):
        Model(out, mode="sparse", arithmetic="float")


@pytest.mark.parametrize("kind", ["q8_0", "q2_k", "q4_k"])
def test_operator_rows_values_and_reads(kind):
    from convert.svd_residual import encode

    rng = np.random.default_rng(0)
    n_out, n_in, r = 48, 96, 5  # 96-value rows: K super-blocks (256) span row boundaries
    U = rng.standard_normal((n_out, r)).astype(np.float32)
    V = rng.standard_normal((r, n_in)).astype(np.float32)
    E = rng.standard_normal((n_out, n_in)).astype(np.float32)
    qtype = gguf.GGMLQuantizationType[kind.upper()]
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = encode(E.reshape(-1, block), kind).reshape(-1, size)
    R = FlatResidual("e", kind.upper(), n_out, n_in, raw, block)
    op = LowRankLinear("w", Matrix("u", "F32", n_out, r, U), Matrix("v", "F32", r, n_in, V), R)
    Edeq = gguf.dequantize(raw.reshape(-1), qtype).reshape(n_out, n_in)
    W = U.astype(np.float64) @ V + Edeq
    np.testing.assert_allclose(op.dense(), W, atol=1e-5)
    X = rng.standard_normal((3, n_in)).astype(np.float32)
    rows = np.array([0, 7, 8, 47])
    Y = op.matmul(X, rows, Arithmetic("float"))
    np.testing.assert_allclose(Y[:, rows], X @ W[rows].T, atol=1e-4)
    assert not Y[:, np.setdiff1d(np.arange(n_out), rows)].any()
    blocks = {b for i in rows for b in range(i * n_in // block, ((i + 1) * n_in - 1) // block + 1)}
    assert dict(op.reads(rows)) == {"v": V.nbytes, "u": len(rows) * r * 4, "e": len(blocks) * size}
    assert dict(op.reads()) == {"v": V.nbytes, "u": U.nbytes, "e": raw.nbytes}
