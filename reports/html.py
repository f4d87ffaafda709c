"""Self-contained HTML reports: one file, inline CSS, plots as base64 PNG data URIs.

Nothing is fetched when the page is viewed (no fonts, scripts or images from elsewhere).
Every number carries a visible evidence badge (measured / analytic / declared / projected);
projections and measurements sit in separate, labelled columns. Sections have stable ids
(``scorecard``, ``r1-layers``, ``activation-frequency``, ``similarity-heatmap``,
``mb-per-token``, ``relufy-curve``, ...) so tests and links can find them.
"""

from __future__ import annotations

import base64
from html import escape
from typing import Iterable

from contract.result import CheckReport, RequirementResult, Status
from contract.spec import requirement
from reports import plots
from reports.measured import NOT_MEASURED, TERM_LABELS, TERMS, mb_table, spec_range

CSS = """
body{font:15px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;color:#1f2328;
 margin:0;background:#f6f8fa}
main{max-width:1100px;margin:0 auto;padding:24px;background:#fff}
h1{font-size:1.6em;margin:0 0 4px}h2{font-size:1.25em;border-bottom:1px solid #d0d7de;padding-bottom:4px;
 margin-top:32px}
.sub{color:#59636e;margin:0 0 12px}
table{border-collapse:collapse;width:100%;margin:8px 0;font-size:.92em}
th,td{border:1px solid #d0d7de;padding:5px 8px;text-align:left;vertical-align:top}
th{background:#f6f8fa}td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.b{display:inline-block;padding:1px 8px;border-radius:10px;font-size:.82em;font-weight:600;white-space:nowrap;
 border:1px solid transparent}
.s-pass{background:#dafbe1;color:#116329;border-color:#4ac26b}.s-fail{background:#ffebe9;color:#a40e26;
 border-color:#ff8182}.s-not_measured{background:#eaeef2;color:#424a53;border-color:#afb8c1}
.s-error{background:#fbefff;color:#6e40c9;border-color:#c297ff}
.e-measured{background:#ddf4ff;color:#0550ae;border-color:#54aeff}
.e-analytic{background:#dafbe1;color:#116329;border-color:#4ac26b}
.e-declared{background:#eaeef2;color:#424a53;border-color:#afb8c1}
.e-projected{background:repeating-linear-gradient(135deg,#fff8c5,#fff8c5 6px,#fae17d 6px,#fae17d 8px);
 color:#7d4e00;border-color:#d4a72c}
.tier{font-size:1.1em}.note{color:#59636e;font-size:.9em}.warn{background:#fff8c5;border:1px solid #d4a72c;
 padding:6px 10px;border-radius:6px}
img{max-width:100%;height:auto;display:block;margin:8px 0;border:1px solid #d0d7de}
code,pre{font-family:ui-monospace,"DejaVu Sans Mono",monospace;font-size:.88em;background:#f6f8fa}
pre{padding:8px;overflow-x:auto;white-space:pre-wrap}
nav a{margin-right:12px}.tw{overflow-x:auto}
"""


def esc(x: object) -> str:
    return escape(str(x), quote=True)


def badge(kind: str, value: str) -> str:
    label = "not measured" if value == "not_measured" else value
    return f'<span class="b {kind}-{esc(value)}">{esc(label)}</span>'


def ev(evidence: str) -> str:
    return badge("e", evidence)


def img(png: bytes, alt: str) -> str:
    return f'<img alt="{esc(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode("ascii")}">'


def table(headers: Iterable[str], rows: Iterable[Iterable[str]], num: set[int] = frozenset()) -> str:
    """``rows`` hold HTML already escaped; column indexes in ``num`` are right-aligned."""
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f'<td class="num">{c}</td>' if i in num else f"<td>{c}</td>"
                                    for i, c in enumerate(r)) + "</tr>" for r in rows)
    return f'<div class="tw"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def page(title: str, subtitle: str, sections: list[tuple[str, str, str]]) -> str:
    """A whole document; ``sections`` are (id, title, body HTML), ``subtitle`` is HTML."""
    nav = "<nav>" + "".join(f'<a href="#{sid}">{esc(t)}</a>' for sid, t, _ in sections) + "</nav>"
    body = "".join(f'<section id="{sid}"><h2>{esc(t)}</h2>{b}</section>' for sid, t, b in sections)
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width,initial-scale=1">'
            f"<title>{esc(title)}</title><style>{CSS}</style></head><body><main>"
            f'<h1>{esc(title)}</h1><p class="sub">{subtitle}</p>{nav}{body}</main></body></html>\n')


def fmt(v: object) -> str:
    if v is None:  # an absent value reads as a dash, never "None"
        return "—"
    if isinstance(v, bool):
        return esc(v)
    if isinstance(v, float):
        return esc(f"{v:.4g}")
    if isinstance(v, int):
        return esc(f"{v:,}")
    return esc(v)


def fmt_mb(v: float | None) -> str:
    return "—" if v is None else f"{v:.4f}"


def _missing(r: RequirementResult | None, what: str) -> str:
    if r is None or r.status in (Status.not_measured, Status.error) or not r.details:
        why = (r.reason or r.summary) if r else "requirement missing from the report"
        cmd = f" To measure: <code>{esc(r.command)}</code>." if r is not None and r.command else ""
        return f'<p class="warn">No {esc(what)}: {esc(why.rstrip("."))}.{cmd}</p>'
    return f'<p class="warn">No {esc(what)} in this report (written by an older checker: re-run the check).</p>'


# --- aios-contract check ------------------------------------------------------------------


def _scorecard(report: CheckReport) -> str:
    rows = [[f"<b>{esc(r.id)}</b> {esc(r.title)}", badge("s", r.status.value), ev(r.evidence.value),
             esc(r.summary), esc(r.criterion)] for r in report.requirements]
    legend = ("<p class=\"note\">Evidence: " + " ".join(ev(e) for e in ("measured", "analytic", "declared", "projected"))
              + " — measured = ran the model; analytic = arithmetic from config; declared = read from "
                "metadata; projected = a model of savings, never a measurement.</p>")
    return table(["Requirement", "Status", "Evidence", "Result", "Pass criterion"], rows) + legend


def _metrics(report: CheckReport) -> str:
    rows = [[esc(r.id), esc(m.name), fmt(m.value) + (f" {esc(m.unit)}" if m.unit else ""), ev(m.evidence.value),
             esc(m.note)] for r in report.requirements for m in r.metrics]
    extra = "".join(f"<li><b>{esc(r.id)}</b>: <code>{esc(r.formula)}</code></li>" for r in report.requirements if r.formula)
    cmds = "".join(f"<li><b>{esc(r.id)}</b> to measure: <code>{esc(r.command)}</code></li>"
                   for r in report.requirements if r.command)
    return table(["Req", "Metric", "Value", "Evidence", "Note"], rows, {2}) + f"<ul>{extra}{cmds}</ul>"


def _r1_layers(r1: RequirementResult | None) -> str:
    d = r1.details if r1 else {}
    exact = d.get("per_layer_exact_zero_fraction")
    if not exact:
        return _missing(r1, "per-layer activation measurements")
    near = d.get("per_layer_near_zero_fraction")
    floor = requirement("R1")["min_mean_zero_fraction"]
    rows = [[str(i), f"{e:.4f}", "—" if not near else f"{near[i]:.4f}"] for i, e in enumerate(exact)]
    return (img(plots.layer_zero_fractions(exact, near, floor), "per-layer exact-zero and near-zero fractions")
            + f"<p>Hook: {esc(d.get('hook', ''))}. {ev('measured')} Near zeros are information only: "
              "a sparse kernel can skip only exact zeros.</p>"
            + table(["layer", "exact-zero fraction", "near-zero fraction"], rows, {1, 2}))


def _activation_frequency(r1: RequirementResult | None) -> str:
    hist = (r1.details if r1 else {}).get("neuron_frequency_histogram")
    if not hist:
        return _missing(r1, "per-neuron firing frequencies")
    return (img(plots.activation_frequency(hist["bin_edges"], hist["counts"]), "activation-frequency distribution")
            + f"<p>{ev('measured')} For each layer, the share of FFN neurons by the fraction of calibration "
              "tokens on which they are nonzero. Mass on the left means many rarely-firing neurons "
              "(cheap to stream or skip); a bright column at 1.0 means every neuron fires on every token.</p>")


def _similarity(r3: RequirementResult | None) -> str:
    types = (r3.details if r3 else {}).get("matrix_types") or {}
    mats = {k: v["cosine_matrix"] for k, v in types.items() if v.get("cosine_matrix")}
    if not mats:
        return _missing(r3, "cross-layer similarity matrices")
    core = next(iter(types.values()))["core_layers"]
    thr = r3.details.get("zone_cosine_threshold", 0.95)  # type: ignore[union-attr]
    rows = [[esc(k), ", ".join(map(str, v["core_layers"])), ", ".join(f"{c:.3f}" for c in v["best_cosine"]),
             ", ".join(f"{x:.1%}" for x in v["rel_delta_to_core_mean"]), str(v["pairs_over_zone_threshold"])]
            for k, v in types.items()]
    return (img(plots.similarity_heatmaps(mats, core, thr), "cross-layer cosine similarity heatmaps")
            + f"<p>{ev('measured')} Cosine similarity of whole weight matrices between every pair of layers; "
              f"aliasing a core-zone pair needs cosine ≥ {thr:g}.</p>"
            + table(["matrix type", "core layers", "best cosine", "‖W_i − mean‖/‖mean‖", "pairs ≥ threshold"], rows))


def _mb_per_token(report: CheckReport, bench: dict | None) -> str:
    t = mb_table(report, bench)
    if not t.columns:
        return '<p class="warn">No projection in this report.</p>'
    keys = TERMS + ("total",)
    rows = [[esc(c.label), ev(c.evidence), *(fmt_mb(c.values.get(k)) for k in keys), esc(c.note)] for c in t.columns]
    if not t.measured:
        rows.append(["measured", badge("s", "not_measured"), *([esc("—")] * len(keys)), esc(NOT_MEASURED)])
    series = [(c.label, [c.values.get(k) for k in keys], c.evidence) for c in t.columns]
    p = report.projection
    spec = spec_range(p)
    return (table(["source", "evidence", *(f"{TERM_LABELS[k]} MB/token" for k in keys), "note"], rows,
                  set(range(2, 2 + len(keys))))
            + img(plots.mb_per_token([TERM_LABELS[k] for k in keys], series),
                  "MB per token by term, projected and measured")
            + "".join(f'<p class="note">{esc(n)}</p>' for n in t.notes)
            + (f"<p>The contract's own claim for {esc(report.tier_name)}: {spec} reduction {ev('projected')} "
               f"— never measured by anyone.</p><pre>{esc(p.formula)}</pre>" if p else ""))


def _quality(report: CheckReport) -> str:
    q = report.quality
    if q is None:
        return ('<p class="note">No quality numbers: pass <code>--baseline SOURCE</code> to measure held-out '
                "perplexity against the source model.</p>")
    e = q.evidence.value
    rows = [[esc(report.model["spec"]), fmt_mb(q.perplexity), ev(e)],
            [esc(f"baseline {q.baseline or 'unknown'}"), fmt_mb(q.baseline_perplexity), ev(e)]]
    verdict = ""
    if q.max_ratio is not None:
        verdict = {True: "met", False: "not met", None: "could not be evaluated"}[q.met]
        verdict = f" Gate: ratio ≤ {q.max_ratio:g}: <b>{verdict}</b>."
    ratio = f"Ratio {q.ratio:.3f}." if q.ratio is not None else ""
    return (table(["model", "held-out perplexity", "evidence"], rows, {1})
            + f"<p>{ratio}{verdict}</p>"
            + (f'<p class="warn">{esc(q.reason)}</p>' if q.reason else "")
            + (f'<p class="note">{esc(q.source)}</p>' if q.source else ""))


def check_html(report: CheckReport, bench: dict | None = None) -> str:
    """The HTML report of one ``aios-contract check`` run; ``bench`` adds measured MB/token."""
    by = {r.id: r for r in report.requirements}
    m, g, c = report.model, report.gate, report.calibration or {}
    sub = (f'<span class="tier">Tier: <b>{esc(report.tier_name)}</b></span> · gate: {esc(g.reason)} '
           f"(exit {g.exit_code}) · model <code>{esc(m.get('path') or m.get('hub_id') or m['spec'])}</code> "
           f"({esc(m.get('kind', ''))}, {esc(m.get('architecture', ''))}) · aios-contract {esc(report.tool_version)} "
           f"· {esc(report.created_utc)} · {report.seconds:.1f} s")
    used = (f"{c.get('samples')} samples" if c.get("samples_measured", c.get("samples")) == c.get("samples")
            else f"{c.get('samples_measured')} of {c.get('samples')} samples (R1 settled)")
    cal = (f"<p>Calibration: {used} from {esc(c.get('source'))}, {fmt(c.get('tokens'))} tokens "
           f"(≤ {c.get('max_tokens')} per sample), sha256 <code>{esc(str(c.get('sha256', ''))[:16])}</code>.</p>"
           if c else "")
    facts = m.get("facts") or {}
    return page(f"AIOS Model Contract v{report.contract_version}: {m['spec']}", sub, [
        ("scorecard", "Scorecard", _scorecard(report)),
        ("r1-layers", "R1: exact zeros per layer", _r1_layers(by.get("R1"))),
        ("activation-frequency", "R1: activation-frequency distribution", _activation_frequency(by.get("R1"))),
        ("similarity-heatmap", "R3: layer-by-layer similarity", _similarity(by.get("R3"))),
        ("mb-per-token", "MB/token by term: projected vs measured", _mb_per_token(report, bench)),
        ("quality", "Quality: held-out perplexity", _quality(report)),
        ("metrics", "All numbers, formulas and commands", _metrics(report)),
        ("provenance", "Model and calibration",
                cal + table(["fact", "value"], [[esc(k), fmt(v)] for k, v in facts.items()])),
    ])
