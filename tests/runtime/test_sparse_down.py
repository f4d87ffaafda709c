"""Exact sparse execution on quantized weights (``aios-convert gguf --sparse-down``).

On a neuron-major file the sparse modes read only the down-projection rows of firing neurons,
in every type: the text equals dense on the same file, the logits agree to float rounding, and
the bytes counted are exactly the stored rows touched."""

from __future__ import annotations

import shutil

import gguf
import numpy as np
import pytest

from aios.errors import InvalidModelError
from aios.models.aliases import FIXTURES_DIR
from convert.gguf import GGUFExportConfig, export_gguf
from runtime.generate import generate
from runtime.model import Model
from tests.conftest import build_hf_model

IDS = list(range(5, 29))


def _sparse_vs_dense(path):
    dense, sparse = Model(path), Model(path, mode="sparse")
    a = dense.forward(IDS, all_logits=True)
    b = sparse.forward(IDS, all_logits=True)
    assert np.abs(a - b).max() <= 1e-4 * max(1.0, np.abs(a).max())
    d_text, td = generate(Model(path), IDS, 10)
    s_text, ts = generate(Model(path, mode="sparse"), IDS, 10)
    assert s_text == d_text
    return td, ts, sparse


@pytest.mark.parametrize("outtype", ["q8_0", "q4_0", "f16", "f32"])
def test_falcon_relu_sparse_down(tmp_path, outtype):
    """Non-gated FFN: up full, down rows of nonzero activations."""
    out = tmp_path / f"relu.{outtype}.gguf"
    export_gguf(str(FIXTURES_DIR / "tiny-falcon-relu"), out, GGUFExportConfig(outtype, sparse_down=True))
    r = gguf.GGUFReader(str(out))
    names = {t.name: t for t in r.tensors}
    assert "blk.0.ffn_down.weight" not in names
    t = names["blk.0.ffn_down.t"]
    assert t.tensor_type.name == outtype.upper() and [int(x) for x in t.shape] == [128, 512]
    td, ts, sparse = _sparse_vs_dense(out)
    assert ts.decode_bytes["weights"] < 0.8 * td.decode_bytes["weights"]
    # bytes counted for a down projection = its stored bytes per row × rows touched
    row = sparse.layers[0]["ffn_down.T"].row_bytes
    assert row == t.n_bytes // 512
    seen = {}
    sparse.ffn_act_hook = lambda layer, act: seen.setdefault(layer, int(np.count_nonzero(act[0])))
    sparse.counter.reset()
    sparse.forward([IDS[-1]])
    assert 0 < seen[0] < 512
    assert sparse.counter.per_tensor["blk.0.ffn_down.t"] == seen[0] * row  # exactly the rows touched


@pytest.mark.parametrize("outtype", ["q4_k", "q6_k", "q2_k", "q8_0"])
def test_gated_relu_sparse_down_k_quants(tmp_path, outtype):
    """Gated FFN (ReLU on the gate): gate full, up rows of firing gates, down rows of nonzero
    products; d_model 256 so the neuron-major rows hold whole K-quant super-blocks."""
    src = build_hf_model("llama", tmp_path / "src", hidden_size=256, intermediate_size=512, vocab_size=2048,
                         hidden_act="relu")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(FIXTURES_DIR / "tiny-falcon" / f, src / f)
    out = tmp_path / f"g.{outtype}.gguf"
    res = export_gguf(str(src), out, GGUFExportConfig(outtype, sparse_down=True))
    assert not [f for f in res.fallbacks if "ffn_down" in f]
    r = gguf.GGUFReader(str(out))
    assert next(t for t in r.tensors if t.name == "blk.0.ffn_down.t").tensor_type.name == outtype.upper()
    td, ts, _ = _sparse_vs_dense(out)
    assert ts.decode_bytes["weights"] < td.decode_bytes["weights"]


def test_standard_quantized_file_refuses_sparse_with_the_command(tmp_path):
    out = tmp_path / "std.gguf"
    export_gguf(str(FIXTURES_DIR / "tiny-falcon-relu"), out, GGUFExportConfig("q8_0"))
    with pytest.raises(InvalidModelError, match="--sparse-down"):
        Model(out, mode="sparse")


@pytest.mark.parametrize("outtype", ["q8_0", "q4_0", "q4_k", "f16"])
def test_neuron_rows_kernel_equals_gguf_dequantize(tmp_path, outtype):
    """The sparse sum over neuron-major rows (numba kernel for Q8_0/Q4_0, row decoding for the
    others, the float kernel for F16) against gguf-py's dequantized matrix."""
    from runtime.sparse_down import NeuronRows
    from runtime.weights import from_gguf_tensor

    src = build_hf_model("llama", tmp_path / "src", hidden_size=256, intermediate_size=512, vocab_size=256)
    out = tmp_path / "m.gguf"
    export_gguf(str(src), out, GGUFExportConfig(outtype, sparse_down=True))
    t = next(x for x in gguf.GGUFReader(str(out)).tensors if x.name == "blk.1.ffn_down.t")
    W = gguf.dequantize(t.data, t.tensor_type).reshape(512, 256).astype(np.float64)
    op = NeuronRows(from_gguf_tensor(t), t.name)
    rng = np.random.default_rng(0)
    a = rng.standard_normal(512).astype(np.float32)
    for active in (np.arange(512), np.sort(rng.choice(512, 37, replace=False)), np.array([5])):
        active = active.astype(np.int64)
        ref = a[active].astype(np.float64) @ W[active]
        np.testing.assert_allclose(op.sparse_matvec(a, active), ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
