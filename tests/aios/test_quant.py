"""The quant vocabulary (aios.quant) against gguf-py, and every module that uses it.

gguf-py is the reference for type names and block geometry; these tests fail if a spelling
stops round-tripping, if a module's constant drifts from gguf-py's table, or if a type the
runtime registers cannot be loaded from a real GGUF and multiplied through its table entry.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from aios import quant
from convert import kquants
from convert.gguf import tensors as gt
from runtime import kernels
from runtime.kernels import Arithmetic
from runtime.weights import (
    BLOCK_TYPES,
    KERNELS,
    KQUANT_TYPES,
    SUPPORTED_TYPES,
    from_gguf_tensor,
    transpose,
)


@pytest.mark.parametrize("outtype", gt.OUTTYPES)
def test_outtype_spellings_round_trip(outtype):
    t = quant.qtype(outtype)
    assert isinstance(t, GGMLQuantizationType)
    assert quant.qtype(outtype.upper()) is t and quant.qtype(t) is t
    assert t.name == outtype.upper()  # the spelling files and CLIs carry stays as it is
    assert quant.outtype_name(t) == quant.outtype_name(t.name) == outtype
    assert gt.ggml_type(outtype) is t


@pytest.mark.parametrize("bad", ["q9_k", "", "Q4_K_M", None])
def test_unknown_type_is_a_clear_key_error(bad):
    with pytest.raises(quant.UnknownQuantTypeError) as e:
        quant.qtype(bad)
    assert isinstance(e.value, KeyError)  # what the enum lookup it replaces raised
    assert str(e.value) == (f"Unknown GGML tensor type {bad!r}: "
                            "not a member of gguf-py's GGMLQuantizationType.")
    with pytest.raises(KeyError):
        quant.block_size(bad)


def test_sizes_come_from_gguf_py():
    assert quant.QK_K == gguf.constants.QK_K == 256
    for t in GGMLQuantizationType:
        if t in GGML_QUANT_SIZES:
            assert (quant.block_size(t), quant.type_size(t)) == GGML_QUANT_SIZES[t]
    assert (quant.block_size("q8_0"), quant.type_size("Q8_0")) == (32, 34)
    assert (quant.block_size("q4_k"), quant.type_size("q4_k")) == (256, 144)
    assert quant.row_bytes("q4_k", 512) == 288 and quant.row_bytes("f16", 7) == 14
    with pytest.raises(ValueError, match="not a whole number of Q8_0 blocks"):
        quant.row_bytes("q8_0", 48)


def test_module_constants_agree_with_the_table():
    assert kernels.QK == quant.block_size("Q8_0") == quant.block_size("Q4_0")
    assert kernels.QK_K == kquants.QK_K == quant.QK_K
    for t in kernels.KQ_TYPES:
        size = GGML_QUANT_SIZES[quant.qtype(t)][1]
        assert kernels.KQ_BYTES[t] == size
    assert kernels.KQ_XSUM == {"q2_k": quant.QK_K // 16, "q4_k": quant.QK_K // 8, "q5_k": quant.QK_K // 8}
    for t in kernels.B32:
        assert kernels.B32_BYTES[t] == GGML_QUANT_SIZES[quant.qtype(t)][1]
    assert kernels.KVALUES_IQ4NL == gguf.quants.IQ4_NL.kvalues
    for t in kquants.TYPES:
        assert kquants.BLOCK_BYTES[t] == GGML_QUANT_SIZES[quant.qtype(t)][1]
        assert kquants.row_bytes(512, t) == quant.row_bytes(t, 512)
    # aios.models.alias_format keeps its Q8_0 block literal so it does not import gguf at start-up
    from aios.models import alias_format

    assert alias_format.QK == quant.block_size("Q8_0")


def test_registry_is_the_supported_types():
    assert SUPPORTED_TYPES == ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "IQ4_NL",
                               "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS")
    assert KQUANT_TYPES == ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS")
    assert BLOCK_TYPES == SUPPORTED_TYPES[3:]
    assert {k.lower() for k in BLOCK_TYPES} == set(kernels.BLOCK_TYPES)
    assert set(SUPPORTED_TYPES) == set(KERNELS)
    for kind, spec in KERNELS.items():
        assert quant.qtype(kind).name == kind  # keyed by gguf-py's own names
        assert quant.qtype(kind) in GGML_QUANT_SIZES
        assert (spec.layout == "blocks") == (quant.block_size(kind) > 1)
        assert (spec.sparse is not None) == (spec.layout == "elements")
    assert {t.upper() for t in kernels.KQ_BYTES} == set(KQUANT_TYPES)


def _encode(W: np.ndarray, kind: str) -> tuple[np.ndarray, GGMLQuantizationType]:
    t = quant.qtype(kind)
    if kind == "F32":
        return W, t
    if kind == "F16":
        return W.astype(np.float16), t
    if kind == "BF16":
        return (W.view(np.uint32) >> 16).astype(np.uint16), t
    if quant.outtype_name(kind) in kquants.TYPES:
        return kquants.quantize(W, quant.outtype_name(kind)), t
    if kind.startswith("IQ4"):  # no encoder here (llama.cpp's quantizer: test_llamacpp_presets.py)
        from tests.runtime.quant_blocks import random_blocks

        return random_blocks(kind.lower(), W.shape[0], W.shape[1] // quant.block_size(kind)), t
    return gguf.quants.quantize(W, t), t


@pytest.fixture(scope="module")
def reader(tmp_path_factory):
    """A GGUF with one 8 × 512 matrix per registered type, plus one type the runtime lacks."""
    rng = np.random.default_rng(0)
    path = tmp_path_factory.mktemp("quant") / "types.gguf"
    wr = gguf.GGUFWriter(str(path), "llama")
    for kind in [*KERNELS, "TQ2_0"]:
        W = (rng.standard_normal((8, 512)) / 4).astype(np.float32)
        if kind == "TQ2_0":  # a type llama.cpp's CPU presets never write
            t = quant.qtype(kind)
            data = gguf.quants.quantize(W, t)
        else:
            data, t = _encode(W, kind)
        if data.dtype in (np.float32, np.float16):
            wr.add_tensor(kind, data)
        else:
            wr.add_tensor(kind, data, raw_shape=data.shape, raw_dtype=t)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    return gguf.GGUFReader(str(path))


@pytest.mark.parametrize("kind", SUPPORTED_TYPES)
def test_every_registered_type_loads_and_multiplies(reader, kind):
    t = next(x for x in reader.tensors if x.name == kind)
    assert t.tensor_type.name == kind
    m = from_gguf_tensor(t)
    assert (m.n_out, m.n_in) == (8, 512)
    assert m.nbytes == int(t.n_bytes) == 8 * quant.row_bytes(kind, 512)  # exactly the file's bytes
    W = gguf.dequantize(np.asarray(t.data), t.tensor_type).reshape(8, 512).astype(np.float64)
    X = np.random.default_rng(1).standard_normal((2, 512)).astype(np.float32)
    exp = X.astype(np.float64) @ W.T
    assert np.abs(m.matmul(X, None, Arithmetic("float")) - exp).max() <= 1e-5 * np.abs(exp).max()
    assert np.allclose(m.dense(), W, rtol=0, atol=1e-6 * np.abs(W).max())
    if KERNELS[kind].sparse is not None:
        active = np.array([0, 3, 7, 100, 511], np.int64)  # input neurons: rows of Wᵀ
        a = X[0]
        y = transpose(m).sparse_matvec(a, active)
        assert np.allclose(y, W[:, active] @ a[active], rtol=1e-5, atol=1e-5)


def test_unregistered_type_keeps_its_error(reader):
    from aios.errors import InvalidModelError

    t = next(x for x in reader.tensors if x.name == "TQ2_0")
    with pytest.raises(InvalidModelError) as e:
        from_gguf_tensor(t)
    assert str(e.value) == ("Tensor 'TQ2_0' has type TQ2_0; the runtime supports "
                            "F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, "
                            "IQ4_XS.")
