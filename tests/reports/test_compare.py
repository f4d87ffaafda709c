"""``aios-contract compare``: regressions between two real check reports, in every format."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from junitparser import JUnitXml

from aios.models.aliases import FIXTURES_DIR
from contract.check import check_model
from contract.cli import main
from contract.spec.manifest import real_layout
from aios.models import resolve_model
from reports.compare import FILE_NAMES, compare

RELUFIED = FIXTURES_DIR / "tiny-falcon-relu"  # written by aios-convert relufy once that lands


def run(*args):
    return CliRunner().invoke(main, ["compare", *args])


def dump(report, path: Path) -> Path:
    path.write_text(report.model_dump_json(indent=2))
    return path


def test_r1_regression_sparse_to_dense(falcon_report, sparse_falcon_report, tmp_path, sarif_validator):
    """Release N is the sparse ReLU variant (R1 passes, measured); N+1 is the GELU fixture."""
    assert {r.id: r.status.value for r in sparse_falcon_report.requirements}["R1"] == "pass"
    a, b = dump(sparse_falcon_report, tmp_path / "a.json"), dump(falcon_report, tmp_path / "b.json")
    out = tmp_path / "cmp"
    res = run(str(a), str(b), "--format", "text,md,json,junit,sarif,html", "-o", str(out))
    assert res.exit_code == 1, res.output
    assert "R1 Exact-zero FFN activations: pass → fail  [▼ regressed]" in res.output
    assert "tier down" in res.output and "REGRESSED: R1" in res.output
    c = json.loads((out / FILE_NAMES["json"]).read_text())
    assert c["regressions"] == ["R1"] and c["tier_change"] == "down" and c["exit_code"] == 1
    r1 = next(ch for ch in c["changes"] if ch["id"] == "R1")
    zero = next(m for m in r1["metrics"] if m["name"] == "mean_exact_zero_fraction")
    assert zero["a"] > 0.7 and zero["b"] < 0.01 and zero["delta"] == pytest.approx(zero["b"] - zero["a"])
    log = json.loads((out / FILE_NAMES["sarif"]).read_text())
    sarif_validator.validate(log)
    assert [(r["ruleId"], r["level"]) for r in log["runs"][0]["results"]] == [("R1", "error")]
    cases = [case for suite in JUnitXml.fromfile(str(out / FILE_NAMES["junit"])) for case in suite]
    assert [c.name for c in cases if not c.is_passed] == ["R1 Exact-zero FFN activations"]
    assert "▼ regressed" in (out / FILE_NAMES["md"]).read_text()
    assert '<section id="requirements">' in (out / FILE_NAMES["html"]).read_text()
    # the other way round is an improvement: exit 0
    res = run(str(b), str(a))
    assert res.exit_code == 0 and "▲ improved" in res.output and "tier up" in res.output
    # the comparison JSON renders again through `report`
    res = CliRunner().invoke(main, ["report", str(out / FILE_NAMES["json"]), "--format", "md", "-o", str(tmp_path / "again")])
    assert res.exit_code == 0 and (tmp_path / "again" / FILE_NAMES["md"]).is_file()


def test_r5_regression_manifest_removed(lm, tmp_path):
    """Two real reports of one model, with and without a correct frequency-ordered manifest."""
    folder = lm("gpt2")
    h = resolve_model(str(folder))
    blocks = [{"block_id": n, "access_frequency": "high", "rws_tier": "HOT", "offset_bytes": o, "size_bytes": s}
              for n, (o, s) in sorted(real_layout(folder, h).items(), key=lambda kv: kv[1][0])]
    (folder / "aios_manifest.json").write_text(json.dumps(
        {"aios_contract_version": "1.0", "frequency_ordered": True, "layout": blocks}))
    with_manifest = check_model(str(folder), samples=2, max_tokens=8)
    (folder / "aios_manifest.json").unlink()
    without = check_model(str(folder), samples=2, max_tokens=8)
    c = compare(with_manifest, without)
    assert c.regressions == ["R5"] and c.exit_code == 1
    assert {ch.id: ch.change for ch in c.changes}["R5"] == "regressed"
    assert compare(without, with_manifest).exit_code == 0
    assert compare(without, without).regressions == [] and not compare(without, without).notes


@pytest.mark.skipif(not RELUFIED.is_dir(), reason="needs aios/fixtures/tiny-falcon-relu from aios-convert relufy")
def test_r1_regression_relufied_vs_original(falcon_report):
    relufied = check_model(str(RELUFIED), samples=4, max_tokens=16)
    assert {r.id: r.status.value for r in relufied.requirements}["R1"] == "pass"
    assert compare(relufied, falcon_report).regressions[:1] == ["R1"]


@pytest.mark.slow
def test_r1_regression_after_real_relufy(tmp_path, falcon_report):
    """aios-convert relufy (a few steps) on the fixture, then compare against the original."""
    relufy = pytest.importorskip("convert.relufy")
    res = relufy.relufy("tiny-falcon", tmp_path / "relu", relufy.RelufyConfig(steps=4))
    relufied = check_model(str(res.out), samples=4, max_tokens=16)
    assert {r.id: r.status.value for r in relufied.requirements}["R1"] == "pass"
    c = compare(relufied, falcon_report)
    assert c.regressions == ["R1"] and c.exit_code == 1


def test_compare_errors(tmp_path, falcon_report):
    good = dump(falcon_report, tmp_path / "good.json")
    assert run(str(good), str(tmp_path / "missing.json")).exit_code == 4
    (tmp_path / "broken.json").write_text("{not json")
    res = run(str(good), str(tmp_path / "broken.json"))
    assert res.exit_code == 4 and "Traceback" not in res.output and "not JSON" in res.output
    (tmp_path / "bench.json").write_text(json.dumps({"tool": "aios-run bench", "rows": [], "baseline": {}}))
    assert run(str(good), str(tmp_path / "bench.json")).exit_code == 4
    invalid = json.loads(good.read_text())
    del invalid["tier"]
    (tmp_path / "invalid.json").write_text(json.dumps(invalid))
    res = run(str(good), str(tmp_path / "invalid.json"))
    assert res.exit_code == 4 and "tier" in res.output
    assert run(str(good), str(good), "--format", "pdf").exit_code == 2
