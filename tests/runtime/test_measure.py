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
    rows = np.full(37, 2, np.int64)
    zeros, near = count_zeros(a, np.float32(1e-3), active, rows)
    assert zeros == int((a == 0).sum()) and near == int((np.abs(a) < 1e-3).sum())
    np.testing.assert_array_equal(active, 5 + (a != 0).sum(0))
    np.testing.assert_array_equal(rows, 2 + (a == 0).sum(1))


def test_set_estimate_covers_the_whole_sets_value():
    """Over random orders of a set whose texts differ (heavy-ish tails, uneven lengths), the
    interval at every look from DECISION_MIN_TEXTS on holds the whole set's value; a narrow one
    (z = 1) misses often, so the check can fail."""
    from aios.measure.ffn import DECISION_MIN_TEXTS, DECISION_Z, set_estimate

    rng = np.random.default_rng(7)
    K = 241
    tokens = rng.integers(8, 129, K)
    frac = np.clip(0.72 + 0.08 * rng.standard_t(4, K), 0, 1)
    zeros = frac * tokens
    whole = zeros.sum() / tokens.sum()
    looks = misses = narrow_misses = 0
    for _ in range(300):
        p = rng.permutation(K)
        for k in range(DECISION_MIN_TEXTS, K, 7):
            e = set_estimate(zeros[p[:k]], tokens[p[:k]], K, int(tokens.sum()), DECISION_Z)
            n = set_estimate(zeros[p[:k]], tokens[p[:k]], K, int(tokens.sum()), 1.0)
            looks += 1
            misses += not e.low <= whole <= e.high
            narrow_misses += not n.low <= whole <= n.high
    assert misses / looks < 1e-3 and narrow_misses / looks > 0.1
    full = set_estimate(zeros, tokens, K, int(tokens.sum()))
    assert full.low == full.high == full.value == pytest.approx(whole) and full.settles(0.7)


def test_settles_only_with_enough_texts_and_a_clear_side():
    from aios.measure.ffn import DECISION_MIN_TEXTS, SetEstimate

    assert SetEstimate(0.5, 0.45, 0.55, DECISION_MIN_TEXTS, 100).settles(0.7)
    assert not SetEstimate(0.5, 0.45, 0.55, DECISION_MIN_TEXTS - 1, 100).settles(0.7)
    assert not SetEstimate(0.69, 0.65, 0.72, 90, 100).settles(0.7)
    assert SetEstimate(0.80, 0.70, 0.85, 30, 100).settles(0.7)
    assert SetEstimate(0.69, 0.69, 0.69, 100, 100).settles(0.7)


@pytest.mark.parametrize("relu", [False, True])
def test_gguf_measurement_stops_once_settled(exported, relu):
    """A GELU file (no zeros) and a ReLU one (most activations zero) are settled against R1's
    floor on DECISION_MIN_TEXTS-odd texts of 60; the per-text counts add up to the layer counts,
    and each text's fraction is the one it gets run alone."""
    from aios.measure.ffn import DECISION_MIN_TEXTS

    path, src = exported("tiny-falcon", "f32", relu=relu)
    texts = load_texts(None, 60)
    tok = resolve_model(str(src)).load_tokenizer()
    got = measure_ffn_activity_gguf(path, texts, tok, max_tokens=48, settle_at=0.7 if not relu else 0.3)
    k = len(got.text_tokens)
    assert DECISION_MIN_TEXTS <= k < 60 and got.set_texts == 60
    assert sum(got.text_tokens) == got.tokens
    scale = got.n_layers * got.d_ffn
    assert round(sum(got.text_zeros) * scale) == int(got.zeros.sum())
    est = got.set_estimate()
    assert est.value == pytest.approx(got.mean_zero_fraction)
    assert (est.low >= 0.3) if relu else (est.high < 0.7)
    full = measure_ffn_activity_gguf(path, texts, tok, max_tokens=48)
    assert len(full.text_tokens) == 60 and full.set_estimate().low == full.set_estimate().high
    by_len = {}  # the first texts of the seeded order, each run alone
    order = [int(i) for i in np.random.default_rng(0).permutation(60)]
    for j in range(4):
        alone = measure_ffn_activity_gguf(path, [texts[order[j]]], tok, max_tokens=48)
        by_len[j] = alone.mean_zero_fraction
        assert got.text_tokens[j] == alone.tokens
        assert got.text_zeros[j] / got.text_tokens[j] == pytest.approx(alone.mean_zero_fraction, abs=0.01)
    if relu:  # the texts differ, so a misplaced segment would show
        assert max(by_len.values()) - min(by_len.values()) > 0.005
