"""The FFN activation predictor (``--mode predict``): fitting, measured FNR, exact bytes, clean errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from aios.errors import InvalidModelError, UsageError
from runtime import predictor as P
from runtime.cli import main
from runtime.fit_predictor import fit
from runtime.model import Model


@pytest.fixture(scope="module")
def relu_gguf(exported):
    path, _ = exported("tiny-falcon-relu", "f32")  # the bundled relufied fixture (real ~92 % zeros)
    return path


@pytest.fixture(scope="module")
def fitted(relu_gguf, tmp_path_factory):
    pred = fit(relu_gguf, P.PredictorConfig(rank=16, target_fnr=0.01, max_tokens=1536))
    out = P.save(pred, tmp_path_factory.mktemp("pred") / "p.npz")
    return pred, out


def test_fit_measures_heldout_fnr_and_saves_work(fitted):
    pred, _ = fitted
    h = pred.info["heldout"]
    assert pred.info["calibration_tokens"] == 1536
    # measured on tokens the fit never saw: few misses, and far fewer rows than dense
    assert h["fnr"] < 0.05
    assert h["true_density"] < h["predicted_density"] < 0.5
    assert all(e["tokens"] > 0 for e in h["per_layer"])


def test_whitened_low_rank_beats_chance(relu_gguf):
    """On inputs the runtime produces, rank-r scores rank firing neurons above silent ones."""
    m = Model(relu_gguf, arithmetic="float")
    H = P.collect_ffn_inputs(m, [list(range(1, 200))], 199)[2]
    W = m.layers[2]["ffn_up.weight"].dense()
    lp = P.fit_layer(W, H, 0.0, P.PredictorConfig(rank=8))
    fired = H @ W.T > 0
    scores = (H @ lp.B.T) @ lp.A.T
    assert scores[fired].mean() > scores[~fired].mean() + 1.0


def test_predict_with_every_row_equals_dense(relu_gguf, tmp_path):
    m = Model(relu_gguf, arithmetic="float")
    pred = P.Predictor([P.LayerPredictor(np.zeros((m.hp.d_ffn, 1), np.float32), np.zeros((1, m.hp.d_model), np.float32),
                                         np.full(m.hp.d_ffn, -1.0, np.float32)) for _ in m.layers],
                       {"format": P.PREDICTOR_FORMAT, "source": P.file_fingerprint(relu_gguf)})
    f = P.save(pred, tmp_path / "all.npz")
    ids = list(range(1, 12))
    ref = m.forward(ids, all_logits=True)
    mp = Model(relu_gguf, mode="predict", predictor=f, arithmetic="float")
    mp.measure_fnr = True
    assert np.abs(mp.forward(ids, all_logits=True) - ref).max() <= 1e-5
    assert mp.pred_stats["missed"] == 0


def test_predict_bytes_are_exactly_the_rows_read(relu_gguf, fitted):
    _, f = fitted
    m = Model(relu_gguf, mode="predict", predictor=f, arithmetic="float")
    m.measure_fnr = True
    m.forward(list(range(1, 9)))
    seen = []
    m.ffn_input_hook = lambda i, h: seen.append(m.predictor.layers[i].predict(h)[0])
    before = dict(m.counter.per_tensor)
    m.forward([42])
    got = {k: v - before.get(k, 0) for k, v in m.counter.per_tensor.items() if v != before.get(k, 0)}
    hp = m.hp
    for i, L in enumerate(m.layers):
        n_pred = int(seen[i].sum())
        assert got[f"blk.{i}.ffn_predictor"] == m.predictor.layers[i].nbytes
        assert got[f"blk.{i}.ffn_up.weight"] == n_pred * hp.d_model * 4
        assert got.get(f"blk.{i}.ffn_down.weight.T", 0) <= n_pred * hp.d_model * 4
    # the lossy run's measured FNR is recorded for the decode step
    assert m.pred_stats["rows"] == hp.n_layers * hp.d_ffn


def test_predictor_errors(relu_gguf, fitted, exported, tmp_path):
    _, f = fitted
    with pytest.raises(UsageError, match="fit-predictor"):
        Model(relu_gguf, mode="predict", predictor=tmp_path / "none.npz", arithmetic="float")
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(InvalidModelError, match="not a readable predictor"):
        Model(relu_gguf, mode="predict", predictor=bad, arithmetic="float")
    other, _ = exported("tiny-falcon", "f32", relu=True)  # same shapes, different weights
    with pytest.raises(InvalidModelError, match="was fitted on"):
        Model(other, mode="predict", predictor=f, arithmetic="float")
    gelu, _ = exported("tiny-falcon", "f32")
    with pytest.raises(UsageError, match="ReLU-family"):
        fit(gelu, P.PredictorConfig(max_tokens=64))
    with pytest.raises(UsageError, match="rank"):
        fit(relu_gguf, P.PredictorConfig(rank=0))


def test_cli_fit_then_bench_labels_lossy(relu_gguf, tmp_path):
    pf = tmp_path / "relu.predictor.npz"
    r = CliRunner().invoke(main, ["fit-predictor", str(relu_gguf), "-o", str(pf), "--rank", "8", "--max-tokens", "512"])
    assert r.exit_code == 0, r.output
    assert pf.exists() and "false-negative rate" in r.stdout
    out = tmp_path / "b"
    r = CliRunner().invoke(main, ["bench", str(relu_gguf), "--modes", "sparse,predict", "--predictor", str(pf),
                                  "--prompt-tokens", "16", "-n", "4", "--no-project", "--perplexity-tokens", "130",
                                  "-o", str(out)])
    assert r.exit_code == 0, r.output
    rows = json.loads((out / "aios-bench.json").read_text())["rows"]
    pr = rows[1]
    assert pr["mode"] == "predict" and pr["lossy"] and 0 <= pr["predictor_fnr"] < 1  # accuracy: first test
    assert pr["decode_mb_per_token"]["weights"] < rows[0]["decode_mb_per_token"]["weights"]
    assert rows[0]["heldout_perplexity"] > 1 and pr["perplexity_ratio_vs_baseline"] > 0.5
    md = (out / "aios-bench.md").read_text()
    assert "(lossy)" in md and "false-negative rate" in md and "Held-out perplexity" in md
