"""aios-convert svd-residual: the factorization math, the GGUF it writes, and its user errors."""

from __future__ import annotations

import json
from dataclasses import replace

import gguf
import numpy as np
import pytest
from click.testing import CliRunner

from convert.cli import main
from convert.svd_residual import (
    SvdResidualConfig,
    compress,
    nbytes_of,
    residual_layout,
    svd_residual,
    validate,
    whitening_factor,
)

# --- math --------------------------------------------------------------------------------


def _anisotropic(seed: int = 0, n_out: int = 96, n_in: int = 64, tokens: int = 4000):
    """W with a flat spectrum and inputs whose scales span ~4 orders of magnitude."""
    rng = np.random.default_rng(seed)
    W = rng.standard_normal((n_out, n_in))
    X = rng.standard_normal((tokens, n_in)) * np.logspace(-2, 2, n_in)
    return W, X


@pytest.mark.parametrize("rank", [4, 16])
def test_activation_aware_beats_plain_in_output_space(rank):
    W, X = _anisotropic()
    G = X.T @ X
    cfg = validate(SvdResidualConfig(rank=rank, residual="none", factor_type="f32"))
    aa = compress(W, replace(cfg, method="activation-aware"), G)
    plain = compress(W, replace(cfg, method="plain"), G)
    err = lambda c: np.linalg.norm((W - _dense(c)) @ X.T)  # noqa: E731  ‖(W − Ŵ)Xᵀ‖
    assert err(aa) < 0.7 * err(plain)
    assert aa.output_sqnr_db > plain.output_sqnr_db + 3
    assert plain.sqnr_db > aa.sqnr_db  # plain is the better fit of W itself: the point is the output


def _dense(c) -> np.ndarray:
    """Reconstruction from the stored arrays with gguf-py's own dequantizers."""
    from gguf import quants

    def deq(arr, t, shape):
        if t in ("f32", "f16"):
            return np.asarray(arr, np.float64).reshape(shape)
        return quants.dequantize(np.asarray(arr), gguf.GGMLQuantizationType[t.upper()]).reshape(
            (shape[0], -1) if len(shape) == 2 else (-1,)).astype(np.float64)

    u, v = (deq(*c.tensors[k]) for k in ("lr_u", "lr_v"))
    W = u @ v
    if "residual" in c.tensors:
        W = W + deq(*c.tensors["residual"]).reshape(W.shape)
    return W


def test_whitening_survives_a_singular_gram():
    W, X = _anisotropic(1)
    X[:, 5] = 0  # a dead input: XᵀX is singular
    X[:, 7] = X[:, 8]  # and two identical inputs
    L, eps = whitening_factor(X.T @ X)
    assert eps > 0 and np.all(np.isfinite(L))
    c = compress(W, validate(SvdResidualConfig(rank=8, residual="q8_0")), X.T @ X)
    assert np.isfinite(c.sqnr_db)


@pytest.mark.parametrize("residual", ["q4_0", "q8_0", "q2_k", "q4_k", "none"])
def test_bpw_budget_is_the_largest_rank_that_fits(residual):
    rng = np.random.default_rng(2)
    W = rng.standard_normal((128, 256))
    cfg = validate(SvdResidualConfig(bpw=10.0, method="plain", residual=residual))
    c = compress(W, cfg)
    assert c.bits_per_weight <= 10.0
    per_rank_bits = 8 * 2 * (128 + 256) / W.size  # one more f16 column of U and row of V
    assert c.bits_per_weight + per_rank_bits > 10.0
    assert c.tensors["lr_u"][0].shape == (128, c.rank)


def test_energy_rule_and_full_rank_reconstruct():
    rng = np.random.default_rng(3)
    W = rng.standard_normal((64, 32)) @ np.diag(np.logspace(0, -3, 32)) @ rng.standard_normal((32, 32))
    c = compress(W, validate(SvdResidualConfig(energy=0.99, method="plain", residual="none")))
    s = np.linalg.svd(W, compute_uv=False) ** 2
    assert c.energy_kept >= 0.99 and s[: c.rank - 1].sum() / s.sum() < 0.99
    full = compress(W, validate(SvdResidualConfig(rank="full", method="plain", residual="none", factor_type="f32")))
    assert full.rank == 32 and full.sqnr_db > 100


def test_residual_layouts_and_declared_fallbacks():
    assert residual_layout(128, 128, "q2_k")[:2] == ("q2_k", "flat")  # 2 rows per super-block
    assert residual_layout(352, 128, "q4_k")[:2] == ("q4_k", "flat")
    assert residual_layout(128, 352, "q4_0")[:2] == ("q4_0", "rows")
    kind, layout, why = residual_layout(3, 40, "q4_k")  # 120 values tile neither 256 nor 32-wide rows
    assert (kind, layout) == ("f16", "rows") and "do not tile" in why
    c = compress(np.random.default_rng(4).standard_normal((128, 128)),
                 validate(SvdResidualConfig(rank=8, method="plain", residual="q2_k")))
    arr, t, shape = c.tensors["residual"]
    assert t == "q2_k" and shape == (128 * 128,) and arr.nbytes == nbytes_of(128 * 128, "q2_k")
    assert abs(c.bits_per_weight - 8 * (2 * 8 * 256 + arr.nbytes) / 128**2) < 1e-9


# --- conversion ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def falcon_lr(tmp_path_factory):
    out = tmp_path_factory.mktemp("svd") / "falcon-lr.gguf"
    cfg = SvdResidualConfig(rank=8, method="plain", residual="q4_0", factor_type="q8_0", seed=1)
    return svd_residual("tiny-falcon", out, cfg), cfg


def test_gguf_layout_metadata_and_determinism(falcon_lr, tmp_path):
    result, cfg = falcon_lr
    r = gguf.GGUFReader(result.output)
    names = {t.name: t for t in r.tensors}
    assert "blk.0.attn_qkv.weight" not in names and "blk.0.ffn_down.weight" not in names
    u, v, res = names["blk.0.attn_qkv.lr_u"], names["blk.0.attn_qkv.lr_v"], names["blk.0.attn_qkv.residual"]
    assert [int(x) for x in u.shape] == [8, 192] and [int(x) for x in v.shape] == [128, 8]
    assert u.tensor_type.name == "F16"  # rank 8 cannot fill Q8_0 blocks: declared fallback
    assert v.tensor_type.name == "Q8_0" and res.tensor_type.name == "Q4_0"
    assert "token_embd.weight" in names and "blk.0.attn_norm.weight" in names
    field = lambda k: r.get_field(k).contents()  # noqa: E731
    assert field("aios.llama_cpp.loadable") is False
    assert field("aios.lowrank.method") == "plain" and field("aios.lowrank.selection") == "rank=8"
    assert field("aios.lowrank.ranks") == [8] * 24 and len(field("aios.lowrank.tensors")) == 24
    assert any("lr_u" in f and "F16" in f for f in field("aios.lowrank.fallbacks"))
    prov = json.loads(field("aios.provenance"))
    assert prov["command"] == "aios-convert svd-residual" and prov["converter_config"]["rank"] == 8
    again = svd_residual("tiny-falcon", tmp_path / "again.gguf", cfg)
    assert again.output.read_bytes() == result.output.read_bytes()
    assert [p.name for p in tmp_path.iterdir()] == ["again.gguf"]  # no scratch or temp left


def test_activation_aware_conversion_records_calibration(tmp_path):
    cfg = SvdResidualConfig(energy=0.9, residual="none", samples=8, max_tokens=32)
    res = svd_residual("tiny-llama", tmp_path / "aa.gguf", cfg)
    assert res.calibration["texts"] == 8 and 8 <= res.calibration["tokens"] <= 8 * 32
    assert all(r.energy_kept >= 0.9 and r.output_sqnr_db is not None for r in res.rows)
    assert {r.name.split(".", 2)[2] for r in res.rows} == {"attn_q", "attn_k", "attn_v", "attn_output",
                                                             "ffn_gate", "ffn_up", "ffn_down"}


def test_cli_writes_report_and_table(tmp_path):
    out = tmp_path / "m.gguf"
    res = CliRunner().invoke(main, ["svd-residual", "tiny-falcon", "-o", str(out), "--rank", "4",
                                    "--method", "plain", "--residual", "q2_k", "--eval-tokens", "0"])
    assert res.exit_code == 0, res.output
    assert "Q2_K flat" in res.output and "llama.cpp does not load it" in res.output
    rep = json.loads((tmp_path / "m.svd-residual.json").read_text())
    assert rep["selection"] == "rank=4" and len(rep["tensors"]) == 24 and rep["measured"] is None
    assert all(t["residual_type"] == "q2_k" for t in rep["tensors"])


def test_render_prints_fallbacks_and_warnings_on_stderr(falcon_lr, capsys):
    """svd-residual's fallback and warning lines were printed on stdout with the result table."""
    from dataclasses import replace

    from convert.lowrank.cli import render

    result, _ = falcon_lr
    rows = [replace(result.rows[0], notes=["120 values do not tile Q4_K -> F16"]), *result.rows[1:]]
    render(replace(result, rows=rows, warnings=["a warning"]))
    out, err = capsys.readouterr()
    assert f"fallback: {rows[0].name}: 120 values do not tile Q4_K -> F16" in err and "warning: a warning" in err
    assert "fallback:" not in out and "warning:" not in out and "wrote " in out


def test_user_errors_exit_cleanly(tmp_path, falcon_lr):
    out = tmp_path / "x.gguf"
    run = lambda *a: CliRunner().invoke(main, ["svd-residual", *a, "-o", str(out)])  # noqa: E731
    for args, code, text in [
        (("tiny-falcon", "--rank", "0"), 2, "--rank must be a positive integer"),
        (("tiny-falcon", "--rank", "abc"), 2, "--rank must be"),
        (("tiny-falcon", "--energy", "1.5"), 2, "--energy must be in (0, 1]"),
        (("tiny-falcon", "--rank", "4", "--energy", "0.9"), 2, "Choose one of"),
        (("tiny-falcon", "--residual", "q3_x"), 2, "Invalid value for '--residual'"),
        (("tiny-falcon", "--bpw", "0.5", "--method", "plain"), 2, "leaves no room"),
        ((str(falcon_lr[0].output),), 4, "is an aios-run file (low-rank + residual"),
        ((str(tmp_path / "missing"),), 4, ""),
    ]:
        res = run(*args)
        assert res.exit_code == code, (args, res.output)
        assert text in res.output and "Traceback" not in res.output
        assert not out.exists() and list(tmp_path.iterdir()) == []


def test_failed_conversion_leaves_nothing(tmp_path, monkeypatch):
    import convert.svd_residual as sr

    calls = []

    def boom(*a, **k):
        calls.append(1)
        if len(calls) > 3:
            raise RuntimeError("simulated crash mid-conversion")
        return real(*a, **k)

    real = sr.compress
    monkeypatch.setattr(sr, "compress", boom)
    with pytest.raises(RuntimeError):
        svd_residual("tiny-falcon", tmp_path / "y.gguf", SvdResidualConfig(rank=2, method="plain"))
    assert list(tmp_path.iterdir()) == []


def test_crash_while_writing_leaves_nothing(tmp_path, monkeypatch):
    calls = []
    real = gguf.GGUFWriter.write_tensor_data

    def flaky(self, tensor, *a, **k):
        calls.append(1)
        if len(calls) == 5:
            raise OSError("disk went away")
        return real(self, tensor, *a, **k)

    monkeypatch.setattr(gguf.GGUFWriter, "write_tensor_data", flaky)
    with pytest.raises(OSError):
        svd_residual("tiny-falcon", tmp_path / "z.gguf", SvdResidualConfig(rank=2, method="plain"))
    assert list(tmp_path.iterdir()) == []
