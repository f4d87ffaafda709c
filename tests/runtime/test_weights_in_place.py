"""Weights are read in place: loading a GGUF copies no weight matrix out of the reader's mmap.

Every matrix the runtime multiplies is a view of ``gguf.GGUFReader``'s memmap (ggml's
interleaved blocks as stored, fp16 scales included), so peak memory is the file's touched
pages, not a second copy of the weights.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from aios import quant
from runtime.model import Model
from runtime.weights import BLOCK_TYPES, Matrix, from_gguf_tensor
from tests.runtime.quant_blocks import random_blocks


def _write(path, kind: str, d: int = 256, ffn: int = 512, layers: int = 2, vocab: int = 64):
    """A falcon-style model whose every matrix is ``kind`` (gguf-py's encoder where it has one)."""
    rng = np.random.default_rng(0)
    wr = gguf.GGUFWriter(str(path), "falcon")
    for k, v in (("block_count", layers), ("embedding_length", d), ("feed_forward_length", ffn),
                 ("head_count", 4), ("head_count_kv", 1), ("context_length", 64)):
        getattr(wr, "add_" + k)(v)
    wr.add_layer_norm_eps(1e-5)

    def mat(name, n, k):
        t = quant.qtype(kind)
        try:
            q = gguf.quants.quantize((rng.standard_normal((n, k)) / 16).astype(np.float32), t)
        except NotImplementedError:
            q = random_blocks(kind.lower(), n, k // quant.block_size(kind), rng)
        wr.add_tensor(name, q, raw_shape=q.shape, raw_dtype=t)

    mat("token_embd.weight", vocab, d)
    mat("output.weight", vocab, d)
    wr.add_tensor("output_norm.weight", np.ones(d, np.float32))
    wr.add_tensor("output_norm.bias", np.zeros(d, np.float32))
    for i in range(layers):
        wr.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(d, np.float32))
        wr.add_tensor(f"blk.{i}.attn_norm.bias", np.zeros(d, np.float32))
        mat(f"blk.{i}.attn_qkv.weight", d + 2 * (d // 4), d)
        mat(f"blk.{i}.attn_output.weight", d, d)
        mat(f"blk.{i}.ffn_up.weight", ffn, d)
        mat(f"blk.{i}.ffn_down.weight", d, ffn)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    return path


def _matrices(model: Model) -> list[Matrix]:
    ms = [model.tok_embd, model.output] + [v for L in model.layers for v in L.values()]
    return [m for m in ms if isinstance(m, Matrix)]


def test_loading_a_q8_0_gguf_copies_no_weights(tmp_path):
    path = _write(tmp_path / "q8.gguf", "Q8_0")
    model = Model(path, arithmetic="float")
    ms = _matrices(model)
    assert len(ms) == 2 + 4 * 2 and all(m.kind == "Q8_0" for m in ms)
    mm = model.reader.data  # the reader's np.memmap of the whole file
    assert isinstance(mm, np.memmap)
    for m in ms:
        assert not m.data.flags.owndata and np.shares_memory(m.data, mm), m.name
        assert m.nbytes == m.data.nbytes  # the view is exactly the file's bytes of the tensor
    logits = model.forward([1, 2, 3])
    assert np.isfinite(logits).all()


@pytest.mark.parametrize("kind", BLOCK_TYPES)
def test_every_block_type_is_a_view_of_the_file(tmp_path, kind):
    path = _write(tmp_path / f"{kind}.gguf", kind, layers=1)
    r = gguf.GGUFReader(str(path))
    for t in r.tensors:
        if t.tensor_type.name != kind:
            continue
        m = from_gguf_tensor(t)
        assert np.shares_memory(m.data, r.data), t.name
        assert m.data.dtype == np.uint8 and m.row_bytes == quant.row_bytes(kind, m.n_in)
        assert m.nbytes == int(t.n_bytes)


@pytest.mark.parametrize("kind", BLOCK_TYPES)
def test_embedding_rows_decode_as_gguf_py_to_the_bit(tmp_path, kind):
    """``rows_f32`` (the embedding look-up of every step) decodes with the kernels' per-type
    decoders and equals gguf-py's dequantizer bit for bit, negative zeros included, for any rows
    (repeated, out of order)."""
    path = _write(tmp_path / f"{kind}.gguf", kind, layers=1)
    model = Model(path, arithmetic="float")
    m = model.tok_embd
    rows = np.array([5, 0, 63, 5, 17], np.int64)
    ref = gguf.dequantize(m.data[rows], quant.qtype(kind)).astype(np.float32).reshape(len(rows), m.n_in)
    got = m.rows_f32(rows)
    assert got.shape == ref.shape and got.dtype == np.float32
    assert np.array_equal(got.view(np.uint32), ref.view(np.uint32))
    assert m.rows_f32(np.array([], np.int64)).shape == (0, m.n_in)
