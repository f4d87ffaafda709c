"""``aios-contract check`` on every architecture the toolchain exports and runs: the HF folder
(R1 measured through transformers) and our GGUF of it (R1 measured by executing the file in
aios-run) give the same exact-zero fractions, and the static checks read the right facts."""

from __future__ import annotations

import shutil

import pytest

from aios.models.aliases import FIXTURES_DIR
from contract.check import check_model
from convert.gguf import GGUFExportConfig, export_gguf
from tests.conftest import build_hf_model


def _r(report, rid):
    return next(r for r in report.requirements if r.id == rid)


def _metric(result, name):
    return next(m.value for m in result.metrics if m.name == name)


@pytest.mark.parametrize("kind", ["qwen2", "qwen3", "gemma2", "gemma3", "phi3", "mistral"])
def test_folder_and_gguf_agree(tmp_path, kind):
    src = build_hf_model(kind, tmp_path / f"tiny-{kind[:3]}", vocab_size=2048, hidden_act="relu",
                         **({"hidden_activation": "relu"} if kind.startswith("gemma") else {}))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(FIXTURES_DIR / "tiny-falcon" / f, src / f)
    gguf = tmp_path / "m.gguf"
    export_gguf(str(src), gguf, GGUFExportConfig("f32"))
    folder = check_model(str(src), samples=4, max_tokens=32)
    file = check_model(str(gguf), samples=4, max_tokens=32)
    a, b = _r(folder, "R1"), _r(file, "R1")
    assert a.evidence.value == b.evidence.value == "measured"
    za, zb = _metric(a, "mean_exact_zero_fraction"), _metric(b, "mean_exact_zero_fraction")
    assert za > 0.3 and abs(za - zb) <= 0.01  # ReLU on the gate of a random model: about half
    assert b.details["engine"].startswith("aios-run")
    for rid in ("R2", "R4"):  # analytic, from the same facts in both forms
        assert _r(folder, rid).status == _r(file, rid).status
        assert [m.value for m in _r(folder, rid).metrics] == [m.value for m in _r(file, rid).metrics]


def test_r2_reports_the_sliding_window_cache_as_information(tmp_path):
    """Gemma 3's five local layers of six keep at most 8 tokens: the smaller cache is shown as
    information; the verdict follows the contract's formula (every layer at the full context)."""
    src = build_hf_model("gemma3", tmp_path / "g3")
    r2 = _r(check_model(str(src), require=["R2"]), "R2")
    full = _metric(r2, "kv_bytes_at_4096")
    windowed = _metric(r2, "kv_bytes_at_4096_with_sliding_window")
    assert full == 6 * 2 * 32 * 4096 * 4  # L × H_kv × d_head × C × 4
    assert windowed == 5 * 2 * 32 * 8 * 4 + 1 * 2 * 32 * 4096 * 4
    note = next(m.note for m in r2.metrics if m.name == "kv_bytes_at_4096_with_sliding_window")
    assert "information only" in note
