"""Rendering and the report file of ``aios-convert svd-residual`` (the library:
``convert/svd_residual.py``)."""

from __future__ import annotations

import json
from pathlib import Path

from aios.cli_common import make_console, warn
from aios.io import write_atomic
from convert.lowrank.write import SvdResidualResult


def report_path(output: Path) -> Path:
    """The JSON report beside the GGUF: ``OUT.gguf`` -> ``OUT.svd-residual.json``."""
    return output.with_name(output.stem + ".svd-residual.json")


def write_report(result: SvdResidualResult) -> Path:
    """Write the per-tensor and per-model report atomically next to the output."""
    path = report_path(result.output)
    write_atomic(path, json.dumps(result.to_json(), indent=2, default=_jsonable) + "\n")
    result.report_path = path
    return path


def _jsonable(x):
    if isinstance(x, Path):
        return str(x)
    if hasattr(x, "item"):
        return x.item()
    raise TypeError(type(x))


def _db(x: float | None) -> str:
    if x is None:
        return "—"
    return "∞" if x == float("inf") else f"{x:.1f}"


def render(result: SvdResidualResult, console=None) -> None:
    """Rich table per tensor, then the per-model line (measured in the runtime)."""
    from rich.table import Table

    console = console or make_console()
    cfg = result.config
    table = Table(title=f"svd-residual · {cfg.method} · {cfg.selection} · residual {cfg.residual} "
                        f"· factors {cfg.factor_type}")
    for col in ("Tensor", "Shape", "Rank", "Energy kept", "SQNR dB", "Output SQNR dB", "Bits/weight", "Residual"):
        table.add_column(col, justify="left" if col in ("Tensor", "Shape", "Residual") else "right",
                         no_wrap=col in ("Tensor", "Shape", "Residual"))
    for r in result.rows:
        res = "none" if r.residual_type == "none" else f"{r.residual_type.upper()} {r.residual_layout}"
        res = res.replace(" rows", "")
        table.add_row(r.name, f"{r.shape[0]}×{r.shape[1]}", str(r.rank), f"{r.energy_kept:.3f}", _db(r.sqnr_db),
                      _db(r.output_sqnr_db), f"{r.bits_per_weight:.2f}", res)
    console.print(table)
    console.print("  Energy kept: share of Σσ² of " + ("W·chol(XᵀX+εI) (whitened)" if cfg.method != "plain" else "W")
                  + "; SQNR = 20·log10(‖W‖/‖W−Ŵ‖); output SQNR = 10·log10(tr(WGWᵀ)/tr(ΔGΔᵀ)), G = XᵀX on "
                  "the calibration texts (measured)")
    for r in result.rows:  # fallbacks and warnings on stderr: stdout stays the result
        for note in r.notes:
            warn(f"{r.name}: {note}", "fallback")
    for w in result.warnings:
        warn(w)
    m = result.measured
    if m:
        console.print(f"measured in aios-run: perplexity {m['heldout_perplexity']:.2f} on the bundled held-out "
                      f"passages and {m['pydoc_perplexity']:.2f} on the fixtures' pydoc held-out split "
                      f"({m['heldout_tokens_scored']} and {m['pydoc_tokens_scored']} tokens), "
                      f"{m['weights_mb_per_token']:.4f} MB/token of weights "
                      f"({m['block_weights_mb_per_token']:.4f} in block matrices), "
                      f"{m['mb_per_token_total']:.4f} MB/token in all")
    console.print(f"wrote {result.output}: {result.total_bytes / 2**20:,.2f} MiB of tensor data, "
                  f"{result.bits_per_weight:.2f} bits/weight over the factorized matrices; llama.cpp does not load "
                  f"it (no blk.N.X.weight), aios-run does"
                  + (f"; report {result.report_path}" if result.report_path else ""))
