"""The tier ladder's HTML page (``ladder.html``): the ladder plot and the tables a release reviewer
reads, beside ``ladder.json`` and ``ladder.md`` (``contract.ladder.report``).

The plot: measured MB/token per rung (solid bars) beside the checker's projected MB/token (hatched:
a projection, never a measurement), and the measured held-out perplexity ratio on a second axis
with the budget as a dashed line. Fixed size, no metadata in the PNG: same report, same bytes.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from contract.ladder.report import COLUMNS, table_rows, write_json_md
from reports.html import esc, ev, img, page, table
from reports.plots import MEASURED, PROJECTED, THRESHOLD


def ladder_plot(names: list[str], measured: list[float | None], projected: list[float | None],
                ppl_ratio: list[float | None], budget: float) -> bytes:
    """PNG: MB/token measured and projected per rung, perplexity ratio on the right axis."""
    fig = Figure(figsize=(8, 3.6), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    x = np.arange(len(names))
    nan = [np.nan if v is None else v for v in measured]
    pro = [np.nan if v is None else v for v in projected]
    ax.bar(x - 0.2, nan, 0.4, color=MEASURED, label="MB/token (measured)")
    ax.bar(x + 0.2, pro, 0.4, color="#fff8c5", edgecolor=PROJECTED, hatch="//", label="MB/token (projected)")
    ax.set(xticks=x, ylabel="MB per generated token")
    ax.set_xticklabels(names, fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    ax2 = ax.twinx()
    pr = [np.nan if v is None else v for v in ppl_ratio]
    ax2.plot(x, pr, "o-", color="#2da44e", label="perplexity ratio vs source (measured)")
    ax2.axhline(budget, color=THRESHOLD, ls="--", lw=1.2, label=f"budget {budget:g}×")
    finite = [v for v in pr if np.isfinite(v)] + [budget, 1.0]
    ax2.set(ylabel="held-out perplexity ratio", ylim=(min(finite) * 0.98, max(finite) * 1.02))
    handles = ax.get_legend_handles_labels()
    handles2 = ax2.get_legend_handles_labels()
    fig.legend(handles[0] + handles2[0], handles[1] + handles2[1], loc="outside lower center", ncol=2,
               fontsize=8, frameon=False)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, metadata={"Software": None})
    return buf.getvalue()


def ladder_html(report: dict) -> str:
    rungs = report["rungs"]
    names = [f"{r['index']} {r['name']}" for r in rungs]
    meas = [(r["measured"] or {}).get("mb_per_token_total") for r in rungs]
    proj = [((r["check"] or {}).get("projection") or {}).get("mb_per_token_total") for r in rungs]
    png = ladder_plot(names, meas, proj, [r.get("ppl_ratio") for r in rungs], report["settings"]["budget_ppl"])
    rows = [[esc(c) for c in row] for row in table_rows(report)]
    plot = img(png, "ladder plot: MB/token measured and projected per rung, perplexity ratio") + \
        f"<p class=\"note\">{ev('measured')} bars: aios-run's byte counter. {ev('projected')} hatched bars: " \
        "aios-contract check's projection, a model of savings.</p>"
    terms = []
    for r in rungs:
        pm = r.get("projection_vs_measured")
        for t in (pm or {}).get("terms", []):
            terms.append([esc(f"{r['index']} {r['name']}"), esc(t["term"]), f"{t['measured_mb']:.4f}",
                          f"{t['projected_mb']:.4f}", "—" if t["difference"] is None else f"{t['difference']:.1%}",
                          esc(t["why"])])
    kinds = sorted({k for r in rungs for k in ((r["measured"] or {}).get("weights_by_kind") or {})})
    by_kind = [[esc(f"{r['index']} {r['name']}")] + [f"{(r['measured']['weights_by_kind'] or {}).get(k, 0):.4f}"
                                                     for k in kinds] for r in rungs if r["measured"]]
    notes = "".join(f"<li>{esc(r['index'])} {esc(r['name'])} skipped (on {esc(r['built_on'])}): {esc(r['reason'])}</li>"
                    for r in rungs if r["status"] == "skipped") + "".join(
        f"<li>{esc(r['index'])} {esc(r['name'])}: {esc(n)}</li>" for r in rungs for n in (r.get("notes") or [])) + "".join(
        f"<li>{esc(r['index'])} {esc(r['name'])} built, not measured: {esc(r['not_measured'])}</li>"
        for r in rungs if r.get("not_measured"))
    llama = report.get("llamacpp")
    llama_txt = ("not run (--no-llamacpp)" if not llama else
                 f"{llama['engine']} {llama.get('llama_cpp_python') or ''}, dense decode of the source, "
                 f"{llama['threads']} threads, n_ctx {llama['n_ctx']}, {llama['buffers']}"
                 + (f"; stopped: {llama['failed']}" if llama.get("failed") else ""))
    g, b = report["gate"], report["best"]
    summary = (f"<p>Best rung within the perplexity budget: <b>{esc(b['rung'])}</b>, measured reduction "
               f"{'—' if b['reduction_vs_source'] is None else format(b['reduction_vs_source'], '.1%')}. "
               f"Gate: {esc(g['reason'])} (exit {g['exit_code']}).</p><p class=\"note\">llama.cpp: {esc(llama_txt)}</p>"
               + (f"<ul>{notes}</ul>" if notes else ""))
    sections = [("ladder-plot", "Ladder", plot + summary),
                ("ladder-table", "Rungs", table(COLUMNS, rows, num=set(range(2, 10)))),
                ("projection-vs-measured", "Projected vs measured, by term",
                 table(("Rung", "Term", "Measured MB", "Projected MB", "Difference", "Why (> 5 %)"), terms,
                       num={2, 3, 4}) if terms else "<p>No projection available.</p>"),
                ("weights-by-kind", "Measured weight MB/token by matrix kind",
                 table(["Rung", *kinds], by_kind, num=set(range(1, len(kinds) + 1))))]
    return page(f"AIOS tier ladder — {report['source']['file']}",
                f"aios-contract ladder {esc(report['tool_version'])} · {esc(report['created_utc'])} · "
                f"source sha256 {esc(report['source']['sha256'][:16])}…", sections)


def write_ladder(report: dict, out: str | Path) -> list[Path]:
    """``ladder.json``, ``ladder.md`` and ``ladder.html`` in ``out`` (each written atomically)."""
    from aios.io import write_atomic

    out = Path(out)
    return write_json_md(report, out) + [write_atomic(out / "ladder.html", ladder_html(report))]
