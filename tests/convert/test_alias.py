"""aios-convert alias: the ratio definition, encoders, analysis, the written format, the loader, R3, errors."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from aios.models import alias_format as af
from aios.models import resolve_model
from aios.models.aliases import FIXTURES_DIR
from convert.alias import posthoc as A
from convert.cli import main


pytestmark = pytest.mark.usefixtures("one_thread")  # see tests/conftest.py


def build_alias_folder(src, out, *, zones="all", delta="lowrank:8", types=None):
    """An aliased folder without perplexity measurement (fast; for format/runtime tests)."""
    h = resolve_model(str(src))
    cfg = A.AliasConfig(zones=zones, delta=delta, types=types, min_cosine=0.0, require_bytes_saved=False)
    enc, rank = A.parse_delta(delta)
    built = []
    for ta in A.analyse(h, cfg):
        names = {i: h.arch.block(i, ta.type) for i in ta.members}
        W = {i: h.tensor(names[i]).float().numpy() for i in ta.members}
        canon = np.mean([W[i] for i in ta.members], 0).astype(np.float32)
        built.append(A.build_group(ta.type, W, canon, names, enc, rank, "mean"))
    A.write_folder(h, out, built, {"mode": "test", "perplexity_delta": 0.5, "heldout_perplexity": 1.0,
                                   "source_heldout_perplexity": 0.5})
    return out


# --- the ratio definition (pure) ---------------------------------------------------------------


def test_aliasing_ratio_charges_canonical_pro_rata():
    # 6 layers, one aliased type (B = 600 B) shared by all 6 with 60 B deltas, one plain type (B = 400 B)
    members = tuple(af.Member(i, f"w{i}", "lowrank", (f"d{i}",), 1) for i in range(6))
    g = af.Group("t", "can", members)
    sizes = {"can": 600, **{f"d{i}": 60 for i in range(6)}}
    r = af.aliasing_ratio([g], sizes.__getitem__, lambda layer, t: 400 if t == "u" else None,
                          core=[2, 3], n_layers=6, types=["t", "u"])
    saved = 600 - 600 / 6 - 60  # per member
    assert r.core_bytes == 2 * (600 + 400) and r.model_bytes == 6 * 1000
    assert r.core_ratio == pytest.approx(2 * saved / 2000)
    assert r.model_ratio == pytest.approx(6 * saved / 6000)
    # the same group confined to the core zone can save at most half of it (the canonical costs 1/2)
    g2 = af.Group("t", "can", members[2:4])
    r2 = af.aliasing_ratio([g2], sizes.__getitem__, lambda layer, t: 600 if t == "t" else None,
                           core=[2, 3], n_layers=6, types=["t"])
    assert r2.core_ratio == pytest.approx((2 * (600 - 300 - 60)) / 1200)
    assert r2.core_ratio < 0.5


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 4), st.integers(1, 3), st.integers(0, 10_000))
def test_q8_quantize_matches_gguf_and_requantizes_exactly(rows, blocks, seed):
    from gguf import GGMLQuantizationType, dequantize, quants

    x = np.random.default_rng(seed).standard_normal((rows, 32 * blocks)).astype(np.float32)
    q, s = af.q8_quantize(x)
    assert q.dtype == np.int8 and s.dtype == np.float16 and s.shape == (rows, blocks)
    raw = quants.quantize(x, GGMLQuantizationType.Q8_0)
    y = af.q8_dequantize(q, s)
    np.testing.assert_array_equal(y, dequantize(raw, GGMLQuantizationType.Q8_0).reshape(x.shape))
    # the GGUF writer re-quantizes the dequantized values: it must reproduce the same blocks
    np.testing.assert_array_equal(quants.quantize(y, GGMLQuantizationType.Q8_0), raw)


def test_lowrank_encoding_is_exact_for_low_rank_deltas_and_truncates_otherwise():
    rng = np.random.default_rng(0)
    d = (rng.standard_normal((40, 3)) @ rng.standard_normal((3, 24))).astype(np.float32)
    u, v = A.encode_delta(d, "lowrank", 3)
    assert u.shape == (40, 3) and v.shape == (3, 24)
    np.testing.assert_allclose(u @ v, d, atol=1e-5)
    full = rng.standard_normal((40, 24)).astype(np.float32)
    u, v = A.encode_delta(full, "lowrank", 4)
    s = np.linalg.svd(full, compute_uv=False)
    assert np.linalg.norm(full - u @ v) == pytest.approx(np.sqrt((s[4:] ** 2).sum()), rel=1e-4)
    assert A.encode_delta(full, "none", None) == [] and A.decode_delta([], "none") is None


def test_canonical_stats_mean_and_medoid_match_direct_computation():
    rng = np.random.default_rng(1)
    W = rng.standard_normal((5, 30))
    W[1:4] += 3 * rng.standard_normal(30)  # layers 1..3 share a large common part
    G = W @ W.T
    cos, rel, j = A.canonical_stats(G, [1, 2, 3], "mean")
    mean = W[[1, 2, 3]].mean(0)
    for i in range(5):
        assert cos[i] == pytest.approx(W[i] @ mean / np.linalg.norm(W[i]) / np.linalg.norm(mean))
        assert rel[i] == pytest.approx(np.linalg.norm(W[i] - mean) / np.linalg.norm(mean))
    _, _, j = A.canonical_stats(G, [1, 2, 3], "medoid")
    cost = [sum(np.linalg.norm(W[i] - W[c]) ** 2 for i in (1, 2, 3)) for c in (1, 2, 3)]
    assert j == (1, 2, 3)[int(np.argmin(cost))]
    assert A.select_members(G, [0, 1, 2, 3, 4], {i: 0.9 for i in range(5)}, "mean") == [1, 2, 3]


def test_zone_thresholds_reject_every_type_of_the_fixture():
    """tiny-falcon's layers are far apart (cosine to the core mean ≈ 0.7 < 0.95): post-hoc aliases nothing."""
    h = resolve_model("tiny-falcon")
    analysis = A.analyse(h, A.AliasConfig())
    assert len(analysis) == 4 and all(a.rejected and "threshold" in a.rejected for a in analysis)
    assert all(a.zone == [2, 3] for a in analysis)
    # dense deltas never pass the bytes-saved condition
    forced = A.analyse(h, A.AliasConfig(delta="dense", min_cosine=0.0))
    assert all("would not be smaller" in a.rejected for a in forced)


# --- the written folder, the loader and R3 ---------------------------------------------------------


@pytest.fixture(scope="module")
def aliased_llama(tmp_path_factory):
    out = tmp_path_factory.mktemp("alias") / "tiny-llama-alias"
    return build_alias_folder(FIXTURES_DIR / "tiny-llama", out, delta="q8_0", types=("q_proj", "up_proj", "o_proj"))


def test_folder_stores_each_canonical_once_and_records_members(aliased_llama):
    h = resolve_model(str(aliased_llama))
    inv = h.store.inventory
    groups = af.groups_of(h)
    assert [short for short in sorted(A.short_name(g.type) for g in groups)] == ["o_proj", "q_proj", "up_proj"]
    for g in groups:
        assert g.canonical in inv and len(g.members) == 6
        for m in g.members:
            assert m.weight not in inv  # the duplicate is dropped, recorded in the metadata
            assert all(t in inv for t in m.tensors) and inv[m.tensors[0]].dtype == "I8"
    assert "model.layers.0.mlp.gate_proj.weight" in inv  # un-aliased types stay as they were
    report = json.loads((aliased_llama / af.SIDECAR).read_text())
    assert report["aliasing"]["core_aliasing_ratio"] == pytest.approx(af.ratio_of(h).core_ratio, abs=1e-6)


def test_loader_materializes_canonical_plus_delta(aliased_llama):
    h = resolve_model(str(aliased_llama))
    model = h.load_torch(dtype="float32")
    src = resolve_model("tiny-llama")
    for g in af.groups_of(h):
        Wc = h.tensor(g.canonical).float().numpy()
        for m in g.members:
            q, s = (h.tensor(t).numpy() for t in m.tensors)
            want = Wc + af.q8_dequantize(q, s)
            got = model.get_parameter(m.weight).detach().numpy()
            np.testing.assert_array_equal(got, want)
            orig = src.tensor(m.weight).float().numpy()  # q8_0 deltas: close to the original
            assert np.linalg.norm(got - orig) / np.linalg.norm(orig) < 0.02
    # un-aliased weights are loaded unchanged
    np.testing.assert_array_equal(model.get_parameter("model.layers.1.mlp.down_proj.weight").detach().numpy(),
                                  src.tensor("model.layers.1.mlp.down_proj.weight").numpy())


def test_r3_recognises_the_alias_format(aliased_llama):
    from aios.data import load_texts
    from contract.checks import r3_aliasing
    from contract.checks.base import CheckContext
    from contract.result import Evidence, Status

    h = resolve_model(str(aliased_llama))
    r = r3_aliasing.check(h, CheckContext(calibration_texts=load_texts(limit=1)))
    ratio = af.ratio_of(h)
    assert r.metric("aliasing_ratio").value == pytest.approx(ratio.core_ratio, abs=1e-6)
    assert r.metric("aliasing_ratio").evidence == Evidence.measured
    assert r.metric("perplexity_delta").evidence == Evidence.declared and r.metric("perplexity_delta").value == 0.5
    norms = af.delta_norms(h, af.groups_of(h))
    assert r.metric("max_rel_delta_norm").value == pytest.approx(max(n["rel_delta_norm"] for n in norms
                                                                     if n["layer"] in (2, 3)))
    # 3 of 7 types aliased with q8_0 deltas: far below 0.70, and the deltas are the full differences
    assert r.status == Status.failed and ratio.core_ratio < 0.7 and "fails" in r.summary


# --- errors ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("args, code, text", [
    (["--delta", "lowrank:0"], 2, "rank R ≥ 1"),
    (["--delta", "fp4"], 2, "--delta must be"),
    (["--zones", "4-2"], 2, "--zones must be"),
    (["--types", "nonexistent"], 2, "not a shareable matrix"),
    (["--steps", "5"], 2, "need --train"),
    (["--train", "--budget-ppl", "1"], 2, "post-hoc"),
    (["--budget-ppl", "-1"], 2, "≥ 0"),
])
def test_bad_options_are_one_clean_error(tmp_path, args, code, text):
    r = CliRunner().invoke(main, ["alias", "tiny-falcon", "-o", str(tmp_path / "out"), *args])
    assert r.exit_code == code, r.output
    assert text in r.output and "Traceback" not in r.output
    assert not (tmp_path / "out").exists()


def test_bad_inputs_exit_4(tmp_path, aliased_llama, gguf_file):
    runner = CliRunner()
    # a GGUF is aliased from its dequantized twin: this one's tensors do not match its config
    r = runner.invoke(main, ["alias", str(gguf_file()), "-o", str(tmp_path / "o1")])
    assert r.exit_code == 4 and "transformers could not load" in r.output
    r = runner.invoke(main, ["alias", str(aliased_llama), "-o", str(tmp_path / "o2")])
    assert r.exit_code == 4 and "already aliased" in r.output
    r = runner.invoke(main, ["alias", str(tmp_path / "missing"), "-o", str(tmp_path / "o3")])
    assert r.exit_code == 4
    (tmp_path / "exists").mkdir()
    r = runner.invoke(main, ["alias", "tiny-falcon", "-o", str(tmp_path / "exists")])
    assert r.exit_code == 2 and "already exists" in r.output


def test_broken_alias_record_is_a_clean_error(tmp_path, aliased_llama):
    from safetensors.torch import load_file, save_file

    bad = tmp_path / "bad"
    bad.mkdir()
    for p in aliased_llama.iterdir():
        (bad / p.name).write_bytes(p.read_bytes())
    sd = load_file(bad / "model.safetensors")
    save_file(sd, bad / "model.safetensors", metadata={"format": "pt", af.HF_METADATA_KEY: "[{\"type\": 1}]"})
    r = CliRunner().invoke(main, ["gguf", str(bad), "-o", str(tmp_path / "x.gguf")])
    from aios.errors import InvalidModelError

    with pytest.raises(InvalidModelError, match="invalid alias record"):
        af.groups_of(resolve_model(str(bad)))
    assert "Traceback" not in r.output


# --- end to end: the CLI (post-hoc with GGUF outputs), the perplexity budget, a short trained run -----


@pytest.mark.slow  # 25-60 s on the shared box (perplexity evaluations)
def test_cli_post_hoc_writes_folder_and_both_ggufs(tmp_path):
    out = tmp_path / "out"
    r = CliRunner().invoke(main, ["alias", "tiny-falcon", "-o", str(out), "--zones", "all", "--delta", "none",
                                  "--min-cosine", "0", "--types", "dense", "--gguf", str(tmp_path / "a.gguf"),
                                  "--dealias", str(tmp_path / "d.gguf")])
    assert r.exit_code == 0, r.output
    rep = json.loads((out / af.SIDECAR).read_text())
    assert "aliasing ratio (measured from the written tensors)" in r.output
    assert f"{rep['heldout_perplexity']:.3f}" in r.output and (tmp_path / "a.gguf").is_file()
    assert (tmp_path / "d.gguf").is_file()
    # dense (128 x 128) shared by 6 layers with no deltas: each member saves 5/6 of its matrix
    B = 128 * 128 * 4
    assert rep["aliasing"]["core_bytes_saved"] == round(2 * (B - B / 6))
    assert rep["zone_thresholds"] == {str(i): 0.0 for i in range(6)}
    a = resolve_model(str(tmp_path / "a.gguf"))
    assert a.store.field("aios.alias.perplexity_delta") == pytest.approx(rep["perplexity_delta"], abs=1e-4)
    assert json.loads(a.store.field("aios.alias.zone_thresholds")) == rep["zone_thresholds"]


@pytest.mark.slow  # 25-60 s on the shared box (perplexity evaluations)
def test_budget_keeps_only_types_within_the_measured_perplexity_budget(tmp_path):
    res = A.alias("tiny-falcon", tmp_path / "out",
                  A.AliasConfig(zones="all", delta="lowrank:32", min_cosine=0.0, budget_ppl=3.0))
    rep = res.report
    kept = [a for a in rep["analysis"] if a["aliased"]]
    dropped = [a for a in rep["analysis"] if not a["aliased"]]
    assert rep["perplexity_delta"] <= 3.0
    assert len(rep["groups"]) == len(kept) and dropped  # all four together cost +12 (frontier), so some go
    assert all("exceeds the budget" in a["rejected"] for a in dropped)


@pytest.mark.slow  # 25-60 s on the shared box (perplexity evaluations)
def test_short_trained_run_keeps_deltas_inside_the_projection_radius(tmp_path):
    from convert.alias.train import AliasTrainConfig, train_alias

    cfg = AliasTrainConfig(zones="1-4", delta="lowrank:2", types=("dense",), steps=4, batch=2, seq_len=16, warmup=1)
    res = train_alias("tiny-falcon", tmp_path / "t", cfg)
    rep = res.report
    assert rep["mode"] == "trained" and rep["config"]["steps"] == 4 and len(rep["training_log"]) >= 2
    assert max(n["rel_delta_norm"] for n in rep["delta_norms"]) <= 0.09 + 1e-6
    h = resolve_model(str(tmp_path / "t"))
    (g,) = af.groups_of(h)
    assert [m.layer for m in g.members] == [1, 2, 3, 4] and all(m.rank == 2 for m in g.members)
    # the stored model is the one whose perplexity was measured
    from aios.evaluation import pydoc_split
    from convert import evaluation as ev

    ppl = ev.heldout_perplexity(h.load_torch(dtype="float32"), pydoc_split(h.load_tokenizer(), "heldout"))
    assert ppl == pytest.approx(rep["heldout_perplexity"], abs=1e-3)


def test_same_input_gives_byte_identical_outputs(tmp_path):
    from convert.alias.export import export_alias_gguf

    outs = [build_alias_folder(FIXTURES_DIR / "tiny-falcon", tmp_path / f"run{k}" / "out", delta="lowrank:4",
                               types=("dense",)) for k in (1, 2)]  # same name: the GGUF records it
    for p in sorted(outs[0].iterdir()):
        assert p.read_bytes() == (outs[1] / p.name).read_bytes(), p.name
    ggufs = [export_alias_gguf(o, o.parent / "a.gguf").output.read_bytes() for o in outs]
    assert ggufs[0] == ggufs[1]


def test_cli_exports_an_already_aliased_folder_without_o(tmp_path):
    fixture = FIXTURES_DIR / "tiny-falcon-alias"
    r = CliRunner().invoke(main, ["alias", str(fixture), "--gguf", str(tmp_path / "a.gguf"),
                                  "--dealias", str(tmp_path / "d.gguf")])
    assert r.exit_code == 0, r.output
    assert "aliased; runs in aios-run" in r.output and "llama.cpp loads it" in r.output
    assert af.groups_of(resolve_model(str(tmp_path / "a.gguf"))) and not af.groups_of(resolve_model(str(tmp_path / "d.gguf")))
    r = CliRunner().invoke(main, ["alias", "tiny-falcon"])
    assert r.exit_code == 2 and "Pass -o OUT" in r.output
    r = CliRunner().invoke(main, ["alias", "tiny-falcon", "--gguf", str(tmp_path / "x.gguf")])
    assert r.exit_code == 4 and "no alias groups" in r.output and not (tmp_path / "x.gguf").exists()


def test_render_names_a_neuron_major_gguf(tmp_path, capsys):
    """``alias -o OUT --gguf F --sparse-down``: the line for F says its down projections are
    neuron-major (the export-only path's line says so too)."""
    from convert.alias.cli import render_alias

    rep = {"mode": "post-hoc", "groups": [], "source_heldout_perplexity": 10.0, "heldout_perplexity": 10.5,
           "perplexity_delta": 0.5,
           "aliasing": {"core_aliasing_ratio": 0.5, "core_bytes": 100, "model_aliasing_ratio": 0.25}}
    for sparse, want in ((True, "aliased, FFN down projections neuron-major (--sparse-down)"), (False, "(aliased;")):
        res = A.AliasResult(tmp_path, A.AliasConfig(), rep, gguf=tmp_path / "a.gguf", gguf_sparse_down=sparse)
        render_alias(res)
        out = capsys.readouterr().out
        assert want in " ".join(out.split()), out


def test_render_prints_warnings_on_stderr(tmp_path, capsys):
    """The quality warning and the no-groups warning were printed on stdout with the result."""
    from convert.alias.cli import render_alias

    rep = {"mode": "post-hoc", "groups": [], "source_heldout_perplexity": 10.0, "heldout_perplexity": 50.0,
           "perplexity_delta": 40.0,
           "aliasing": {"core_aliasing_ratio": 0.0, "core_bytes": 100, "model_aliasing_ratio": 0.0}}
    res = A.AliasResult(tmp_path, A.AliasConfig(), rep, warnings=[A.no_groups_note(tmp_path)])
    render_alias(res)
    out, err = capsys.readouterr()
    err = " ".join(err.split())
    assert "warning: held-out perplexity is 5.00×" in err and "warning: no alias groups formed" in err
    assert "warning:" not in out and f"wrote {tmp_path}" in out


@pytest.mark.parametrize("sparse_down", [False, True])
def test_no_groups_writes_the_folder_and_says_why_no_gguf(tmp_path, sparse_down):
    """Aliasing that keeps every matrix (cosine threshold unreachable) still writes the folder;
    --gguf then says in one warning why no GGUF came out instead of 'run alias on it first'."""
    argv = ["alias", "tiny-falcon", "-o", str(tmp_path / "out"), "--zones", "core", "--min-cosine", "0.9999",
            "--gguf", str(tmp_path / "a.gguf")] + (["--sparse-down"] if sparse_down else [])
    r = CliRunner().invoke(main, argv)
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert "no alias groups formed" in text and "run aios-convert alias on it first" not in text
    assert not (tmp_path / "a.gguf").exists() and (tmp_path / "out" / af.SIDECAR).is_file()


def test_gpt2_aliases_with_its_short_position_table_and_refuses_sparse_down_first(tmp_path):
    """A GPT-2 whose learned positions end at 64 (< the 128-token perplexity windows) aliases:
    its held-out perplexity is measured in windows of its own length (128 crashed in the position
    embedding, a traceback). ``--sparse-down`` with ``--gguf`` is refused before any aliasing:
    its Conv1D down projections have no neuron-major layout; nothing is written."""
    from tests.conftest import build_hf_model

    src = build_hf_model("gpt2", tmp_path / "tiny-gpt", vocab_size=2048, n_layer=4)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(FIXTURES_DIR / "tiny-falcon" / f, src / f)
    argv = ["alias", str(src), "-o", str(tmp_path / "out"), "--zones", "core", "--min-cosine", "0"]
    r = CliRunner().invoke(main, argv + ["--gguf", str(tmp_path / "a.gguf"), "--sparse-down"])
    assert r.exit_code == 2 and "--sparse-down is not available for gpt2" in " ".join(r.output.split())
    assert not (tmp_path / "out").exists() and not (tmp_path / "a.gguf").exists()
    r = CliRunner().invoke(main, argv)
    assert r.exit_code == 0, r.output
    assert "held-out perplexity (measured)" in r.output and (tmp_path / "out" / af.SIDECAR).is_file()
