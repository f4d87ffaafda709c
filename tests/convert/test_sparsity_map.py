"""aios-convert sparsity-map: search math, file format, and the conservative budget measured
on the bundled relufied falcon."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from aios.data import load_texts
from aios.errors import UsageError
from aios.models.aliases import FIXTURES_DIR
from convert.cli import main
from convert.gguf.sparsity import check_masks
from convert.sparsity_map import (
    SparsityMapConfig,
    load_sparsity_map,
    sparsity_map,
    sparsity_map_header,
    write_sparsity_map,
)
from convert.sparsity_map import search as ss

RELU_FALCON = FIXTURES_DIR / "tiny-falcon-relu"  # aios-convert relufy tiny-falcon, defaults


# --- math ---------------------------------------------------------------------------------


def test_skip_order_and_masks():
    freq = np.array([[0.5, 0.0, 0.2], [0.0, 0.9, 0.2]])
    order = ss.skip_order(freq)
    assert order.tolist() == [1, 3, 2, 5, 0, 4]  # ties by flat index
    keep = ss.keep_masks(order, 3, freq.shape)
    assert keep.tolist() == [[True, False, False], [False, True, True]]
    assert ss.keep_masks(order, 0, freq.shape).all()


@pytest.mark.parametrize("budget", [0.001, 0.005, 0.05])
def test_search_finds_largest_passing_count(budget):
    n = 1000
    change = lambda k: (k / n) ** 3  # noqa: E731  monotone perplexity change
    k, probes = ss.search_skip_count(n, change, budget, resolution=n)
    assert change(k) < budget <= change(k + 1)
    assert any(p.skipped == k and p.ok for p in probes) or k == 0
    assert len(probes) <= 12


def test_search_never_returns_a_failing_count():
    noisy = {k: (0.002 if k % 7 == 0 else 0.0) + k * 1e-5 for k in range(101)}
    k, probes = ss.search_skip_count(100, lambda k: noisy[k], 0.001, resolution=100)
    assert abs(noisy[k]) < 0.001
    assert ss.search_skip_count(10, lambda k: 0.0, 0.001)[0] == 10  # nothing hurts: skip all


def test_false_negative_rate():
    active = np.array([[10, 0, 5], [1, 4, 0]])
    keep = np.array([[True, False, False], [True, True, True]])
    assert ss.false_negative_rate(active, keep) == pytest.approx(5 / 20)
    assert ss.false_negative_rate(np.zeros((1, 2)), np.ones((1, 2), bool)) == 0.0


# --- file format --------------------------------------------------------------------------


def test_write_and_load_roundtrip_is_byte_reproducible(tmp_path):
    keep = np.random.default_rng(0).random((3, 16)) > 0.3
    header = {"format_version": 1, "mode": "balanced", "per_layer_kept": keep.sum(1).tolist()}
    a = write_sparsity_map(tmp_path / "a.npz", keep, header)
    b = write_sparsity_map(tmp_path / "b.npz", keep, header)
    assert a.read_bytes() == b.read_bytes()
    masks = load_sparsity_map(a)  # the GGUF exporter's reader
    assert list(masks) == [0, 1, 2] and all((masks[i] == keep[i]).all() for i in masks)
    check_masks(masks, 3, 16, str(a))
    assert sparsity_map_header(a) == header
    (tmp_path / "a.json").unlink()  # the header inside the npz is enough
    assert sparsity_map_header(a) == header
    with np.load(a, allow_pickle=False) as z:
        assert z["layer_1"].dtype == bool and json.loads(str(z["header"])) == header


def test_config_budgets():
    assert SparsityMapConfig(mode="conservative").budget() == 0.1
    assert SparsityMapConfig(mode="balanced").budget() == 0.5
    assert SparsityMapConfig(mode="aggressive", budget_pct=3).budget() == 3.0
    with pytest.raises(UsageError, match="--budget"):
        SparsityMapConfig(mode="aggressive").budget()
    with pytest.raises(UsageError, match="aggressive"):
        SparsityMapConfig(mode="balanced", budget_pct=2).budget()


# --- the conservative budget, measured independently on a real relufied model -------------


def _masked_heldout_ppl(folder, masks):
    """Held-out perplexity (fixtures' protocol) with skipped neurons zeroed by our own hooks."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from aios.fixtures.train import heldout_perplexity, stream_ids

    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    ids = stream_ids(AutoTokenizer.from_pretrained(folder), "heldout")
    hooks = []
    for i, keep in (masks or {}).items():
        keep_t = torch.from_numpy(keep.astype(np.float32))
        hooks.append(model.transformer.h[i].mlp.dense_4h_to_h.register_forward_pre_hook(
            lambda _m, args, k=keep_t: (args[0] * k,)))
    return heldout_perplexity(model, ids)


def test_conservative_map_changes_heldout_perplexity_by_less_than_0_1_percent(tmp_path):
    cal = tmp_path / "cal.jsonl"
    cal.write_text("".join(json.dumps({"text": t}) + "\n" for t in load_texts(limit=80)))
    res = sparsity_map(str(RELU_FALCON), tmp_path / "map.npz",
                       SparsityMapConfig(mode="conservative", resolution=256), calibration=cal)
    h = res.header
    masks = load_sparsity_map(res.path)
    without, with_map = _masked_heldout_ppl(RELU_FALCON, None), _masked_heldout_ppl(RELU_FALCON, masks)
    assert abs(with_map - without) / without < 0.001
    assert with_map == pytest.approx(h["heldout_ppl_with"], rel=1e-6)
    assert without == pytest.approx(h["heldout_ppl_without"], rel=1e-6)
    assert h["skip_fraction"] > 0.01  # it does skip something
    assert sum(h["per_layer_kept"]) == sum(int(m.sum()) for m in masks.values())
    assert h["per_layer_kept"] == [int(m.sum()) for m in masks.values()]
    assert 0 <= h["false_negative_rate"] < 0.05 and h["mode"] == "conservative"
    assert h["calibration_sha256"] and h["n_layers"] == 6 and h["d_ffn"] == 512
    assert all(p["ok"] == (abs(p["change_pct"]) < 0.1) for p in h["search"])


def test_cli_aggressive_and_errors(lm, tmp_path):
    src = lm("falcon", activation="relu")
    runner = CliRunner()
    r = runner.invoke(main, ["sparsity-map", str(src), "--mode", "aggressive", "-o", str(tmp_path / "m")])
    assert r.exit_code == 2 and "--budget" in r.output
    r = runner.invoke(main, ["sparsity-map", str(src), "--calibration", str(tmp_path / "none.txt"),
                             "-o", str(tmp_path / "m")])
    assert r.exit_code == 4 and "not found" in r.output
    cal = tmp_path / "cal.txt"
    cal.write_text("\n\n".join(load_texts(limit=20)))
    r = runner.invoke(main, ["sparsity-map", str(src), "--calibration", str(cal), "--mode", "aggressive",
                             "--budget", "5", "-o", str(tmp_path / "m")])
    assert r.exit_code == 0, r.output
    header = json.loads((tmp_path / "m.json").read_text())
    assert header["budget_pct"] == 5.0 and abs(header["ppl_change_pct"]) < 5.0
    assert "false-negative rate" in r.output
    assert len(load_sparsity_map(tmp_path / "m.npz")) == 2
