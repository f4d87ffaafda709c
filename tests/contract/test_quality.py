"""contract/quality.py and ``check --baseline``: the quality gate (issue 19.2)."""

from __future__ import annotations

import json

from click.testing import CliRunner

from contract.cli import main

FAST = ["--samples", "2", "--max-tokens", "16"]


def run(*args):
    return CliRunner().invoke(main, ["check", *args])


def test_baseline_measures_both_and_gates_on_the_ratio(tmp_path):
    """tiny-falcon-relu vs its source: 51.70 / 48.92 = 1.057, the numbers relufy recorded."""
    out = tmp_path / "r"
    res = run("tiny-falcon-relu", *FAST, "--baseline", "tiny-falcon", "--format", "json,md,html", "-o", str(out))
    assert res.exit_code == 0, res.output  # 1.057 ≤ 1.10 (default)
    q = json.loads((out / "aios-report.json").read_text())["quality"]
    assert q["evidence"] == "measured" and q["baseline"] == "tiny-falcon"
    assert abs(q["perplexity"] - 51.6955) < 0.01 and abs(q["baseline_perplexity"] - 48.917) < 0.01
    assert q["met"] is True and q["max_ratio"] == 1.10
    md = (out / "aios-report.md").read_text()
    assert "51.69" in md and "48.91" in md and "measured" in md
    assert "48.91" in (out / "aios-report.html").read_text()
    assert "51.69" in res.output and "48.91" in res.output
    # a tighter limit fails the gate with exit 1, whatever the tier
    res = run("tiny-falcon-relu", *FAST, "--baseline", "tiny-falcon", "--max-ppl-ratio", "1.05")
    assert res.exit_code == 1, res.output
    assert "perplexity ratio 1.057 > 1.05" in res.output


def test_unmeasurable_baseline_is_exit_3_and_bad_options_exit_2():
    res = run("tiny-falcon-relu", *FAST, "--baseline", "falcon-7b")  # an alias without weights
    assert res.exit_code == 3, res.output
    assert run("tiny-falcon-relu", "--baseline", "").exit_code == 2
    assert run("tiny-falcon-relu", "--baseline", "tiny-falcon", "--max-ppl-ratio", "0").exit_code == 2


def test_provenance_perplexities_are_declared(tmp_path):
    """Without --baseline a relufied folder shows the perplexities its card recorded, as declared,
    and they do not gate anything."""
    out = tmp_path / "r"
    res = run("tiny-falcon-relu", *FAST, "--format", "json", "-o", str(out))
    assert res.exit_code == 0, res.output
    q = json.loads((out / "aios-report.json").read_text())["quality"]
    assert q["evidence"] == "declared" and q["baseline"] == "tiny-falcon"
    assert q["perplexity"] == 51.6955 and q["baseline_perplexity"] == 48.917 and q["met"] is None
    assert "declared" in res.output
    q = json.loads(json.dumps(q))
    res = run("tiny-falcon-alias", *FAST, "--format", "json", "-o", str(out))
    q = json.loads((out / "aios-report.json").read_text())["quality"]
    assert q["evidence"] == "declared" and q["perplexity"] == 48.6321 and q["baseline_perplexity"] == 48.917
    res = run("tiny-falcon", *FAST, "--format", "json", "-o", str(out))
    assert json.loads((out / "aios-report.json").read_text())["quality"] is None


def test_gguf_perplexity_runs_in_the_runtime(tmp_path):
    """A GGUF's perplexity comes from running the file as stored (aios-run), not transformers'
    dequantizing loader: an f32 export of tiny-falcon-relu reproduces its card's 51.6955."""
    from convert.gguf import GGUFExportConfig, export_gguf

    gguf = tmp_path / "relu.gguf"
    export_gguf("tiny-falcon-relu", gguf, GGUFExportConfig("f32"))
    out = tmp_path / "r"
    res = run(str(gguf), *FAST, "--baseline", "tiny-falcon", "--format", "json", "-o", str(out))
    assert res.exit_code == 0, res.output
    q = json.loads((out / "aios-report.json").read_text())["quality"]
    assert q["evidence"] == "measured" and abs(q["perplexity"] - 51.6955) < 0.01 and q["met"] is True


def test_a_converted_gguf_names_its_source(tmp_path):
    """Without recorded perplexities a GGUF's provenance still names the source to compare with."""
    from contract.quality import declared_quality
    from convert.gguf import GGUFExportConfig, export_gguf

    from aios.models import resolve_model

    gguf = tmp_path / "q.gguf"
    export_gguf("tiny-falcon", gguf, GGUFExportConfig("q8_0"))
    q = declared_quality(resolve_model(str(gguf)))
    assert q is not None and q.evidence.value == "declared" and q.baseline == "tiny-falcon"
    assert q.perplexity is None and "--baseline tiny-falcon" in q.source
    res = run(str(gguf), *FAST)
    assert res.exit_code == 0 and "converted from tiny-falcon" in res.output
