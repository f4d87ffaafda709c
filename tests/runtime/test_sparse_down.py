"""Exact sparse execution on quantized weights (``aios-convert gguf --sparse-down``).

On a neuron-major file the sparse modes read only the down-projection rows of firing neurons,
in every type: the text equals dense on the same file, the logits agree to float rounding, and
the bytes counted are exactly the stored rows touched."""

from __future__ import annotations


import gguf
import numpy as np
import pytest

from aios.errors import InvalidModelError
from aios.models.aliases import FIXTURES_DIR
from convert.gguf import GGUFExportConfig, export_gguf
from runtime.generate import generate
from runtime.model import Model
from tests.conftest import build_hf_model, with_tokenizer

IDS = list(range(5, 29))
EVERY_OUTTYPE = ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_k", "q6_k", "q2_k"]  # what the exporter writes


# every stored type sums its rows in a kernel: gguf-py's row decoding is refused (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("no_row_decoding")


@pytest.fixture(scope="module")
def gated_relu_file(tmp_path_factory):
    """Factory: outtype -> a --sparse-down export of a gated-ReLU Llama (d_model 256, so the
    neuron-major rows hold whole K-quant super-blocks), made once per type."""
    root = tmp_path_factory.mktemp("gated")
    src = with_tokenizer(build_hf_model("llama", root / "src", hidden_size=256, intermediate_size=512,
                                        vocab_size=2048, hidden_act="relu"))
    made = {}

    def make(outtype):
        if outtype not in made:
            out = root / f"g.{outtype}.gguf"
            res = export_gguf(str(src), out, GGUFExportConfig(outtype, sparse_down=True))
            assert not [f for f in res.fallbacks if "ffn_down" in f]
            made[outtype] = out
        return made[outtype]

    return make


def _decoded_down(path, arithmetic="float"):
    """A dense model of ``path`` whose neuron-major down projections hold gguf-py's decoding of
    their rows as F32 (summed by the float kernel): the reference the block kernels are held to,
    since dense and sparse on the file both run them."""
    from runtime.sparse_down import NeuronRows
    from runtime.weights import Matrix

    model = Model(path, arithmetic=arithmetic)
    for L in model.layers:
        op = L.get("ffn_down.weight")
        if isinstance(op, NeuronRows) and op.m.kind not in ("F32", "F16", "BF16"):
            m = op.m
            W = gguf.dequantize(np.asarray(m.data), gguf.GGMLQuantizationType[m.kind]).astype(np.float32)
            op.m = Matrix(m.name, "F32", m.n_out, m.n_in, W.reshape(m.n_out, m.n_in))
    return model


def _sparse_vs_dense(path):
    dense, sparse = Model(path, arithmetic="float"), Model(path, mode="sparse", arithmetic="float")
    a = dense.forward(IDS, all_logits=True)
    b = sparse.forward(IDS, all_logits=True)
    assert np.abs(a - b).max() <= 1e-5 * max(1.0, np.abs(a).max())
    ref = _decoded_down(path).forward(IDS, all_logits=True)
    assert np.abs(a - ref).max() <= 1e-5 * max(1.0, np.abs(ref).max())
    d_text, td = generate(Model(path, arithmetic="float"), IDS, 10)
    s_text, ts = generate(Model(path, mode="sparse", arithmetic="float"), IDS, 10)
    assert s_text == d_text
    return td, ts, sparse


@pytest.mark.parametrize("outtype", ["q8_0", "q4_0", "f16", "bf16", "f32"])
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


@pytest.mark.parametrize("outtype", EVERY_OUTTYPE)
def test_gated_relu_sparse_down_every_outtype(gated_relu_file, outtype):
    """Gated FFN (ReLU on the gate): gate full, up rows of firing gates, down rows of nonzero
    products, in every type the exporter writes, each summed by its kernel (no row decoding)."""
    out = gated_relu_file(outtype)
    r = gguf.GGUFReader(str(out))
    assert next(t for t in r.tensors if t.name == "blk.0.ffn_down.t").tensor_type.name == outtype.upper()
    td, ts, _ = _sparse_vs_dense(out)
    assert ts.decode_bytes["weights"] < td.decode_bytes["weights"]


@pytest.mark.parametrize("outtype", ["q8_0", "q4_0", "q4_k", "q6_k", "q2_k"])
def test_gated_relu_sparse_down_int8_arithmetic(gated_relu_file, outtype):
    """The fast path: int8 arithmetic (the gathered gate/up rows as int8 dot products, the down rows
    a float axpy either way) gives the same greedy text sparse as dense."""
    out = gated_relu_file(outtype)
    d_text, _ = generate(Model(out, arithmetic="int8"), IDS, 10)
    s_text, _ = generate(Model(out, mode="sparse", arithmetic="int8"), IDS, 10)
    assert s_text == d_text == generate(_decoded_down(out, "int8"), IDS, 10)[0]
    # the logits only to int8's resolution: the down sums differ in float rounding (other rows in
    # each thread's partial sum), which can move the next layer's activations across an int8 step
    a = Model(out, arithmetic="int8").forward(IDS, all_logits=True)
    b = Model(out, mode="sparse", arithmetic="int8").forward(IDS, all_logits=True)
    assert np.abs(a - b).max() <= 3e-2 * max(1.0, np.abs(a).max())


def test_every_block_type_sums_rows_in_a_kernel():
    from runtime.weights import BLOCK_TYPES, KERNELS

    assert all(KERNELS[k].sparse_blocks is not None for k in BLOCK_TYPES)
    assert all(KERNELS[k].sparse is not None for k in ("F32", "F16", "BF16"))


def test_standard_quantized_file_refuses_sparse_with_the_command(tmp_path):
    out = tmp_path / "std.gguf"
    export_gguf(str(FIXTURES_DIR / "tiny-falcon-relu"), out, GGUFExportConfig("q8_0"))
    with pytest.raises(InvalidModelError, match="--sparse-down"):
        Model(out, mode="sparse", arithmetic="float")


@pytest.mark.parametrize("outtype", EVERY_OUTTYPE)
def test_neuron_rows_kernel_equals_gguf_dequantize(tmp_path, outtype):
    """The sparse sum over neuron-major rows (each block type's kernel, the float kernels for
    F32/F16/BF16) against gguf-py's dequantized matrix."""
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
