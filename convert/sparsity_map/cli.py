"""Rendering for ``aios-convert sparsity-map``: per-layer skip fractions and the measured effect."""

from __future__ import annotations

from rich.table import Table

from aios.cli_common import make_console
from convert.sparsity_map import SparsityMapResult


def render_sparsity_map(result: SparsityMapResult) -> None:
    h = result.header
    t = Table(title=f"sparsity map for {h['model']} ({h['mode']}, budget < {h['budget_pct']} % Δppl)")
    for col in ("layer", "kept", "skipped", "skip fraction"):
        t.add_column(col, justify="right")
    for i, kept in enumerate(h["per_layer_kept"]):
        t.add_row(str(i), str(kept), str(h["d_ffn"] - kept), f"{h['per_layer_skip_fraction'][i]:.3f}")
    console = make_console()
    console.print(t)
    console.print(f"skipped {h['skip_fraction']:.2%} of FFN neurons; held-out ppl "
                  f"{h['heldout_ppl_without']:.4f} without, {h['heldout_ppl_with']:.4f} with the map "
                  f"({h['ppl_change_pct']:+.4f} %, {len(h['search'])} measured probes)")
    console.print(f"false-negative rate (nonzero activations in skipped neurons): "
                  f"{h['false_negative_rate']:.4%} on held-out text, "
                  f"{h['false_negative_rate_bundled_heldout']:.4%} on the bundled held-out passages")
    console.print(f"wrote {result.path} and {result.path.with_suffix('.json')}")
