"""``aios-contract check``: exit codes as the CI gate, report files and their schemas."""

from __future__ import annotations

import json

import jsonschema
from click.testing import CliRunner
from junitparser import JUnitXml

from contract.cli import main
from contract.spec import SPEC_DIR
from reports.check_reports import schema_json


def run(*args):
    return CliRunner().invoke(main, ["check", *args])


def test_gate_exit_codes(lm, tmp_path):
    gelu = str(lm("falcon"))
    fast = ["--samples", "4", "--max-tokens", "16"]
    assert run(gelu, *fast, "--require-tier", "optimized").exit_code == 1
    assert run(gelu, *fast, "--require", "R2,R4").exit_code == 0
    assert run(gelu, *fast).exit_code == 0  # no gate requested
    assert run("relullama-7b", "--require", "R1").exit_code == 3  # measured, no weights
    assert run("falcon-7b", "--require-tier", "native").exit_code == 1  # R1 fails (declared GELU)
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x01" * 20)
    res = run(str(bad))
    assert res.exit_code == 4 and "Traceback" not in res.output
    assert run(gelu, "--require", "R9").exit_code == 2
    assert run(gelu, "--format", "pdf").exit_code == 2
    assert run(gelu, "--calibration", str(tmp_path / "missing.jsonl")).exit_code == 4


def test_reports_validate(lm, tmp_path):
    out = tmp_path / "reports"
    res = run(str(lm("falcon")), "--samples", "4", "--max-tokens", "16", "-o", str(out))
    assert res.exit_code == 0, res.output
    data = json.loads((out / "aios-report.json").read_text())
    jsonschema.validate(data, json.loads(schema_json()))
    assert {r["id"]: r["status"] for r in data["requirements"]}["R2"] == "pass"
    for r in data["requirements"]:
        for m in r["metrics"]:
            assert m["evidence"] in {"measured", "analytic", "declared", "projected"}
    xml = JUnitXml.fromfile(str(out / "aios-report.junit.xml"))
    cases = [c for suite in xml for c in suite]
    assert len(cases) == 5
    md = (out / "aios-report.md").read_text()
    assert "| R1" in md and "projected" in md.lower()
    assert not list(out.glob(".*tmp"))  # atomic writes leave no temp files


def test_committed_schema_is_current():
    assert (SPEC_DIR / "report.schema.json").read_text() == schema_json()


def test_missing_or_empty_model_is_a_usage_error():
    """`check $MODEL` with MODEL unset must not silently check the bundled model (issue 19.1)."""
    for args in ([], [""], ["  "]):
        res = run(*args, "--require", "R2")
        assert res.exit_code == 2, (args, res.output)
        assert "Traceback" not in res.output
    res = CliRunner().invoke(main, ["inspect", ""])
    assert res.exit_code == 2 and "MODEL is empty" in res.output


def test_empty_model_is_a_usage_error_in_the_library():
    import pytest

    from aios.errors import ExitCode, UsageError
    from aios.models import resolve_model

    with pytest.raises(UsageError) as e:
        resolve_model("")
    assert e.value.exit_code == ExitCode.USAGE


def test_zero_calibration_tokens_is_not_a_measurement(tmp_path, monkeypatch):
    """Issue 19.5: `{"text": ""}` is exit 4 with one sentence, never "measured 0.0 %" and exit 1."""
    empty = tmp_path / "empty.jsonl"
    empty.write_text('{"text": ""}\n', encoding="utf-8")
    res = run("tiny-falcon-relu", "--calibration", str(empty), "--require", "R1")
    assert res.exit_code == 4, res.output
    assert "error:" in res.output and "0.0" not in res.output and "Traceback" not in res.output
    # texts that tokenize to nothing (a tokenizer that drops them) are exit 3 from R1 itself
    import aios.measure.ffn as ffn

    real = ffn.measure_ffn_activity

    def no_tokens(handle, texts, **kw):
        return real(handle, [], **kw)

    monkeypatch.setattr("contract.checks.r1_sparsity.measure_ffn_activity", no_tokens)
    res = run("tiny-falcon-relu", "--samples", "2", "--require", "R1")
    assert res.exit_code == 3, res.output
    assert "no tokens" in res.output and "Traceback" not in res.output
