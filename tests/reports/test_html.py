"""HTML reports: every section, embedded PNGs, nothing fetched, labels, determinism."""

from __future__ import annotations

import base64
import json
import re

from click.testing import CliRunner

from contract.cli import main
from reports.check_reports import STEP_SUMMARY_LIMIT, fit_step_summary, to_markdown
from reports.html import check_html
from reports.measured import NOT_MEASURED
from reports.runs import bench_html, relufy_curve_points, relufy_html

CHECK_SECTIONS = ("scorecard", "r1-layers", "activation-frequency", "similarity-heatmap", "mb-per-token",
                  "metrics", "provenance")
MINIMAL_RELUFY = {"curve": [{"step": 0, "exact_zero_fraction": 0.4, "heldout_ppl": 90.0},
                            {"step": 10, "exact_zero_fraction": 0.8, "heldout_ppl": 60.0}]}  # documented shape
IMG = re.compile(r'<img alt="([^"]*)" src="data:image/png;base64,([A-Za-z0-9+/=]+)">')


def images(page: str) -> dict[str, bytes]:
    return {alt: base64.b64decode(data) for alt, data in IMG.findall(page)}


def section(page: str, sid: str) -> str:
    start = page.index(f'<section id="{sid}">')
    return page[start:page.index("</section>", start)]


def assert_self_contained(page: str) -> None:
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page), "external resource"
    assert "<script" not in page and "<link" not in page and "@import" not in page and "url(" not in page


def test_check_report_sections_and_images(falcon_report):
    page = check_html(falcon_report)
    assert_self_contained(page)
    for sid in CHECK_SECTIONS:
        assert f'<section id="{sid}">' in page
    pngs = images(page)
    assert len(pngs) == 4 and all(p.startswith(b"\x89PNG\r\n\x1a\n") for p in pngs.values())
    for sid in ("r1-layers", "activation-frequency", "similarity-heatmap", "mb-per-token"):
        assert len(images(section(page, sid))) == 1, sid
    card = section(page, "scorecard")
    for r in falcon_report.requirements:
        assert f"<b>{r.id}</b>" in card
    assert card.count('class="b s-') == 5 and card.count('class="b e-') >= 5
    assert 'class="b e-projected"' in section(page, "mb-per-token")
    assert NOT_MEASURED in section(page, "mb-per-token")  # no bench given: the measured column says so
    assert check_html(falcon_report) == page  # same report, same bytes (PNG metadata has no date)


def test_alias_without_weights_says_what_is_missing():
    from contract.check import check_model

    page = check_html(check_model("relullama-7b", samples=1, max_tokens=8))
    assert_self_contained(page)
    for sid in CHECK_SECTIONS:
        assert f'<section id="{sid}">' in page
    r1 = section(page, "r1-layers")
    assert 'class="warn"' in r1 and "aios-contract fetch" in r1 and not images(r1)
    assert len(images(section(page, "mb-per-token"))) == 1  # the projection needs no weights


def test_check_report_with_bench_puts_measured_beside_projected(falcon_report, bench_result):
    mb = section(check_html(falcon_report, bench_result), "mb-per-token")
    assert NOT_MEASURED not in mb
    assert "projection: this model" in mb and "measured: tiny-falcon-relu.gguf [sparse]" in mb
    assert 'class="b e-measured"' in mb and 'class="b e-projected"' in mb
    assert "3.2640" in mb  # the sparse row's measured total (3.2 + 0.06 + 0.004)
    md = to_markdown(falcon_report, bench_result)
    assert "projected vs measured" in md and "(measured)" in md and "(projected)" in md


def test_bench_and_relufy_reports(bench_result, relufy_provenance):
    page = bench_html(bench_result)
    assert_self_contained(page)
    assert '<section id="bench-runs">' in page and len(images(section(page, "mb-per-token"))) == 1
    page = relufy_html(relufy_provenance)
    assert_self_contained(page)
    curve = section(page, "relufy-curve")
    assert len(images(curve)) == 1
    assert [s for s, _, _ in relufy_curve_points(relufy_provenance)] == [0, 50, 100, 200]  # swap, evals, end
    assert "120" in curve and "52.3" in curve and "0.91" in curve
    assert "heldout_perplexity" in section(page, "relufy-summary") and "perplexity_ratio" in page
    minimal = relufy_html(MINIMAL_RELUFY)
    assert len(images(section(minimal, "relufy-curve"))) == 1 and "90" in minimal
    assert "relufy-training" not in page  # a provenance without a training block: no section
    run = {**relufy_provenance, "training": {"world_size": 2, "strategy": "MULTI_CPU", "precision": "fp32",
                                             "micro_batch": 4, "gradient_accumulation": 2, "tokens_seen": 4096},
           "throughput": {"tokens_per_second": 3210.5, "per_rank_tokens_per_second": [1600.1, 1610.4]}}
    training = section(relufy_html(run), "relufy-training")
    assert "MULTI_CPU" in training and "4 × 2" in training and "3210" in training.replace(",", "")
    from reports.runs import relufy_markdown

    assert "| processes | 2 |" in relufy_markdown(run)


def test_report_command_renders_every_kind(tmp_path, falcon_report, bench_result, relufy_provenance):
    files = {"check": falcon_report.model_dump_json(), "bench": json.dumps(bench_result),
             "relufy": json.dumps(relufy_provenance)}
    expected = {"check": "aios-report.html", "bench": "aios-bench.html", "relufy": "aios-relufy.html"}
    for kind, text in files.items():
        src = tmp_path / f"{kind}.json"
        src.write_text(text)
        out = tmp_path / f"out-{kind}"
        res = CliRunner().invoke(main, ["report", str(src), "-o", str(out)])
        assert res.exit_code == 0 and f"({kind})" in res.output, res.output
        page = (out / expected[kind]).read_text()
        assert_self_contained(page) and images(page)
        assert (out / expected[kind].replace(".html", ".md")).is_file()
    bench = tmp_path / "bench.json"
    res = CliRunner().invoke(main, ["report", str(tmp_path / "check.json"), "--format", "html", "--bench",
                                    str(bench), "-o", str(tmp_path / "wb")])
    assert res.exit_code == 0 and "measured: tiny-falcon.gguf [dense]" in (tmp_path / "wb/aios-report.html").read_text()
    (tmp_path / "other.json").write_text('{"hello": 1}')
    res = CliRunner().invoke(main, ["report", str(tmp_path / "other.json")])
    assert res.exit_code == 4 and "Traceback" not in res.output
    res = CliRunner().invoke(main, ["report", str(tmp_path / "bench.json"), "--format", "sarif"])
    assert res.exit_code == 2


def test_check_cli_html_sarif_and_bench(lm, tmp_path, bench_result):
    bench = tmp_path / "aios-bench.json"
    bench.write_text(json.dumps(bench_result))
    out = tmp_path / "r"
    args = ["check", str(lm("falcon")), "--samples", "2", "--max-tokens", "8", "--format", "html,sarif,md",
            "--bench", str(bench), "-o", str(out)]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    assert {p.name for p in out.iterdir()} == {"aios-report.html", "aios-report.sarif", "aios-report.md"}
    md = (out / "aios-report.md").read_text()
    assert "measured: tiny-falcon-relu.gguf" in md
    # projected at the bench's context (64 prompt + 32 new tokens), side by side with its measurement
    assert "context 96" in md and "context 4096" not in md and "KV bytes differ" not in md
    assert "projecting at the bench's context, 96 tokens" in res.output
    res = CliRunner().invoke(main, args[:-2] + ["--context", "4096", "-o", str(tmp_path / "r2")])
    assert res.exit_code == 0 and "KV bytes differ" in (tmp_path / "r2" / "aios-report.md").read_text()
    bad = tmp_path / "not-bench.json"
    bad.write_text("[1, 2]")
    res = CliRunner().invoke(main, args[:-4] + ["--bench", str(bad), "-o", str(out)])
    assert res.exit_code == 4 and "Traceback" not in res.output


def test_markdown_fits_step_summary(falcon_report):
    md = to_markdown(falcon_report)
    assert len(md.encode()) < 64 * 1024
    assert not re.search(r"<[A-Za-z/!]", re.sub(r"`[^`]*`", "", md))  # plain Markdown: no HTML tags
    big = "| x |\n" * 400_000
    cut = fit_step_summary(big)
    assert len(cut.encode()) <= STEP_SUMMARY_LIMIT and "truncated" in cut and cut.startswith("| x |\n")


def test_absent_values_read_as_a_dash(falcon_report):
    """No "activation_threshold None" in the HTML facts table (issue 19.9)."""
    page = check_html(falcon_report)
    assert ">None<" not in page


def test_bench_html_shows_the_predictor_false_negative_rate(bench_result):
    """A lossy predict run shows its measured false-negative rate (issue 19.9)."""
    import copy

    res = copy.deepcopy(bench_result)
    res["rows"][1].update(mode="predict", lossy=True, predictor_fnr=0.0123, predicted_density=0.21)
    page = bench_html(res)
    assert "false-negative rate 1.23%" in page and "21.0%" in page
    assert "false-negative" not in bench_html(bench_result)


def test_relufy_curve_of_two_points_draws_no_line(monkeypatch):
    """Two measurements (a 2-step run) are two markers, not a line implying a trend."""
    from matplotlib.axes import Axes

    from reports import plots

    styles = []
    real = Axes.plot

    def spy(self, *args, **kw):
        styles.append(args[2] if len(args) > 2 else None)
        return real(self, *args, **kw)

    monkeypatch.setattr(Axes, "plot", spy)
    plots.relufy_curve([0, 2], [0.5, 0.8], [1000.0, 75.0])
    assert styles == ["o", "s"]
    styles.clear()
    plots.relufy_curve([0, 1, 2], [0.5, 0.7, 0.8], [1000.0, 90.0, 75.0])
    assert styles == ["o-", "s-"]
