"""``aios-contract compare A.json B.json``: what changed between two check reports.

A is the reference (release N), B the candidate (release N+1). A requirement *regressed*
when it passed in A and does not pass in B (fail, error or not measured: a release must not
lose a verified property silently); it *improved* when it passes only in B. The exit code is 1
when anything regressed, else 0. Numeric metrics get B − A deltas; measured numbers are only
comparable when both reports used the same calibration set, which is checked and noted.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from aios import __version__
from aios.errors import ExitCode, UsageError
from aios.io import write_atomic
from contract.result import CheckReport, Status
from contract.spec import tiers
from reports import html as H
from reports import sarif

COMPARE_SCHEMA_VERSION = "1"
FORMATS = ("text", "md", "json", "junit", "sarif", "html")
FILE_NAMES = {"text": "aios-compare.txt", "md": "aios-compare.md", "json": "aios-compare.json",
              "junit": "aios-compare.junit.xml", "sarif": "aios-compare.sarif", "html": "aios-compare.html"}
ARROW = {"regressed": "▼ regressed", "improved": "▲ improved", "changed": "≠ changed", "unchanged": "="}


class MetricDelta(BaseModel):
    name: str
    a: Any = None
    b: Any = None
    delta: float | None = None  # b − a when both are numbers
    unit: str = ""
    evidence: str = ""


class RequirementChange(BaseModel):
    id: str
    title: str
    status_a: str
    status_b: str
    change: str  # regressed | improved | changed | unchanged
    summary_b: str
    metrics: list[MetricDelta] = Field(default_factory=list)


class Comparison(BaseModel):
    schema_version: str = COMPARE_SCHEMA_VERSION
    tool: str = "aios-contract compare"
    tool_version: str = __version__
    a: dict[str, Any]  # path, model spec, tier, created_utc, tool_version of each side
    b: dict[str, Any]
    tier_change: str  # up | down | same
    changes: list[RequirementChange]
    regressions: list[str]
    projected_mb_per_token: dict[str, float | None]  # a, b, delta (projected, not measured)
    notes: list[str] = Field(default_factory=list)
    exit_code: int


def _side(r: CheckReport, path: str) -> dict[str, Any]:
    return {"path": path, "model": r.model["spec"], "tier": r.tier, "tier_name": r.tier_name,
            "created_utc": r.created_utc, "tool_version": r.tool_version, "contract_version": r.contract_version,
            "model_location": sarif.model_location(r.model)}


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _first(metrics) -> dict:
    out: dict = {}
    for m in metrics:
        out.setdefault(m.name, m)
    return out


def _metric_deltas(ra, rb) -> list[MetricDelta]:
    ma, mb = _first(ra.metrics if ra else []), _first(rb.metrics if rb else [])
    out = []
    for name in dict.fromkeys([*ma, *mb]):
        a, b = ma.get(name), mb.get(name)
        va, vb = (a.value if a else None), (b.value if b else None)
        delta = round(float(vb) - float(va), 6) if _num(va) and _num(vb) else None
        out.append(MetricDelta(name=name, a=va, b=vb, delta=delta, unit=(b or a).unit,
                               evidence=(b or a).evidence.value))
    return out


def _change(sa: str, sb: str) -> str:
    if sa == sb:
        return "unchanged"
    if sa == Status.passed.value:
        return "regressed"
    return "improved" if sb == Status.passed.value else "changed"


def compare(a: CheckReport, b: CheckReport, path_a: str = "A", path_b: str = "B") -> Comparison:
    """Per-requirement status changes, metric deltas and the tier change from A to B."""
    ra, rb = {r.id: r for r in a.requirements}, {r.id: r for r in b.requirements}
    changes = []
    for rid in dict.fromkeys([*ra, *rb]):
        x, y = ra.get(rid), rb.get(rid)
        sa, sb = (x.status.value if x else "absent"), (y.status.value if y else "absent")
        changes.append(RequirementChange(id=rid, title=(y or x).title, status_a=sa, status_b=sb,
                                         change=_change(sa, sb), summary_b=y.summary if y else "",
                                         metrics=_metric_deltas(x, y)))
    order = [t["id"] for t in tiers()]
    ta, tb = order.index(a.tier), order.index(b.tier)
    tier_change = "same" if ta == tb else ("up" if tb > ta else "down")
    regressions = [c.id for c in changes if c.change == "regressed"]
    notes = []
    if a.model["spec"] != b.model["spec"]:
        notes.append(f"Different models: {a.model['spec']} → {b.model['spec']}.")
    if a.contract_version != b.contract_version:
        notes.append(f"Contract versions differ: {a.contract_version} → {b.contract_version}.")
    ca, cb = a.calibration or {}, b.calibration or {}
    if ca.get("sha256") != cb.get("sha256") or ca.get("max_tokens") != cb.get("max_tokens"):
        notes.append("The calibration sets differ, so measured deltas mix model and calibration changes.")
    pa = a.projection.projected_mb_per_token if a.projection else None
    pb = b.projection.projected_mb_per_token if b.projection else None
    return Comparison(
        a=_side(a, path_a), b=_side(b, path_b), tier_change=tier_change, changes=changes,
        regressions=regressions, notes=notes,
        projected_mb_per_token={"a": pa, "b": pb, "delta": round(pb - pa, 4) if pa is not None and pb is not None else None},
        exit_code=int(ExitCode.NOT_MET if regressions else ExitCode.OK),
    )


def _v(x: Any) -> str:
    if x is None:
        return "—"
    return f"{x:.4g}" if isinstance(x, float) else str(x)


def _d(m: MetricDelta) -> str:
    return "" if m.delta is None else f"{m.delta:+.4g}"


def _headline(c: Comparison) -> str:
    verdict = (f"REGRESSED: {', '.join(c.regressions)}" if c.regressions else "no regression")
    return (f"{c.a['model']} ({c.a['tier_name']}) → {c.b['model']} ({c.b['tier_name']}): tier {c.tier_change}; "
            f"{verdict}; exit {c.exit_code}")


def to_text(c: Comparison) -> str:
    lines = [f"aios-contract compare: {c.a['path']} → {c.b['path']}", _headline(c), ""]
    for ch in c.changes:
        lines.append(f"{ch.id} {ch.title}: {ch.status_a} → {ch.status_b}  [{ARROW[ch.change]}]")
        for m in ch.metrics:
            if m.a != m.b:
                lines.append(f"    {m.name}: {_v(m.a)} → {_v(m.b)} {m.unit}".rstrip()
                             + (f" ({_d(m)})" if m.delta is not None else "") + f" [{m.evidence}]")
    p = c.projected_mb_per_token
    lines += ["", f"Projected MB/token (projected, not measured): {_v(p['a'])} → {_v(p['b'])}"]
    lines += [f"note: {n}" for n in c.notes]
    return "\n".join(lines) + "\n"


def to_markdown(c: Comparison) -> str:
    lines = [f"## AIOS contract compare: `{c.a['model']}` → `{c.b['model']}`", "", f"**{_headline(c)}**", "",
             "| Req | A | B | Change |", "|---|---|---|---|"]
    lines += [f"| {ch.id} {ch.title} | {ch.status_a} | {ch.status_b} | {ARROW[ch.change]} |" for ch in c.changes]
    lines += ["", "| Req | Metric | A | B | Δ (B − A) | Evidence |", "|---|---|---|---|---|---|"]
    lines += [f"| {ch.id} | {m.name} | {_v(m.a)} | {_v(m.b)} | {_d(m)} | {m.evidence} |"
              for ch in c.changes for m in ch.metrics if m.a != m.b]
    p = c.projected_mb_per_token
    lines += ["", f"Projected MB/token (projected, not measured): {_v(p['a'])} → {_v(p['b'])}."]
    lines += [f"- {n}" for n in c.notes]
    return "\n".join(lines) + "\n"


def to_junit(c: Comparison) -> str:
    suite = ET.Element("testsuite", {"name": f"aios-contract compare {c.a['model']} -> {c.b['model']}",
                                     "tests": str(len(c.changes)), "failures": str(len(c.regressions)),
                                     "errors": "0", "skipped": "0"})
    for ch in c.changes:
        case = ET.SubElement(suite, "testcase", {"classname": "aios.contract.compare", "name": f"{ch.id} {ch.title}"})
        if ch.change == "regressed":
            ET.SubElement(case, "failure", {"message": f"{ch.id} regressed: {ch.status_a} -> {ch.status_b}"}).text = ch.summary_b
        ET.SubElement(case, "system-out").text = f"{ch.status_a} -> {ch.status_b} ({ch.change})"
    suites = ET.Element("testsuites")
    suites.append(suite)
    ET.indent(suites)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"


def sarif_dict(c: Comparison) -> dict[str, Any]:
    """One ``error`` result per regressed requirement, at B's model; rules R1–R5."""
    results = []
    for ch in c.changes:
        if ch.change != "regressed" or ch.id not in sarif.RULE_IDS:
            continue
        results.append({
            "ruleId": ch.id, "ruleIndex": sarif.RULE_IDS.index(ch.id), "level": "error",
            "message": {"text": f"{ch.id} regressed from {c.a['path']} to {c.b['path']}: "
                                f"{ch.status_a} → {ch.status_b}. {ch.summary_b}"},
            "locations": [c.b["model_location"]],
            "partialFingerprints": {"aiosRegression/v1": f"{ch.id}:{c.b['model']}"},
            "properties": {"status_a": ch.status_a, "status_b": ch.status_b,
                           "metrics": [m.model_dump(mode="json") for m in ch.metrics]},
        })
    return sarif.sarif_log(c.tool_version, c.b["contract_version"], results,
                           run_props={"a": c.a["path"], "b": c.b["path"], "tier_change": c.tier_change})


def to_sarif(c: Comparison) -> str:
    return json.dumps(sarif_dict(c), indent=2, ensure_ascii=False) + "\n"


def to_html(c: Comparison) -> str:
    rows = [[f"<b>{H.esc(ch.id)}</b> {H.esc(ch.title)}", H.badge("s", ch.status_a), H.badge("s", ch.status_b),
             H.esc(ARROW[ch.change]), H.esc(ch.summary_b)] for ch in c.changes]
    mrows = [[H.esc(ch.id), H.esc(m.name), H.fmt(m.a), H.fmt(m.b), H.esc(_d(m)), H.ev(m.evidence)]
             for ch in c.changes for m in ch.metrics if m.a != m.b]
    p = c.projected_mb_per_token
    notes = "".join(f'<p class="note">{H.esc(n)}</p>' for n in c.notes)
    return H.page(f"AIOS contract compare: {c.a['model']} → {c.b['model']}", H.esc(_headline(c)), [
        ("requirements", "Requirements: A → B", H.table(["Requirement", "A", "B", "Change", "B says"], rows) + notes),
        ("metric-deltas", "Numbers that changed", H.table(["Req", "Metric", "A", "B", "Δ (B − A)", "Evidence"],
                                                          mrows, {2, 3, 4})),
        ("mb-per-token", "MB/token", f"<p>{H.ev('projected')} {H.esc(_v(p['a']))} → {H.esc(_v(p['b']))} MB/token "
                                     "(projection, not a measurement).</p>"),
    ])


RENDERERS = {"text": to_text, "md": to_markdown, "json": lambda c: c.model_dump_json(indent=2) + "\n",
             "junit": to_junit, "sarif": to_sarif, "html": to_html}


def write_comparison(c: Comparison, out_dir: str | Path, formats: list[str]) -> list[Path]:
    bad = [f for f in formats if f not in FORMATS]
    if bad:
        raise UsageError(f"Unknown compare format {', '.join(bad)}; choose from {', '.join(FORMATS)}.")
    return [write_atomic(Path(out_dir) / FILE_NAMES[f], RENDERERS[f](c)) for f in formats]
