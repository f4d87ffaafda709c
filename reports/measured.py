"""MB/token by term: the checker's projection beside ``aios-run bench`` measurements.

The check report projects bytes per token for five terms (three weight terms, KV, activation
spill); the runtime measures three (weights, kv_cache, activations). They are joined on those
three terms plus the total. Projected and measured values stay in separate, labelled columns.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from contract.result import CheckReport, Projection

TERMS = ("weights", "kv_cache", "activations")
TERM_LABELS = {"weights": "weights", "kv_cache": "KV cache", "activations": "activations", "total": "total"}
NOT_MEASURED = "not measured — run aios-run bench"


def spec_range(p: Projection | None) -> str:
    """The contract's claimed reduction for the projected tier ("45%–60%"), or "n/a".

    Every rendering of a projection (console, Markdown, HTML) quotes the claim through this.
    """
    lo_hi = p.spec_projected_reduction if p else None
    return f"{lo_hi[0]:.0%}–{lo_hi[1]:.0%}" if lo_hi else "n/a"


def _bench_term(projection_term: str) -> str:
    t = projection_term.lower()
    if t.startswith("weights"):
        return "weights"
    if t.startswith("kv"):
        return "kv_cache"
    return "activations"


@dataclass
class MbColumn:
    label: str
    evidence: str  # "projected" | "measured"
    values: dict[str, float | None]  # term (TERMS + "total") -> MB/token
    note: str = ""


@dataclass
class MbTable:
    """Rows are TERMS + total; columns are projection baseline, projection, measured runs."""

    columns: list[MbColumn] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def measured(self) -> list[MbColumn]:
        return [c for c in self.columns if c.evidence == "measured"]


def bench_label(row: dict) -> str:
    return f"{Path(row['file']).name} [{row['mode']}{', lossy' if row.get('lossy') else ''}]"


def mb_table(report: CheckReport, bench: dict | None) -> MbTable:
    table = MbTable()
    p = report.projection
    if p is not None:
        base = dict.fromkeys(TERMS, 0.0)
        proj = dict.fromkeys(TERMS, 0.0)
        for t in p.terms:
            base[_bench_term(t.term)] += t.baseline_bytes / 1e6
            proj[_bench_term(t.term)] += t.projected_bytes / 1e6
        base["total"], proj["total"] = sum(base.values()), sum(proj.values())
        table.columns += [
            MbColumn("projection: dense baseline", "projected", base, f"context {p.context}"),
            MbColumn("projection: this model", "projected", proj,
                     f"context {p.context}, reduction {p.projected_reduction:.1%}"),
        ]
    if bench:
        s = bench.get("settings", {})
        ctx = s.get("prompt_tokens", 0) + s.get("new_tokens", 0)
        for row in bench.get("rows", []):
            mb = row.get("decode_mb_per_token", {})
            vals: dict[str, float | None] = {t: mb.get(t) for t in TERMS}
            vals["total"] = row.get("decode_mb_per_token_total")
            red = row.get("reduction_vs_baseline")
            note = f"decode after {s.get('prompt_tokens', '?')} prompt tokens (context ≤ {ctx})"
            if red is not None:
                note += f", measured reduction vs bench baseline {red:.1%}"
            table.columns.append(MbColumn(f"measured: {bench_label(row)}", "measured", vals, note))
        if p is not None and ctx and ctx != p.context:
            table.notes.append(f"The projection's KV term is at context {p.context}; the bench decoded at "
                               f"context ≤ {ctx}, so KV bytes differ by construction.")
        table.notes.append("Measured by the runtime's software byte counter (aios-run bench): bytes its kernels "
                           "read per decoded token.")
    else:
        table.notes.append(f"Measured MB/token: {NOT_MEASURED} and pass its JSON with --bench.")
    table.notes.append("Projected columns are a model of savings, not measurements.")
    return table
