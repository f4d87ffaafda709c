"""K-quant weights in the runtime: the numba kernels against gguf-py's dequantizer, a whole
model's logits against the same model dequantized to F32, and exact byte counting."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf.quants import dequantize

from aios import quant
from convert import kquants as kq
from runtime.kernels import Arithmetic
from runtime.model import Model
from runtime.weights import KQUANT_TYPES, Matrix, from_gguf_tensor

# A falcon-style model with d_model 256 so every matrix has K-quant rows; each K type is
# used for several roles, the embedding table included (decoded per token).
D, HEADS, KV, FFN, VOCAB, LAYERS = 256, 4, 1, 512, 64, 2
ROLE_TYPES = {"token_embd": "Q6_K", "attn_qkv": "Q4_K", "attn_output": "Q2_K", "ffn_up": "Q6_K",
              "ffn_down": "Q4_K", "output": "Q2_K"}


def _weights() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    hd = D // HEADS
    w = {"token_embd.weight": rng.standard_normal((VOCAB, D)), "output.weight": rng.standard_normal((VOCAB, D)) / 16,
         "output_norm.weight": 1 + 0.1 * rng.standard_normal(D), "output_norm.bias": 0.1 * rng.standard_normal(D)}
    for i in range(LAYERS):
        w[f"blk.{i}.attn_norm.weight"] = 1 + 0.1 * rng.standard_normal(D)
        w[f"blk.{i}.attn_norm.bias"] = 0.1 * rng.standard_normal(D)
        w[f"blk.{i}.attn_qkv.weight"] = rng.standard_normal(((HEADS + 2 * KV) * hd, D)) / 16
        w[f"blk.{i}.attn_output.weight"] = rng.standard_normal((D, D)) / 16
        w[f"blk.{i}.ffn_up.weight"] = rng.standard_normal((FFN, D)) / 16
        w[f"blk.{i}.ffn_down.weight"] = rng.standard_normal((D, FFN)) / 23
    return {k: v.astype(np.float32) for k, v in w.items()}


def write_model(path: Path, dequantized: bool) -> Path:
    """The K-quant model, or (``dequantized``) the same values decoded by gguf-py, as F32."""
    wr = gguf.GGUFWriter(str(path), "falcon")
    wr.add_block_count(LAYERS)
    wr.add_embedding_length(D)
    wr.add_feed_forward_length(FFN)
    wr.add_head_count(HEADS)
    wr.add_head_count_kv(KV)
    wr.add_context_length(64)
    wr.add_layer_norm_eps(1e-5)
    for name, x in _weights().items():
        role = name.split(".")[-2] if name.startswith("blk.") else name.split(".")[0]
        t = ROLE_TYPES.get(role) if x.ndim == 2 else None
        if t is None:
            wr.add_tensor(name, x)
            continue
        q = kq.quantize(x, t.lower())
        qt = gguf.GGMLQuantizationType[t]
        if dequantized:
            wr.add_tensor(name, dequantize(q, qt).astype(np.float32))
        else:
            wr.add_tensor(name, q, raw_shape=q.shape, raw_dtype=qt)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    return path


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("kq")
    return write_model(root / "k.gguf", False), write_model(root / "deq.gguf", True)


@pytest.mark.parametrize("kind", KQUANT_TYPES)
def test_matmul_equals_gguf_dequantize(kind):
    rng = np.random.default_rng(1)
    W = rng.standard_normal((24, 768)).astype(np.float32)
    if kind.lower() in kq.TYPES:
        q = kq.quantize(W, kind.lower())
    else:  # IQ4_XS: no encoder of ours; random blocks are valid ones
        from tests.runtime.quant_blocks import random_blocks

        q = random_blocks(kind.lower(), 24, 3, rng)
    m = Matrix("w", kind, 24, 768, q)
    assert m.row_bytes == q.shape[1] == 768 // 256 * quant.type_size(kind)
    ref = dequantize(q, gguf.GGMLQuantizationType[kind]).astype(np.float64)
    X = rng.standard_normal((3, 768)).astype(np.float32)
    Y = m.matmul(X, None, Arithmetic("float"))
    exp = X.astype(np.float64) @ ref.T
    assert np.abs(Y - exp).max() <= 1e-5 * np.abs(exp).max()
    rows = np.array([0, 5, 23], np.int64)
    Yr = m.matmul(X, rows, Arithmetic("float"))
    assert np.abs(Yr[:, rows] - exp[:, rows]).max() <= 1e-5 * np.abs(exp).max()
    assert not np.delete(Yr, rows, axis=1).any()  # rows not asked for are not computed
    assert np.array_equal(m.dense(), ref.astype(np.float32))
    assert m.reads(rows) == [("w", 3 * m.row_bytes)]


def test_model_logits_equal_dequantized_path(models):
    kpath, dpath = models
    tokens = np.array([3, 17, 42, 8, 63, 0, 5])
    a = Model(kpath, arithmetic="float").forward(tokens, all_logits=True)
    b = Model(dpath, arithmetic="float").forward(tokens, all_logits=True)
    assert a.shape == (len(tokens), VOCAB)
    assert np.abs(a - b).max() <= 1e-5 * np.abs(b).max(), np.abs(a - b).max() / np.abs(b).max()


def test_bytes_counted_are_the_stored_bytes(models):
    kpath, _ = models
    r = gguf.GGUFReader(str(kpath))
    stored = {t.name: int(t.n_bytes) for t in r.tensors}
    kinds = {t.name: t.tensor_type.name for t in r.tensors}
    m = Model(kpath, arithmetic="float")
    m.forward([1, 2, 3])
    before = dict(m.counter.per_tensor)
    m.forward([4])  # one decode token reads every matrix once and one embedding row
    got = {k: v - before.get(k, 0) for k, v in m.counter.per_tensor.items()}
    for name, kind in kinds.items():
        if kind not in KQUANT_TYPES:
            continue
        expect = stored[name] // VOCAB if name == "token_embd.weight" else stored[name]
        assert got[name] == expect, (name, got[name], expect)
        assert from_gguf_tensor(next(t for t in r.tensors if t.name == name)).nbytes == stored[name]
