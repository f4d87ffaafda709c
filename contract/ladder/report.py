"""The ladder's JSON (schema ``contract/spec/ladder.schema.json``) and Markdown."""

from __future__ import annotations

import json
from pathlib import Path

from contract.spec import SPEC_DIR

SCHEMA_FILE = SPEC_DIR / "ladder.schema.json"

COLUMNS = ("Rung", "Settings", "MB/token measured", "MB/token projected", "Reduction vs source",
           "tok/s ours", "tok/s llama.cpp", "Ratio", "PPL ratio", "Zeros", "Tier")


def ladder_schema() -> dict:
    return json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))


def to_json(report: dict) -> str:
    return json.dumps(report, indent=2, default=str) + "\n"


def settings_text(row: dict) -> str:
    """The few settings that say what a rung is (the record has all of them)."""
    if row["name"] == "dense":
        return "source file"
    if row["status"] == "skipped":
        return "—"
    c = row.get("converter") or {}
    if row["name"] == "sparsify":
        return f"scope all, target {c.get('target')}"
    if row["name"] == "svd-residual":
        return str(c.get("selection", ""))
    if row["name"] == "alias":
        return f"{c.get('groups', 0)} alias groups"
    return "frequency-ordered + manifest" if row["name"] == "layout" else ""


def fmt(v, spec: str = ".4f", pct: bool = False) -> str:
    if v is None:
        return "—"
    return f"{v:.1%}" if pct else format(v, spec)


def table_rows(report: dict) -> list[list[str]]:
    """The ladder table's cells, one list per rung (Markdown and HTML)."""
    out = []
    for r in report["rungs"]:
        m = r["measured"] or {}
        chk = r["check"] or {}
        proj = (chk.get("projection") or {}).get("mb_per_token_total")
        name = f"{r['index']} {r['name']}" + (f" ({r['status']})" if r["status"] in ("skipped", "reused") else "")
        tier = chk.get("tier") or ("check failed" if chk.get("error") else "—")
        out.append([name, settings_text(r), fmt(m.get("mb_per_token_total")), fmt(proj),
                    fmt(r.get("reduction_vs_source"), pct=True), fmt(m.get("decode_tok_s"), ".2f"),
                    fmt(m.get("llamacpp_tok_s"), ".2f"), fmt(m.get("ratio_vs_llamacpp"), ".2f"),
                    fmt(r.get("ppl_ratio"), ".3f"), fmt(m.get("exact_zero_fraction"), pct=True), tier])
    return out


def to_markdown(report: dict) -> str:
    s = report["settings"]
    lines = [f"## AIOS tier ladder: `{report['source']['file']}`", "",
             (f"Perplexity budget {s['budget_ppl']:g}× (held-out, {s['heldout_tokens']} tokens); "
              f"{s['decode_tokens']} decode tokens after {s['prompt_tokens']} prompt tokens, {s['rounds']} alternated "
              f"rounds, {s['threads']} threads. MB/token *measured* by aios-run's byte counter; *projected* by "
              "`aios-contract check` (a model, not a measurement)."), "",
             "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(c.replace("|", "/") for c in row) + " |" for row in table_rows(report)]
    lines.append("")
    llama = report.get("llamacpp")
    if llama:
        lines.append(f"llama.cpp: {llama['engine']} {llama.get('llama_cpp_python') or ''}, dense decode of the source "
                     f"file, {llama['threads']} threads, n_ctx {llama['n_ctx']}, {llama['buffers']}"
                     + (f"; stopped: {llama['failed']}" if llama.get("failed") else "") + ".")
    else:
        lines.append("llama.cpp: not run (--no-llamacpp).")
    for r in report["rungs"]:
        if r["status"] == "skipped":
            lines.append(f"- Rung {r['index']} {r['name']} skipped (built on {r['built_on']}): {r['reason']}")
        for note in r.get("notes") or []:
            lines.append(f"- Rung {r['index']} {r['name']}: {note}")
        if r.get("not_measured"):
            lines.append(f"- Rung {r['index']} {r['name']} built, not measured: {r['not_measured']}")
        pm = r.get("projection_vs_measured")
        if pm and pm["differs"]:
            lines.append(f"- Rung {r['index']} {r['name']}: projected {pm['projected_mb_per_token']:.4f} vs measured "
                         f"{pm['measured_mb_per_token']:.4f} MB/token ({fmt(pm['difference'], pct=True)}); "
                         "terms differing > 5 %: " + "; ".join(
                             f"{t['term']} (projected {t['projected_mb']:.4f}, measured {t['measured_mb']:.4f}: "
                             f"{t['why']})" for t in pm["terms"] if t["differs"]))
        err = (r.get("check") or {}).get("error")
        if err:
            lines.append(f"- Rung {r['index']} {r['name']}: check could not run: {err}")
    b, g = report["best"], report["gate"]
    lines += ["", (f"Best rung within the budget: **{b['rung']}**, measured reduction "
                   f"{fmt(b['reduction_vs_source'], pct=True)}, perplexity ratio {fmt(b['ppl_ratio'], '.3f')}."),
              f"Gate: {g['reason']} (exit {g['exit_code']})."]
    return "\n".join(lines) + "\n"


def write_json_md(report: dict, out: Path) -> list[Path]:
    from aios.io import write_atomic

    return [write_atomic(out / "ladder.json", to_json(report)), write_atomic(out / "ladder.md", to_markdown(report))]
