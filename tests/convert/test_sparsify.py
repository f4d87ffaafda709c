"""aios-convert sparsify: calibrated FFN thresholds, the file they are written to, and aios-run
applying them (tiny fixtures; the real-model figures are in benchmarks/sparsify_curve.py)."""

from __future__ import annotations

import json

import gguf
import numpy as np
import pytest
from click.testing import CliRunner

from aios.errors import ExitCode, InvalidModelError, UsageError
from aios.models.aliases import FIXTURES_DIR
from convert.cli import main
from convert.sparsify import LEVELS, SparsifyConfig, allocate, sparsify

SMALL = dict(tokens=192, sensitivity_tokens=64, window=64, heldout_tokens=128)


@pytest.fixture(scope="module")
def ggufs(tmp_path_factory):
    """{(fixture, outtype): path} exported once for the module."""
    from convert.gguf import GGUFExportConfig, export_gguf

    root = tmp_path_factory.mktemp("sparsify-src")
    out = {}
    for fixture, outtype in (("tiny-llama", "f32"), ("tiny-llama", "q8_0"), ("tiny-falcon", "f32")):
        p = root / f"{fixture}-{outtype}.gguf"
        export_gguf(str(FIXTURES_DIR / fixture), p, GGUFExportConfig(outtype=outtype))
        out[(fixture, outtype)] = p
    return out


@pytest.fixture(scope="module")
def llama50(ggufs, tmp_path_factory):
    out = tmp_path_factory.mktemp("sparsify-out") / "llama50.gguf"
    return sparsify(ggufs[("tiny-llama", "f32")], out, SparsifyConfig(target=0.5, **SMALL))


def _tensors(path):
    r = gguf.GGUFReader(str(path))
    return {t.name: (t.tensor_type, bytes(np.asarray(t.data).tobytes())) for t in r.tensors}, r


def test_weights_are_copied_byte_for_byte_and_thresholds_added(ggufs, llama50):
    src_t, _ = _tensors(ggufs[("tiny-llama", "f32")])
    out_t, r = _tensors(llama50.output)
    assert src_t == out_t  # same names, same types, same bytes
    site = r.get_field("aios.ffn_threshold.site").contents()
    values = r.get_field("aios.ffn_threshold.values").contents()
    assert site == "down_in" == llama50.site  # the default (measured: best quality per zero)
    assert len(values) == 6 and all(v >= 0 for v in values) and not llama50.per_neuron
    assert llama50.target == 0.5 and np.mean(llama50.layer_sparsity) >= 0.5 - 1e-6
    json.loads(r.get_field("aios.ffn_threshold.calibration").contents())


def test_heldout_zero_fraction_is_measured_near_the_calibrated_one(llama50):
    h = llama50.heldout
    assert h["tokens_scored"] > 0 and h["ppl_sparse"] > 0 and h["ppl_dense"] > 0
    # measured by running the file with hooks, not copied from the calibration
    assert abs(h["mean_exact_zero_fraction"] - np.mean(llama50.layer_sparsity)) < 0.15


def test_runtime_applies_the_thresholds_and_sparse_mode_equals_dense(ggufs, llama50):
    from runtime.model import Model

    ids = list(range(5, 29))
    plain = Model(ggufs[("tiny-llama", "f32")], arithmetic="float").forward(ids, all_logits=True)
    dense = Model(llama50.output, mode="dense", arithmetic="float")
    d = dense.forward(ids, all_logits=True)
    assert dense.thresholds is not None
    assert not np.allclose(plain, d, atol=1e-4)  # the thresholds change the model
    sparse = Model(llama50.output, mode="sparse", arithmetic="float")
    s = sparse.forward(ids, all_logits=True)
    np.testing.assert_allclose(s, d, rtol=0, atol=2e-5 * np.abs(d).max())
    # and a decode step reads fewer weight bytes: the down rows of the cut neurons
    for m in (dense, sparse):
        m.counter.reset()
        m.forward([7])
    assert sparse.counter.totals["weights"] < dense.counter.totals["weights"]


def test_gate_site_cuts_per_neuron_and_skips_up_rows_too(ggufs, tmp_path):
    from runtime.model import Model

    out = tmp_path / "gate.gguf"
    res = sparsify(ggufs[("tiny-llama", "f32")], out, SparsifyConfig(target=0.5, site="gate", allocation="greedy",
                                                                       **SMALL))
    assert all(len(k) == 3 for k in res.calibration["sensitivity_kl"])  # measured KL per layer and level
    assert np.mean(res.layer_sparsity) >= 0.5 - 1e-6
    r = gguf.GGUFReader(str(out))
    assert r.get_field("aios.ffn_threshold.site").contents() == "gate" and res.per_neuron
    assert len(r.get_field("aios.ffn_threshold.values").contents()) == 6 * 352  # one per neuron
    ids = list(range(5, 29))
    dense, sparse = Model(out, mode="dense", arithmetic="float"), Model(out, mode="sparse", arithmetic="float")
    d, s = dense.forward(ids, all_logits=True), sparse.forward(ids, all_logits=True)
    np.testing.assert_allclose(s, d, rtol=0, atol=2e-5 * np.abs(d).max())
    for m in (dense, sparse):
        m.counter.reset()
        m.forward([7])
    up = [t for t in sparse.counter.per_tensor if "ffn_up" in t]
    assert sum(sparse.counter.per_tensor[t] for t in up) < sum(dense.counter.per_tensor[t] for t in up)


def test_decode_steps_apply_the_thresholds_too(llama50):
    """One-token steps take the compiled block path in dense mode unless thresholds are set."""
    from runtime.model import Model

    ids = list(range(5, 17))
    whole = Model(llama50.output, arithmetic="float").forward(ids, all_logits=True)[-1]
    m = Model(llama50.output, arithmetic="float")
    for t in ids:
        last = m.forward([t])[-1]
    np.testing.assert_allclose(last, whole, rtol=0, atol=1e-4 * np.abs(whole).max())


def test_quantized_source_with_sparse_down(ggufs, tmp_path):
    from runtime.model import Model

    out = tmp_path / "q8.gguf"
    res = sparsify(ggufs[("tiny-llama", "q8_0")], out, SparsifyConfig(target=0.6, sparse_down=True, **SMALL))
    out_t, r = _tensors(out)
    src_t, _ = _tensors(ggufs[("tiny-llama", "q8_0")])
    assert "blk.0.ffn_down.t" in out_t and "blk.0.ffn_down.weight" not in out_t
    assert {k: v for k, v in out_t.items() if ".ffn_down." not in k} == \
        {k: v for k, v in src_t.items() if ".ffn_down." not in k}
    assert out_t["blk.0.ffn_down.t"][0] == gguf.GGMLQuantizationType.Q8_0
    ids = list(range(3, 19))
    d = Model(out, mode="dense", arithmetic="float").forward(ids, all_logits=True)
    s = Model(out, mode="sparse", arithmetic="float").forward(ids, all_logits=True)
    np.testing.assert_allclose(s, d, rtol=0, atol=2e-5 * np.abs(d).max())
    assert res.heldout["mean_exact_zero_fraction"] > 0.4


def test_plain_mlp_cuts_the_down_input(ggufs, tmp_path):
    res = sparsify(ggufs[("tiny-falcon", "f32")], tmp_path / "f.gguf", SparsifyConfig(target=0.5, **SMALL))
    assert res.site == "down_in"
    with pytest.raises(UsageError, match="no gate"):
        sparsify(ggufs[("tiny-falcon", "f32")], tmp_path / "g.gguf", SparsifyConfig(target=0.5, site="gate", **SMALL))
    assert not (tmp_path / "g.gguf").exists()


def test_check_measures_r1_and_names_the_thresholds(ggufs, tmp_path):
    from contract.check import check_model

    out = tmp_path / "s80.gguf"
    sparsify(ggufs[("tiny-llama", "f32")], out, SparsifyConfig(target=0.85, heldout_tokens=0,
                                                                **{k: v for k, v in SMALL.items()
                                                                   if k != "heldout_tokens"}))
    r1 = next(r for r in check_model(str(out), samples=8, max_tokens=64).requirements if r.id == "R1")
    assert r1.status.value == "pass", r1.summary
    assert "threshold" in r1.summary and "threshold" in r1.details["zeros_from"]


# --- allocation (pure) ----------------------------------------------------------------------


def test_greedy_allocation_puts_sparsity_where_it_is_cheap():
    cost = np.vstack([LEVELS * 10.0, LEVELS * 1.0, LEVELS**2])
    idx = allocate(cost, 0.5, 0.95)
    levels = LEVELS[idx]
    assert levels.mean() >= 0.5 - 1e-9
    assert levels[0] < levels[1]  # the expensive layer gives up least
    assert levels.max() <= 0.95


def test_uniform_allocation_and_the_cap():
    cost = np.zeros((4, len(LEVELS)))
    assert set(LEVELS[allocate(cost, 0.5, 0.95, "uniform")]) == {0.5}
    assert LEVELS[allocate(cost, 0.9, 0.8)].max() <= 0.8  # capped even when the target cannot be met


# --- bad input --------------------------------------------------------------------------------


def test_bad_options_and_files_are_one_sentence(ggufs, tmp_path):
    src = str(ggufs[("tiny-llama", "f32")])
    r = CliRunner().invoke(main, ["sparsify", src, "-o", str(tmp_path / "x.gguf"), "--target", "1.5"])
    assert r.exit_code == ExitCode.USAGE and "--target" in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(main, ["sparsify", str(tmp_path / "missing.gguf"), "-o", str(tmp_path / "x.gguf")])
    assert r.exit_code != 0 and "Traceback" not in r.output
    r = CliRunner().invoke(main, ["sparsify", src, "-o", src])
    assert r.exit_code == ExitCode.USAGE
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 12)
    r = CliRunner().invoke(main, ["sparsify", str(bad), "-o", str(tmp_path / "y.gguf")])
    assert r.exit_code == ExitCode.BAD_INPUT and "Traceback" not in r.output
    assert not (tmp_path / "x.gguf").exists() and not (tmp_path / "y.gguf").exists()


def test_an_interrupted_write_leaves_nothing(ggufs, tmp_path, monkeypatch):
    from convert.gguf.writer import FileSlice

    def boom(*_a, **_k):
        raise KeyboardInterrupt

    monkeypatch.setattr(FileSlice, "tofile", boom)
    out = tmp_path / "o" / "x.gguf"
    with pytest.raises(KeyboardInterrupt):
        sparsify(ggufs[("tiny-llama", "f32")], out, SparsifyConfig(target=0.5, heldout_tokens=0,
                                                                    **{k: v for k, v in SMALL.items()
                                                                       if k != "heldout_tokens"}))
    assert list(out.parent.iterdir()) == []


def test_a_file_with_unusable_thresholds_is_refused(llama50, tmp_path):
    from convert.gguf import RawTensor, rewrite_gguf
    from runtime.model import Model

    r = gguf.GGUFReader(str(llama50.output))
    out = tmp_path / "lying.gguf"
    rewrite_gguf(r, out, [RawTensor.copied(llama50.output, t) for t in r.tensors],
                 {"aios.ffn_threshold.values": [0.1, 0.2]}, skip=lambda k: k == "aios.ffn_threshold.values")
    with pytest.raises(InvalidModelError, match="aios.ffn_threshold.values"):
        Model(out, arithmetic="float")


def test_cli_json(ggufs, tmp_path):
    out = tmp_path / "c.gguf"
    r = CliRunner().invoke(main, ["sparsify", str(ggufs[("tiny-llama", "f32")]), "-o", str(out), "--target", "0.4",
                                  "--tokens", "128", "--heldout-tokens", "64", "--json", "-q"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["target"] == 0.4 and d["site"] == "down_in" and out.is_file()


# --- --scope all: the inputs of every projection ------------------------------------------------


@pytest.fixture(scope="module")
def llama_all(ggufs, tmp_path_factory):
    out = tmp_path_factory.mktemp("sparsify-all") / "llama-all.gguf"
    return sparsify(ggufs[("tiny-llama", "q8_0")], out, SparsifyConfig(target=0.5, scope="all", **SMALL))


def test_scope_all_cuts_every_input_site_and_measures_them_held_out(ggufs, llama_all):
    from runtime.model import Model
    from runtime.thresholds import INPUT_SITES

    src_t, _ = _tensors(ggufs[("tiny-llama", "q8_0")])
    out_t, r = _tensors(llama_all.output)
    assert src_t == out_t  # the weights as they were
    for site in INPUT_SITES:
        v = r.get_field(f"aios.input_threshold.{site}").contents()
        assert len(v) == 6 and all(x > 0 for x in v) and v == pytest.approx(llama_all.input_thresholds[site])
    h = llama_all.heldout
    assert set(h["site_exact_zero_fraction"]) == {*INPUT_SITES, "down_in"}
    for site, f in h["site_exact_zero_fraction"].items():  # measured on held-out text, near the target
        assert abs(f - 0.5) < 0.15, (site, f)
    assert abs(h["model_wide_zero_fraction"] - 0.5) < 0.15
    ids = list(range(5, 29))
    m = Model(llama_all.output, arithmetic="int8")
    assert m.input_cuts is not None and all(g.cuts == (*INPUT_SITES, "down_in") for g in m.blocks)
    cut = m.forward(ids, all_logits=True)
    m.input_cuts = None  # the FFN cut alone
    m.reset()
    assert not np.array_equal(cut, m.forward(ids, all_logits=True))


def test_unusable_input_thresholds_are_refused(llama_all, tmp_path):
    from convert.gguf import RawTensor, rewrite_gguf
    from runtime.model import Model

    r = gguf.GGUFReader(str(llama_all.output))
    out = tmp_path / "lying.gguf"
    key = "aios.input_threshold.attn_in"
    rewrite_gguf(r, out, [RawTensor.copied(llama_all.output, t) for t in r.tensors], {key: [0.1, -1.0]},
                 skip=lambda k: k == key)
    with pytest.raises(InvalidModelError, match=key):
        Model(out, arithmetic="int8")
    with pytest.raises(UsageError, match="--scope"):
        SparsifyConfig(scope="attention").check(gated=True)


def test_target_r1_aims_above_the_floor_on_held_out_texts(ggufs, tmp_path):
    import json as _json
    from pathlib import Path

    import contract
    from convert.sparsify.config import R1_FLOOR, R1_MARGIN

    spec = _json.loads((Path(contract.__file__).parent / "spec" / "contract-1.0.json").read_text())
    assert spec["requirements"]["R1"]["min_mean_zero_fraction"] == R1_FLOOR  # the contract's own floor
    out = tmp_path / "r1.gguf"
    r = CliRunner().invoke(main, ["sparsify", str(ggufs[("tiny-llama", "f32")]), "-o", str(out), "--target", "r1",
                                  "--tokens", "192", "--heldout-tokens", "0", "--json", "-q"])
    assert r.exit_code == 0, r.output
    aim = _json.loads(r.stdout)["calibration"]["r1_aim"]
    last = aim["rounds"][-1]
    assert last["heldout_zero_fraction"] >= R1_FLOOR + R1_MARGIN - 1e-3  # measured, on texts calibration never saw
    assert aim["rounds"][0]["target"] == pytest.approx(R1_FLOOR + R1_MARGIN)
    r = CliRunner().invoke(main, ["sparsify", str(ggufs[("tiny-llama", "f32")]), "-o", str(out), "--target", "most"])
    assert r.exit_code == ExitCode.USAGE and "--target" in r.output and "Traceback" not in r.output


def test_site_allocation_puts_zeros_where_they_cost_least_per_byte():
    from convert.sparsify.sites import SITE_LEVELS, allocate_sites

    cheap, dear = np.array([0.001, 0.002, 0.004, 0.01]), np.array([0.1, 0.3, 0.9, 3.0])
    assert len(cheap) == len(SITE_LEVELS)
    nbytes = {"attn_in": 100, "attn_out": 100, "ffn_in": 400, "down_in": 400}
    f = allocate_sites({"attn_in": dear, "attn_out": dear, "ffn_in": cheap, "down_in": cheap}, nbytes, 0.5, 0.95)
    wide = sum(f[s] * nbytes[s] for s in f) / sum(nbytes.values())
    assert wide >= 0.5 - 1e-9 and f["down_in"] > f["attn_in"] and f["ffn_in"] > f["attn_out"]
    assert max(f.values()) <= 0.95


def test_scope_all_greedy_measures_each_site_and_reaches_the_model_wide_target(ggufs, tmp_path):
    r = sparsify(ggufs[("tiny-llama", "q8_0")], tmp_path / "g.gguf",
                 SparsifyConfig(target=0.5, scope="all", allocation="greedy", **SMALL))
    c = r.calibration
    assert set(c["site_kl"]) == {"attn_in", "attn_out", "ffn_in", "down_in"}
    f = c["site_fractions"]
    assert len(set(f.values())) > 1  # not uniform: measured per site
    assert abs(r.heldout["model_wide_zero_fraction"] - 0.5) < 0.15
