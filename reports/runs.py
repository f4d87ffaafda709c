"""Reports of runs other than the checker: ``aios-run bench`` and ``aios-convert relufy``.

Both render from the JSON those commands write (shapes in reports/load.py), to the same
self-contained HTML as the check report and to Markdown.
"""

from __future__ import annotations

import json

from contract.spec import requirement
from reports import plots
from reports.html import esc, ev, fmt, fmt_mb, img, page, table
from reports.measured import TERM_LABELS, TERMS, bench_label


def _predictor_html(rows: list[dict]) -> str:
    """The predictor's measured false-negative rate for every predict run (lossy, so always shown)."""
    items = [f"<li>{esc(bench_label(r))}: false-negative rate {r['predictor_fnr']:.2%}, up/gate rows computed "
             f"{pct_or_dash(r.get('predicted_density'))} {ev('measured')} (lossy)</li>"
             for r in rows if r.get("predictor_fnr") is not None]
    return f"<p>Activation predictor:</p><ul>{''.join(items)}</ul>" if items else ""


def pct_or_dash(x: float | None) -> str:
    return "—" if x is None else f"{x:.1%}"


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
            + (f"<p>Skipped:</p><ul>{skipped}</ul>" if skipped else "")
            + _predictor_html(result["rows"]))
    base = result.get("baseline", {})
    sub = (f"Baseline {esc(base.get('file'))} [{esc(base.get('mode'))}] · {esc(s.get('prompt_tokens'))} prompt tokens, "
           f"{esc(s.get('new_tokens'))} generated · {esc(result.get('tool', 'aios-run bench'))} "
           f"{esc(result.get('tool_version', ''))}")
    return page("aios-run bench: measured MB/token", sub, [
        ("bench-runs", "Runs", body),
        ("mb-per-token", "MB/token by term (measured)",
                img(plots.mb_per_token([TERM_LABELS[k] for k in TERMS + ("total",)], series), "measured MB per token")),
    ])


ZERO_KEYS = ("mean_exact_zero_fraction", "exact_zero_fraction")
PPL_KEYS = ("heldout_perplexity", "heldout_ppl")


def _get(d: dict, keys: tuple[str, ...]):
    return next((d[k] for k in keys if d.get(k) is not None), None)


def relufy_curve_points(data: dict) -> list[tuple[float, float | None, float | None]]:
    """(step, exact-zero fraction, held-out perplexity), with the converter's start and end
    measurements (``metrics.after_swap`` at step 0, ``metrics.after`` at the last step) added
    when the evaluated curve does not already hold those steps."""
    metrics = data.get("metrics") or {}
    pts = {c["step"]: (_get(c, ZERO_KEYS), _get(c, PPL_KEYS)) for c in data.get("curve") or []}
    start, end = metrics.get("after_swap"), metrics.get("after")
    if isinstance(start, dict) and 0 not in pts:
        pts[0] = (_get(start, ZERO_KEYS), _get(start, PPL_KEYS))
    last = data.get("steps") or (data.get("config") or {}).get("steps")
    if isinstance(end, dict) and last is not None and last not in pts:
        pts[last] = (_get(end, ZERO_KEYS), _get(end, PPL_KEYS))
    return [(k, *pts[k]) for k in sorted(pts)]


def _source(data: dict) -> str:
    src = data.get("source_model") or data.get("source") or "?"
    return str(src.get("model") or src.get("name") or src) if isinstance(src, dict) else str(src)


def _cell(v) -> str:
    if isinstance(v, list):
        return esc(", ".join(f"{x:.3f}" if isinstance(x, float) else str(x) for x in v))
    return fmt(v)


def _training_rows(data: dict) -> list[tuple[str, str]]:
    """(label, value) of the fine-tune run: processes, precision, tokens, measured throughput."""
    t, tp = data.get("training") or {}, data.get("throughput") or {}
    rows = [("processes", t.get("world_size")), ("strategy", t.get("strategy")),
            ("precision", t.get("precision")), ("global batch (tokens)", t.get("global_batch_tokens")),
            ("micro-batch × accumulation", f"{t['micro_batch']} × {t['gradient_accumulation']}"
             if "micro_batch" in t else None),
            ("tokens seen", t.get("tokens_seen")), ("tokens/s (measured)", tp.get("tokens_per_second")),
            ("tokens/s per process", tp.get("per_rank_tokens_per_second")), ("MFU", tp.get("mfu"))]
    return [(k, _cell(v)) for k, v in rows if v is not None]


def relufy_html(data: dict) -> str:
    metrics = data.get("metrics") or {}
    phases = [p for p, v in metrics.items() if isinstance(v, dict)]
    keys = list(dict.fromkeys(k for p in phases for k in metrics[p]))
    summary = (table(["metric", *phases], [[esc(k), *(_cell(metrics[p].get(k)) for p in phases)] for k in keys])
               if keys else "<p>No before/after metrics in this file.</p>")
    scalars = {k: v for k, v in metrics.items() if not isinstance(v, dict)}
    summary += "".join(f"<p>{esc(k)}: <b>{fmt(v)}</b></p>" for k, v in scalars.items())
    cfg = data.get("config")
    summary += (f"<p>{ev('measured')} Numbers measured by the converter on held-out text and the calibration "
                "set (before = source model, after_swap = activation swapped, no training).</p>"
                + (f"<p>Converter config:</p><pre>{esc(json.dumps(cfg))}</pre>" if cfg else ""))
    pts = relufy_curve_points(data)
    if pts:
        steps, zero, ppl = (list(x) for x in zip(*pts))
        before = metrics.get("before") if isinstance(metrics.get("before"), dict) else {}
        floor = requirement("R1")["min_mean_zero_fraction"]
        body = (img(plots.relufy_curve(steps, zero, ppl, floor, _get(before, PPL_KEYS)),
                    "relufy sparsity and perplexity curve")
                + f"<p>{ev('measured')} Exact-zero fraction of FFN activations (R1's measure) and held-out "
                  "perplexity over recovery fine-tuning.</p>"
                + table(["step", "exact-zero fraction", "held-out perplexity"],
                        [[fmt(s), fmt(z), fmt(p)] for s, z, p in pts], {0, 1, 2}))
    else:
        body = '<p class="warn">No curve and no before/after metrics in this file.</p>'
    sub = (f"source <code>{esc(_source(data))}</code> · {esc(data.get('tool', 'aios-convert relufy'))} "
           f"{esc(data.get('tool_version', ''))}")
    sections = [("relufy-summary", "Before and after", summary),
                ("relufy-curve", "Sparsity / perplexity curve", body)]
    run = _training_rows(data)
    if run:
        sections.append(("relufy-training", "Training run", table(["", "value"], [[esc(k), v] for k, v in run])
                         + f"<p>{ev('measured')} Throughput is wall time of the optimisation steps.</p>"))
    return page("aios-convert relufy: sparsity vs perplexity", sub, sections)


def relufy_markdown(data: dict) -> str:
    """The relufy curve and before/after metrics as GitHub-flavoured Markdown."""
    lines = [f"## aios-convert relufy: `{_source(data)}`", ""]
    metrics = {p: v for p, v in (data.get("metrics") or {}).items() if isinstance(v, dict)}
    keys = [k for k in dict.fromkeys(k for v in metrics.values() for k in v)
            if not any(isinstance(v.get(k), list) for v in metrics.values())]
    if keys:
        lines += ["| Metric (measured) | " + " | ".join(metrics) + " |", "|---|" + "---|" * len(metrics)]
        lines += [f"| {k} | " + " | ".join(str(metrics[p].get(k, "—")) for p in metrics) + " |" for k in keys]
        lines.append("")
    pts = relufy_curve_points(data)
    if pts:
        lines += ["| Step | Exact-zero fraction | Held-out perplexity |", "|---|---|---|"]
        lines += [f"| {s} | {'—' if z is None else z} | {'—' if p is None else p} |" for s, z, p in pts]
    run = _training_rows(data)
    if run:
        lines += ["", "| Training run | |", "|---|---|", *(f"| {k} | {v} |" for k, v in run)]
    return "\n".join(lines) + "\n"
