"""Reports of runs other than the checker: ``aios-run bench`` and ``aios-convert relufy``.

Both render from the JSON those commands write (shapes in reports/load.py), to the same
self-contained HTML as the check report and to Markdown.
"""

from __future__ import annotations

from contract.spec import requirement
from reports import plots
from reports.html import esc, ev, fmt, fmt_mb, img, page, table
from reports.measured import TERM_LABELS, TERMS, bench_label


def bench_html(result: dict) -> str:
    s = result.get("settings", {})
    pct = lambda x: "—" if x is None else f"{x:.1%}"  # noqa: E731
    rows = [[esc(bench_label(r)), f"{r['decode_tokens_per_s']:.1f}",
             *(fmt_mb(r["decode_mb_per_token"].get(k)) for k in TERMS), fmt_mb(r["decode_mb_per_token_total"]),
             pct(r.get("ffn_density")), pct(r.get("reduction_vs_baseline")),
             pct(r.get("projected_reduction")) + (" " + ev("projected") if r.get("projected_reduction") is not None else ""),
             esc(r.get("measured_over_projected") or "—")] for r in result["rows"]]
    series = [(bench_label(r), [r["decode_mb_per_token"].get(k) for k in TERMS] + [r["decode_mb_per_token_total"]],
               "measured") for r in result["rows"]]
    skipped = "".join(f"<li>{esc(x)}</li>" for x in result.get("skipped", []))
    body = (table(["run", "decode tok/s", "MB/tok weights", "KV", "activations", "total", "FFN density",
                   "measured reduction", "projected reduction", "measured / projected"], rows, set(range(1, 10)))
            + f"<p>Evidence of every MB/token and tok/s figure: {esc(result.get('evidence', 'measured'))} "
              f"{ev('measured')}. Projected reductions come from aios-contract check {ev('projected')} "
              "and are not measurements.</p>"
            + (f"<p>Skipped:</p><ul>{skipped}</ul>" if skipped else ""))
    base = result.get("baseline", {})
    sub = (f"Baseline {esc(base.get('file'))} [{esc(base.get('mode'))}] · {esc(s.get('prompt_tokens'))} prompt tokens, "
           f"{esc(s.get('new_tokens'))} generated · {esc(result.get('tool', 'aios-run bench'))} "
           f"{esc(result.get('tool_version', ''))}")
    return page("aios-run bench: measured MB/token", sub, [
        ("bench-runs", "Runs", body),
        ("mb-per-token", "MB/token by term (measured)",
                img(plots.mb_per_token([TERM_LABELS[k] for k in TERMS + ("total",)], series), "measured MB per token")),
    ])


def relufy_html(data: dict) -> str:
    curve = data.get("curve") or []
    metrics = data.get("metrics") or {}
    keys = sorted({k for v in metrics.values() if isinstance(v, dict) for k in v})
    phases = [p for p, v in metrics.items() if isinstance(v, dict)]
    summary = (table(["metric", *phases], [[esc(k), *(fmt(metrics[p].get(k)) for p in phases)] for k in keys])
               if keys else "<p>No before/after metrics in this file.</p>")
    cfg = data.get("config")
    summary += (f"<p>{ev('measured')} Before/after numbers measured by the converter.</p>"
                + (f"<p>Converter config:</p><pre>{esc(cfg)}</pre>" if cfg else ""))
    if curve:
        steps = [c["step"] for c in curve]
        zero = [c.get("exact_zero_fraction") for c in curve]
        ppl = [c.get("heldout_ppl") for c in curve]
        floor = requirement("R1")["min_mean_zero_fraction"]
        body = (img(plots.relufy_curve(steps, zero, ppl, floor), "relufy sparsity and perplexity curve")
                + f"<p>{ev('measured')} Exact-zero fraction of FFN activations and held-out perplexity, "
                  "evaluated during recovery fine-tuning.</p>"
                + table(["step", "exact-zero fraction", "held-out perplexity"],
                        [[fmt(s), fmt(z), fmt(p)] for s, z, p in zip(steps, zero, ppl)], {0, 1, 2}))
    else:
        body = '<p class="warn">No curve in this file.</p>'
    src = data.get("source_model") or data.get("source") or "?"
    sub = f"source <code>{esc(src)}</code> · {esc(data.get('tool', 'aios-convert relufy'))} {esc(data.get('tool_version', ''))}"
    return page("aios-convert relufy: sparsity vs perplexity", sub, [
        ("relufy-summary", "Before and after", summary),
        ("relufy-curve", "Sparsity / perplexity curve", body),
    ])


def relufy_markdown(data: dict) -> str:
    """The relufy curve and before/after metrics as GitHub-flavoured Markdown."""
    lines = [f"## aios-convert relufy: `{data.get('source_model') or data.get('source') or '?'}`", ""]
    metrics = {p: v for p, v in (data.get("metrics") or {}).items() if isinstance(v, dict)}
    keys = sorted({k for v in metrics.values() for k in v})
    if keys:
        lines += ["| Metric (measured) | " + " | ".join(metrics) + " |", "|---|" + "---|" * len(metrics)]
        lines += [f"| {k} | " + " | ".join(str(metrics[p].get(k, "—")) for p in metrics) + " |" for k in keys]
        lines.append("")
    curve = data.get("curve") or []
    if curve:
        lines += ["| Step | Exact-zero fraction | Held-out perplexity |", "|---|---|---|"]
        lines += [f"| {c['step']} | {c.get('exact_zero_fraction', '—')} | {c.get('heldout_ppl', '—')} |" for c in curve]
    return "\n".join(lines) + "\n"
