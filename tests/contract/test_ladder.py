"""``aios-contract ladder``: rungs built, kept and resumed, every rung measured, the reports and
their schema, the gate's exit codes (the tiny-llama fixture, small token counts, no llama.cpp)."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
from click.testing import CliRunner

from aios.models.aliases import FIXTURES_DIR
from contract.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")

SMALL = ["--heldout-tokens", "64", "--decode-tokens", "4", "--rounds", "1", "--calibration-tokens", "128",
         "--calibration-samples", "2", "--no-llamacpp", "--threads", "1"]


def run(*args):
    return CliRunner().invoke(main, ["ladder", *map(str, args)])


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    from convert.gguf import GGUFExportConfig, export_gguf

    p = tmp_path_factory.mktemp("ladder-src") / "tiny-llama.q8_0.gguf"
    export_gguf(str(FIXTURES_DIR / "tiny-llama"), p, GGUFExportConfig("q8_0"))
    return p


@pytest.fixture(scope="module")
def ladder(source, tmp_path_factory):
    """The default tiers on the tiny model, run once for the module: (output folder, result)."""
    out = tmp_path_factory.mktemp("ladder") / "out"
    res = run(source, "-o", out, *SMALL)
    assert res.exit_code == 0, res.output
    return out, res


def test_every_rung_is_built_or_skipped_with_a_reason_and_measured(ladder):
    out, _ = ladder
    rep = json.loads((out / "ladder.json").read_text())
    names = [r["name"] for r in rep["rungs"]]
    assert names == ["dense", "sparsify", "alias", "svd-residual", "layout"]
    for r in rep["rungs"]:
        if r["status"] == "skipped":  # one sentence from the converter; the ladder goes on
            assert r["reason"] and r["measured"] is None and not (out / f"{r['name']}.record.json").exists()
            continue
        m = r["measured"]
        assert m["mb_per_token_total"] > 0 and m["evidence"] == "measured"
        assert m["mb_per_token"]["weights"] > 0 and m["weights_by_kind"]["head"] > 0
        assert m["decode_tok_s"] > 0 and m["perplexity"] > 0
        assert (out / r["artifact"]).is_file() or r["name"] == "dense"
        assert r["check"]["tier"] and r["check"]["projection"]["evidence"] == "projected"
        pm = r["projection_vs_measured"]
        assert {t["term"] for t in pm["terms"]} == {"weights", "kv_cache", "activations"}
        assert all(t["why"] for t in pm["terms"] if t["differs"])
    sp = rep["rungs"][1]
    assert sp["status"] == "built" and sp["measured"]["mode"] == "sparse"
    assert sp["measured"]["exact_zero_fraction"] > 0.1 and sp["reduction_vs_source"] > 0
    assert rep["rungs"][0]["reduction_vs_source"] == 0 and rep["rungs"][0]["ppl_ratio"] == 1
    # alias and svd-residual cannot take a sparse-down file: skipped, layout built on sparsify
    assert rep["rungs"][4]["built_on"] == "sparsify"
    rec = json.loads((out / "sparsify.record.json").read_text())
    assert rec["source_sha256"] == rep["source"]["sha256"] and rec["artifact_sha256"] == sp["sha256"]
    assert rec["settings"]["scope"] == "all" and rec["settings"]["sparse_down"] is True
    assert not list(out.glob(".building-*"))


def test_reports_validate_and_show_the_ladder(ladder):
    from contract.ladder.report import ladder_schema

    out, res = ladder
    rep = json.loads((out / "ladder.json").read_text())
    jsonschema.validate(rep, ladder_schema())
    assert rep["schema_version"] == "1" and rep["llamacpp"] is None
    html = (out / "ladder.html").read_text()
    assert 'id="ladder-plot"' in html and re.search(r'<img alt="ladder plot[^"]*" src="data:image/png;base64,', html)
    md = (out / "ladder.md").read_text()
    assert "| 1 sparsify |" in md and "MB/token projected" in md and "skipped" in md
    assert "| 0 dense |" in res.stdout  # the table on stdout; progress on stderr
    assert "[rung 1/4] sparsify" in res.stderr and "[rung" not in res.stdout


def test_rerun_resumes_and_the_gate_fails(ladder, source):
    out, _ = ladder
    art = out / "1-sparsify.gguf"
    before = art.stat().st_mtime_ns
    res = run(source, "-o", out, *SMALL, "--require-reduction", "0.99")
    assert res.exit_code == 1, res.output  # no rung within budget saves 99 %
    assert "sparsify: reusing 1-sparsify.gguf" in res.stderr and "layout: reusing" in res.stderr
    assert art.stat().st_mtime_ns == before
    gate = json.loads((out / "ladder.json").read_text())["gate"]
    assert gate["met"] is False and gate["exit_code"] == 1 and gate["require_reduction"] == 0.99


def test_an_interrupted_rung_leaves_nothing_and_the_next_run_builds_it(source, tmp_path, monkeypatch):
    import convert.layout
    from contract.ladder import LadderConfig, run_ladder

    real = convert.layout.layout_gguf

    def interrupted(model, output, *a, **kw):
        with open(output, "wb") as fh:  # half a file, then Ctrl-C
            fh.write(b"GGUF" + b"\0" * 100)
        raise KeyboardInterrupt

    out = tmp_path / "out"
    cfg = LadderConfig(tiers=("layout",), heldout_tokens=64, decode_tokens=4, rounds=1, llamacpp=False,
                       calibration_samples=2, check_samples=4, threads=1)
    monkeypatch.setattr(convert.layout, "layout_gguf", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_ladder(str(source), out, cfg)
    assert not list(out.glob("*layout*")) and not list(out.glob(".building-*"))
    monkeypatch.setattr(convert.layout, "layout_gguf", real)
    lines: list[str] = []
    rep = run_ladder(str(source), out, cfg, log=lines.append)
    assert "layout: built 1-layout.gguf" in "\n".join(lines)
    assert rep["rungs"][1]["status"] == "built" and rep["rungs"][1]["measured"]["mb_per_token_total"] > 0
    assert (out / "1-layout.gguf").is_file() and (out / "layout.record.json").is_file()


def test_bad_input_and_options(source, tmp_path):
    res = run(source, "-o", tmp_path / "o", "--tiers", "sparsify,bogus", "--no-llamacpp")
    assert res.exit_code == 2 and "Unknown tier bogus" in res.output and "Traceback" not in res.output
    assert run(source, "-o", tmp_path / "o", "--budget-ppl", "0.9").exit_code == 2
    res = run(tmp_path / "missing.gguf", "-o", tmp_path / "o")
    assert res.exit_code == 4 and "Traceback" not in res.output
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x01" * 20)
    res = run(bad, "-o", tmp_path / "o2", "--no-llamacpp")
    assert res.exit_code == 4 and "Traceback" not in res.output
    assert not (tmp_path / "o2").exists()  # nothing written for a file it cannot read


def test_llamacpp_decodes_the_source_in_alternated_rounds(source, tmp_path):
    from aios.reference import llamacpp

    if not llamacpp.available():
        pytest.skip("llama-cpp-python is not installed")
    out = tmp_path / "out"
    res = run(source, "-o", out, *[a for a in SMALL if a != "--no-llamacpp"], "--tiers", "layout", "--rounds", "2")
    assert res.exit_code == 0, res.output
    rep = json.loads((out / "ladder.json").read_text())
    assert rep["llamacpp"]["engine"].startswith("llama.cpp") and rep["llamacpp"]["threads"] == 1
    assert rep["llamacpp"]["failed"] is None and "buffers" in rep["llamacpp"]["buffers"]
    for r in rep["rungs"]:
        m = r["measured"]
        assert len(m["llamacpp_tok_s_rounds"]) == 2 and m["llamacpp_tok_s"] > 0 and m["ratio_vs_llamacpp"] > 0
    assert "llama.cpp via llama-cpp-python" in (out / "ladder.md").read_text()


def test_a_full_disk_mid_rung_leaves_nothing_and_the_next_run_builds_it(source, tmp_path, monkeypatch):
    """The disk fills while a rung is written: one sentence and the disk-full exit code from the CLI,
    no artifact or scratch left, and the next run builds the rung."""
    import errno

    import convert.layout

    real = convert.layout.layout_gguf

    def full(model, output, *a, **kw):
        with open(output, "wb") as fh:
            fh.write(b"GGUF" + b"\0" * 100)
        raise OSError(errno.ENOSPC, "No space left on device")

    out = tmp_path / "out"
    args = [source, "-o", out, "--tiers", "layout", *SMALL]
    monkeypatch.setattr(convert.layout, "layout_gguf", full)
    res = run(*args)
    assert res.exit_code not in (0, 1) and "Traceback" not in res.output and "space" in res.output.lower()
    assert not list(out.glob("*layout*")) and not list(out.glob(".building-*"))
    monkeypatch.setattr(convert.layout, "layout_gguf", real)
    res = run(*args)
    assert res.exit_code == 0, res.output
    assert (out / "1-layout.gguf").is_file() and "layout: built 1-layout.gguf" in res.stderr


def test_the_html_opens_in_a_real_browser(ladder, tmp_path):
    """Headless Chromium renders ladder.html to a screenshot (skipped where no Chromium is installed:
    `apt-get install chromium`)."""
    import shutil
    import subprocess

    exe = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)
    if exe is None:
        pytest.skip("no Chromium on PATH")
    out, _ = ladder
    shot = tmp_path / "ladder.png"
    res = subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", f"--screenshot={shot}",
                          "--window-size=1200,1600", (out / "ladder.html").as_uri()],
                         capture_output=True, text=True, timeout=120, check=False)
    assert shot.is_file() and shot.stat().st_size > 20_000, res.stderr[-2000:]
    from matplotlib.image import imread

    img = imread(shot)
    assert img.shape[0] >= 1000 and img[..., :3].std() > 0.05  # a page with a picture, not a blank one


def test_a_rung_the_runtime_cannot_run_is_reported_and_the_ladder_goes_on(source, tmp_path, monkeypatch):
    from aios.errors import InvalidModelError
    from contract import ladder as L
    from contract.ladder.report import ladder_schema, to_markdown

    real = L.measure_rung

    def refuse(path, mode, cfg, **kw):
        if "layout" in str(path):
            raise InvalidModelError(f"{path.name} has no 'token_embd.weight' tensor.")
        return real(path, mode, cfg, **kw)

    monkeypatch.setattr(L, "measure_rung", refuse)
    real_mode = L.best_mode
    monkeypatch.setattr(L, "best_mode", lambda p: refuse(p, None, None) if "layout" in str(p) else real_mode(p))
    cfg = L.LadderConfig(tiers=("layout",), heldout_tokens=64, decode_tokens=4, rounds=1, llamacpp=False,
                         calibration_samples=2, check_samples=4, threads=1)
    rep = L.run_ladder(str(source), tmp_path / "out", cfg)
    r = rep["rungs"][1]
    assert r["status"] == "built" and r["measured"] is None and "token_embd" in r["not_measured"]
    jsonschema.validate(json.loads(json.dumps(rep, default=str)), ladder_schema())
    assert "built, not measured" in to_markdown(rep) and rep["best"]["rung"] == "dense"
