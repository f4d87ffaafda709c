"""R1's FFN statistics measured by running a GGUF in aios-run agree with the transformers path
on the same model's HF folder (the issue's bound: 0.01 on every fixture)."""

from __future__ import annotations

import numpy as np
import pytest

from aios.data import load_texts
from aios.measure.ffn import measure_ffn_activity
from aios.models import resolve_model
from runtime.measure import measure_ffn_activity_gguf


@pytest.mark.parametrize("fixture", ["tiny-falcon", "tiny-falcon-relu", "tiny-llama"])
def test_gguf_measurement_agrees_with_transformers(exported, fixture):
    path, src = exported(fixture, "f32")
    texts = load_texts(None, 6)
    h = resolve_model(str(src))
    tok = h.load_tokenizer()
    ref = measure_ffn_activity(h, texts, max_tokens=48, tokenizer=tok)
    got = measure_ffn_activity_gguf(path, texts, tok, max_tokens=48)
    assert got.tokens == ref.tokens > 0
    assert np.abs(got.zero_fraction - ref.zero_fraction).max() <= 0.01
    assert abs(got.mean_zero_fraction - ref.mean_zero_fraction) <= 0.01
    if fixture == "tiny-falcon-relu":  # a ReLU model: most activations are exact zeros in both
        assert got.mean_zero_fraction > 0.5


def test_aliased_gguf_is_measured_on_its_real_weights(tmp_path):
    """The aliased GGUF (canonical + Q8_0 deltas, which transformers cannot load) gives the same
    zero fractions as its de-aliased standard export: no random-initialized members."""
    from aios.models.aliases import FIXTURES_DIR
    from convert.alias_gguf import export_alias_gguf
    from tests.convert.test_alias import build_alias_folder

    folder = build_alias_folder(FIXTURES_DIR / "tiny-falcon-relu", tmp_path / "alias", delta="q8_0")
    aliased, flat = tmp_path / "a.gguf", tmp_path / "d.gguf"
    export_alias_gguf(folder, aliased)
    export_alias_gguf(folder, flat, dealias=True)
    texts = load_texts(None, 4)
    tok = resolve_model(str(FIXTURES_DIR / "tiny-falcon-relu")).load_tokenizer()
    a = measure_ffn_activity_gguf(aliased, texts, tok, max_tokens=48)
    d = measure_ffn_activity_gguf(flat, texts, tok, max_tokens=48)
    assert a.tokens == d.tokens > 0 and a.mean_zero_fraction > 0.5
    assert np.abs(a.zero_fraction - d.zero_fraction).max() <= 0.01


@pytest.mark.parametrize("outtype", ["q4_k", "q6_k", "q2_k", "q8_0", "q4_0", "f16"])
def test_row_reader_decodes_as_gguf_py(exported, outtype):
    """R3's row reader (the runtime's block decoders) = gguf-py's dequantization, for any row range
    of every stored 2-D tensor; the K-quant exports also hold their Q4_0/Q8_0 fallbacks."""
    from aios.models.tensors import GGUFStore
    from runtime.measure import gguf_row_reader

    path, _ = exported("tiny-falcon", outtype)
    read, store = gguf_row_reader(path), GGUFStore(path)
    for t in store.reader.tensors:
        if len(t.shape) != 2:
            continue
        n = int(t.shape[1])
        for a, b in ((0, n), (1, 7), (n - 3, n)):
            np.testing.assert_array_equal(read(t.name, a, b), store.get_rows(t.name, a, b))


def test_count_zeros_equals_numpys_counts():
    from runtime.measure import count_zeros

    rng = np.random.default_rng(3)
    a = rng.standard_normal((37, 70)).astype(np.float32) * 1e-3
    a[rng.random(a.shape) < 0.3] = 0  # exact zeros, among values on both sides of eps
    active = np.full(70, 5, np.int64)
    zeros, near = count_zeros(a, np.float32(1e-3), active)
    assert zeros == int((a == 0).sum()) and near == int((np.abs(a) < 1e-3).sum())
    np.testing.assert_array_equal(active, 5 + (a != 0).sum(0))
