"""Rendering of ``aios-convert alias`` results (the click command lives in ``convert/cli.py``)."""

from __future__ import annotations

from rich.table import Table

from aios.cli_common import make_console, warn
from convert.alias.posthoc import AliasResult, short_name
from convert.gguf import ExportResult


def render_export(result: ExportResult, dealiased: bool) -> None:
    """One line per GGUF exported from an already aliased folder (``-o`` omitted)."""
    what = ("de-aliased standard GGUF; llama.cpp loads it" if dealiased
            else "aliased; runs in aios-run, not in llama.cpp")
    if "aios.sparse_down.format" in result.metadata:
        what = "aliased, FFN down projections neuron-major (--sparse-down); runs in aios-run, not in llama.cpp"
    make_console().print(f"wrote {result.output} ({what})")


# Held-out perplexity ratio above which an alias result is flagged (the checker's quality gate
# default, `aios-contract check --max-ppl-ratio`).
WARN_PPL_RATIO = 1.10


def quality_warning(before: float, after: float, limit: float = WARN_PPL_RATIO) -> str | None:
    """One sentence when aliasing made held-out perplexity more than ``limit`` times worse."""
    if not before or before <= 0 or after / before <= limit:
        return None
    return (f"held-out perplexity is {after / before:.2f}× the source's ({before:.3f} → {after:.3f}), above "
            f"{limit:.2f}×: `aios-contract check OUT --baseline SOURCE` will fail its quality gate; train "
            "longer, lower --lam, or alias fewer layers/types.")


def render_alias(result: AliasResult) -> None:
    console = make_console()
    rep = result.report
    table = Table(title=f"aios-convert alias ({rep['mode']}) → {result.output}")
    for col in ("matrix", "layers", "status", "cos to canonical (zone)"):
        table.add_column(col)
    for a in rep.get("analysis", []):
        cos = " ".join(f"{float(v):.3f}" for v in a["cos_to_canonical"].values())
        table.add_row(short_name(a["type"]), ",".join(map(str, a["members"] or a["zone_layers"])),
                      "aliased" if a["aliased"] else f"kept: {a['rejected']}", cos)
    if rep.get("analysis"):
        console.print(table)
    al = rep["aliasing"]
    norms = rep.get("delta_norms", [])
    console.print(f"groups: {len(rep['groups'])}; aliasing ratio (measured from the written tensors): core zone "
                  f"{al['core_aliasing_ratio']:.1%} of {al['core_bytes']:,} B, model-wide {al['model_aliasing_ratio']:.1%}"
                  " (canonical charged pro rata to its group)")
    if norms:
        worst = max(norms, key=lambda n: n["rel_delta_norm"])
        console.print(f"‖δ_i‖/‖W_c‖: max {worst['rel_delta_norm']:.1%} ({short_name(worst['type'])}, layer "
                      f"{worst['layer']}); per member in {result.output / 'aios_alias.json'}")
    console.print(f"held-out perplexity (measured): {rep['source_heldout_perplexity']:.3f} → "
                  f"{rep['heldout_perplexity']:.3f} ({rep['perplexity_delta']:+.3f})")
    warning = quality_warning(rep["source_heldout_perplexity"], rep["heldout_perplexity"])
    for w in ([warning] if warning else []) + result.warnings:
        warn(w)  # on stderr: stdout stays the result
    for note in result.notes:
        console.print(note)
    if result.gguf:
        layout = ", FFN down projections neuron-major (--sparse-down)" if result.gguf_sparse_down else ""
        console.print(f"wrote {result.gguf} (aliased{layout}; runs in aios-run, not in llama.cpp)")
    if result.dealiased_gguf:
        console.print(f"wrote {result.dealiased_gguf} (de-aliased standard GGUF; llama.cpp loads it)")
    console.print(f"wrote {result.output}")
