"""Rendering for ``aios-convert sparsify``: phase lines on stderr, the result table on stdout."""

from __future__ import annotations

import json
import time

from rich.table import Table

from aios.cli_common import err_console, make_console
from convert.sparsify.config import SparsifyResult


def sparsify_progress():
    """A progress callback printing each phase once when it starts and once when it is done,
    with its count and elapsed time (log-friendly: no redrawn bar)."""
    state = {"phase": None, "t0": 0.0}

    def progress(phase: str, done: int, total: int) -> None:
        if phase != state["phase"]:
            state["phase"], state["t0"] = phase, time.perf_counter()
            err_console.print(f"[dim]{phase} …[/]")
        if done == total:
            err_console.print(f"[dim]{phase}: {done}/{total} in {time.perf_counter() - state['t0']:.1f} s[/]")

    return progress


def render_sparsify(result: SparsifyResult, as_json: bool = False) -> None:
    console = make_console()
    if as_json:
        console.print_json(json.dumps(result.to_json()))
        return
    c, h = result.calibration, result.heldout
    t = Table(title=f"FFN thresholds ({result.site} site), mean calibrated sparsity {result.target:.1%}",
              title_justify="left")
    for col in ("layer", "zero fraction (calibration)", "threshold", "zero fraction (held-out)"):
        t.add_column(col, justify="right")
    held = h.get("per_layer_exact_zero_fraction") or [None] * len(result.thresholds)
    for i, (s, v, z) in enumerate(zip(result.layer_sparsity, result.thresholds, held)):
        t.add_row(str(i), f"{s:.3f}", f"{v:.4g}", "-" if z is None else f"{z:.3f}")
    console.print(t)
    console.print(f"calibration: {c['tokens_used']:,} tokens of {c['source']}; perplexity "
                  f"{c['ppl_dense']:.3f} dense, ratio {c['ppl_ratio']:.4f} with the thresholds")
    if "r1_aim" in c:
        a = c["r1_aim"]
        tried = "; ".join(f"target {r['target']:.3f} → {r['heldout_zero_fraction']:.1%}" for r in a["rounds"])
        console.print(f"--target r1: aimed at {a['floor'] + a['margin']:.0%} exact zeros on {a['texts']} "
                      f"(R1's {a['floor']:.0%} plus a {a['margin']:.0%} margin): {tried}")
    if h:
        console.print(f"held-out (measured in aios-run, {h['tokens_scored']:,} tokens of {h['source']}): "
                      f"perplexity {h['ppl_dense']:.3f} → {h['ppl_sparse']:.3f} (ratio {h['ppl_ratio']:.4f}); "
                      f"exact zeros {h['mean_exact_zero_fraction']:.1%} of FFN activations")
        if "model_wide_zero_fraction" in h:
            sites = ", ".join(f"{s} {f:.1%}" for s, f in h["site_exact_zero_fraction"].items())
            console.print(f"held-out exact zeros by input site: {sites}; model-wide (weighted by the bytes of "
                          f"the matrices each input feeds) {h['model_wide_zero_fraction']:.1%}")
    secs = ", ".join(f"{k} {v:.1f} s" for k, v in result.seconds.items() if k != "total")
    console.print(f"wrote {result.output} in {result.seconds.get('total', 0):.1f} s ({secs})")
