"""Every rendering of an ``aios-contract check`` report: the terminal scorecard, JSON (versioned
schema), Markdown, JUnit XML, HTML (reports/html.py) and SARIF 2.1.0 (reports/sarif.py).

Layering: ``reports`` sits above ``contract`` (it imports the report model and the spec);
nothing in ``contract`` imports ``reports`` except ``contract/cli.py``, the top-level command.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

from rich.console import Console
from rich.table import Table

from aios.io import write_atomic
from contract.result import CheckReport, Status, report_json_schema
from reports.html import check_html
from reports.measured import NOT_MEASURED, TERM_LABELS, TERMS, mb_table, spec_range
from reports.sarif import to_sarif

FORMATS = ("json", "md", "junit", "html", "sarif")
FILE_NAMES = {"json": "aios-report.json", "md": "aios-report.md", "junit": "aios-report.junit.xml",
              "html": "aios-report.html", "sarif": "aios-report.sarif"}
STEP_SUMMARY_LIMIT = 1024 * 1024  # GitHub rejects a $GITHUB_STEP_SUMMARY larger than 1 MiB
ICON = {Status.passed: "✅ pass", Status.failed: "❌ fail", Status.not_measured: "⚪ not measured", Status.error: "⚠️ error"}


STATUS_STYLE = {"pass": "bold green", "fail": "bold red", "not_measured": "yellow",
                "error": "bold magenta"}


def print_check(report: CheckReport, console: Console) -> None:
    """The terminal scorecard of ``aios-contract check``: requirements, projection, tier, gate."""
    t = Table(title=f"AIOS Model Contract v{report.contract_version} — {report.model['spec']}")
    for col in ("Req", "Status", "Evidence", "Result"):
        t.add_column(col)
    for r in report.requirements:
        s = r.status.value
        t.add_row(f"{r.id} {r.title}", f"[{STATUS_STYLE[s]}]{s}[/]", r.evidence.value, r.summary)
    console.print(t)
    for r in report.requirements:
        if r.formula:
            console.print(f"  {r.id}: {r.formula}")
        if r.command:
            console.print(f"  {r.id}: to measure, run `{r.command}`")
    p = report.projection
    if p:
        console.print(f"Projected MB/token (context {p.context}): {p.projected_mb_per_token:.3f} "
                      f"vs {p.baseline_mb_per_token:.3f} baseline, reduction "
                      f"{p.projected_reduction:.1%} [dim](projected, not measured; {claim_note(report)})[/]")
    for line in quality_lines(report):
        console.print(line, markup=False)
    g = report.gate
    console.print(time_split(report), markup=False)
    console.print(f"[bold]Tier: {report.tier_name}[/] · gate: {g.reason} · exit {g.exit_code} "
                  f"· {report.seconds:.1f} s")


def time_split(report: CheckReport) -> str:
    """Where a check's time went: "Time: R1 9.8 s, R3 3.1 s; the others < 0.1 s each"."""
    slow = [r for r in report.requirements if r.seconds >= 0.05]
    parts = ", ".join(f"{r.id} {r.seconds:.1f} s" for r in slow) or "every requirement < 0.1 s"
    rest = "; the others < 0.1 s each" if 0 < len(slow) < len(report.requirements) else ""
    return f"Time: {parts}{rest}"


def claim_note(report: CheckReport) -> str:
    """The contract's claim for the tier, said so that it is never read as this model's figure."""
    p = report.projection
    if p is None:
        return ""
    claim = f"the contract claims {spec_range(p)} for {report.tier_name}"
    lo = (p.spec_projected_reduction or [None])[0]
    if lo is not None and p.projected_reduction < lo:
        claim += f", a tier-wide claim this model's own projection ({p.projected_reduction:.1%}) does not reach"
    return claim


def quality_lines(report: CheckReport) -> list[str]:
    """The quality gate's numbers as sentences: both perplexities with their evidence class."""
    q = report.quality
    if q is None:
        return []
    ev = q.evidence.value
    if q.perplexity is None and q.baseline_perplexity is None and q.max_ratio is None:
        return [f"Quality: not measured; converted from {q.baseline} ({q.source})."]
    ppl = "—" if q.perplexity is None else f"{q.perplexity:.4f}"
    base = "—" if q.baseline_perplexity is None else f"{q.baseline_perplexity:.4f}"
    line = (f"Quality: held-out perplexity {ppl} ({ev}) vs {base} ({ev}) for the baseline "
            f"{q.baseline or 'source (unknown)'}")
    if q.ratio is not None:
        line += f", ratio {q.ratio:.3f}"
    if q.max_ratio is not None:
        verdict = {True: "met", False: "NOT met", None: "could not be evaluated"}[q.met]
        line += f"; gate ratio ≤ {q.max_ratio:.2f}: {verdict}"
    lines = [line + "."]
    if q.reason:
        lines.append(f"  quality: {q.reason}")
    if q.source:
        lines.append(f"  quality: {q.source}")
    return lines


def to_json(report: CheckReport) -> str:
    return report.model_dump_json(indent=2)


def schema_json() -> str:
    return json.dumps(report_json_schema(), indent=2, ensure_ascii=False) + "\n"


def _value(m) -> str:
    v = m.value
    if isinstance(v, float):
        v = f"{v:.4g}"
    elif isinstance(v, int) and not isinstance(v, bool):
        v = f"{v:,}"
    return f"{v} {m.unit}".strip()


def to_markdown(report: CheckReport, bench: dict | None = None) -> str:
    """GitHub-flavoured Markdown, fit for ``$GITHUB_STEP_SUMMARY`` (no HTML, under 1 MiB)."""
    m = report.model
    lines = [
        f"## AIOS Model Contract v{report.contract_version}: `{m['spec']}`",
        "",
        f"**Tier: {report.tier_name}** · gate: {report.gate.reason} (exit {report.gate.exit_code}) · "
        f"{report.seconds:.1f} s · aios-contract {report.tool_version}",
        "",
        "| Req | Status | Evidence | Result |",
        "|---|---|---|---|",
    ]
    for r in report.requirements:
        lines.append(f"| {r.id} {r.title} | {ICON[r.status]} | {r.evidence.value} | {r.summary} |")
    lines += ["", "### Numbers", "", "| Req | Metric | Value | Evidence |", "|---|---|---|---|"]
    for r in report.requirements:
        for met in r.metrics:
            lines.append(f"| {r.id} | {met.name} | {_value(met)} | {met.evidence.value} |")
    lines += ["", "### Formulas and criteria", ""]
    for r in report.requirements:
        lines.append(f"- **{r.id}** criterion: {r.criterion}")
        if r.formula:
            lines.append(f"  - formula: `{r.formula}`")
        if r.command:
            lines.append(f"  - to measure: `{r.command}`")
    p = report.projection
    if p:
        spec = spec_range(p)
        lines += [
            "", f"### MB/token (projected, context {p.context})", "",
            "| Term | Baseline MB | Projected MB | Basis |", "|---|---|---|---|",
        ]
        for t in p.terms:
            lines.append(f"| {t.term} | {t.baseline_bytes / 1e6:.3f} | {t.projected_bytes / 1e6:.3f} | {t.basis} |")
        lines += [
            "",
            f"Projected: **{p.projected_mb_per_token:.3f} MB/token** vs {p.baseline_mb_per_token:.3f} baseline "
            f"(reduction {p.projected_reduction:.1%}; the contract's claim for {report.tier_name}: {spec}). "
            f"_{p.note}_",
        ]
    q = report.quality
    if q is not None and q.perplexity is None and q.baseline_perplexity is None and q.max_ratio is None:
        lines += ["", *quality_lines(report)]
    elif q is not None:
        def cell(v: float | None) -> str:
            return "—" if v is None else f"{v:.4f}"

        lines += ["", "### Quality (held-out perplexity)", "",
                  "| Model | Perplexity | Evidence |", "|---|---|---|",
                  f"| `{m['spec']}` | {cell(q.perplexity)} | {q.evidence.value} |",
                  f"| baseline `{q.baseline or 'unknown'}` | {cell(q.baseline_perplexity)} | {q.evidence.value} |",
                  ""]
        lines += [f"- {x.strip()}" for x in quality_lines(report)]
    lines += _measured_markdown(report, bench)
    if report.calibration:
        c = report.calibration
        measured = c.get("samples_measured", c["samples"])
        used = f"{c['samples']} samples" if measured >= c["samples"] else \
            f"{measured} of {c['samples']} samples (R1 settled)"
        lines += ["", f"Calibration: {used} from {c['source']}, {c['tokens']:,} tokens "
                      f"(≤ {c['max_tokens']} per sample), sha256 `{c['sha256'][:12]}`."]
    return fit_step_summary("\n".join(lines) + "\n")


def _measured_markdown(report: CheckReport, bench: dict | None) -> list[str]:
    if not bench:
        return ["", f"Measured MB/token: {NOT_MEASURED} (pass its JSON with `--bench`)."]
    t = mb_table(report, bench)
    lines = ["", "### MB/token: projected vs measured", "",
             "| Term | " + " | ".join(f"{c.label} ({c.evidence})" for c in t.columns) + " |",
             "|---|" + "---|" * len(t.columns)]
    for term in TERMS + ("total",):
        vals = ["—" if c.values.get(term) is None else f"{c.values[term]:.4f}" for c in t.columns]
        lines.append(f"| {TERM_LABELS[term]} | " + " | ".join(vals) + " |")
    return lines + [""] + [f"- {n}" for n in t.notes]


def fit_step_summary(md: str, limit: int = STEP_SUMMARY_LIMIT) -> str:
    """Cut ``md`` at a line boundary so it stays under GitHub's step-summary limit."""
    if len(md.encode("utf-8")) <= limit:
        return md
    note = "\n\n_(truncated to fit the 1 MiB step-summary limit; see the JSON/HTML report)_\n"
    budget = limit - len(note.encode("utf-8"))
    out, used = [], 0
    for line in md.splitlines(keepends=True):
        used += len(line.encode("utf-8"))
        if used > budget:
            break
        out.append(line)
    return "".join(out) + note


def to_junit(report: CheckReport) -> str:
    """One testcase per requirement; fail → <failure>, not_measured → <skipped>, error → <error>."""
    suite = ET.Element("testsuite", {
        "name": f"aios-contract {report.model['spec']}",
        "tests": str(len(report.requirements)),
        "failures": str(sum(r.status == Status.failed for r in report.requirements)),
        "errors": str(sum(r.status == Status.error for r in report.requirements)),
        "skipped": str(sum(r.status == Status.not_measured for r in report.requirements)),
        "time": f"{report.seconds:.3f}",
    })
    for r in report.requirements:
        case = ET.SubElement(suite, "testcase", {
            "classname": f"aios.contract.v{report.contract_version}", "name": f"{r.id} {r.title}",
            "time": f"{r.seconds:.3f}",
        })
        body = "\n".join([r.summary, f"criterion: {r.criterion}"] + [f"{m.name} = {_value(m)} ({m.evidence.value})" for m in r.metrics])
        if r.status == Status.failed:
            ET.SubElement(case, "failure", {"message": r.summary}).text = body
        elif r.status == Status.error:
            ET.SubElement(case, "error", {"message": r.summary}).text = body
        elif r.status == Status.not_measured:
            ET.SubElement(case, "skipped", {"message": f"{r.summary} {r.command or ''}".strip()})
        ET.SubElement(case, "system-out").text = body
    suites = ET.Element("testsuites")
    suites.append(suite)
    ET.indent(suites)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"


RENDERERS = {"json": to_json, "md": to_markdown, "junit": to_junit, "html": check_html, "sarif": to_sarif}
USES_BENCH = {"md", "html"}  # renderers that show measured MB/token from an aios-run bench JSON


def render(report: CheckReport, fmt: str, bench: dict | None = None) -> str:
    return RENDERERS[fmt](report, bench) if fmt in USES_BENCH else RENDERERS[fmt](report)


def write_reports(report: CheckReport, out_dir: str | Path, formats: list[str],
                  bench: dict | None = None) -> list[Path]:
    out = Path(out_dir)
    return [write_atomic(out / FILE_NAMES[f], render(report, f, bench)) for f in formats]
