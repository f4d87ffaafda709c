"""``aios-contract``: inspect and check models against the AIOS Model Contract."""

from __future__ import annotations

import json
import sys

import click
from rich.console import Console
from rich.table import Table

from aios.cli_common import EXIT_CODES_HELP, AiosGroup, version_option
from aios.models.aliases import DEFAULT_MODEL

console = Console(highlight=False)


@click.group(cls=AiosGroup, epilog=EXIT_CODES_HELP)
@version_option()
def main() -> None:
    """Check language models against the AIOS Model Contract v1.0 (R1-R5)."""


def _fmt_bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:,.2f} {unit}"
    return f"{n} B"


@main.command()
@click.argument("model", default=DEFAULT_MODEL)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON instead of tables.")
@click.option("--max-tensors", default=60, show_default=True, help="Tensor rows shown (0 = all).")
def inspect(model: str, as_json: bool, max_tensors: int) -> None:
    """Architecture facts and tensor inventory of MODEL (default: the bundled fixture).

    MODEL is a local HF folder, a .gguf file, a hub id in the local Hugging Face cache,
    or a built-in alias (e.g. falcon-7b, llama-3.1-8b, tiny-falcon).
    """
    from contract.inspect import inspect_model

    report = inspect_model(model)
    if as_json:
        json.dump(report, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    m = report["model"]
    f = m["facts"]
    t = Table(title=f"{m['spec']}  ({m['kind']}, architecture row '{m['architecture']}')", show_header=False)
    t.add_column("fact", style="bold")
    t.add_column("value")
    rows = [
        ("source", m["path"] or m["hub_id"]),
        ("layers", f["n_layers"]),
        ("d_model", f["d_model"]),
        ("query heads", f["n_heads"]),
        ("KV heads", f"{f['n_kv_heads']} ({f['attention_kind']})"),
        ("head_dim", f["head_dim"]),
        ("d_ffn", f["d_ffn"]),
        ("FFN activation", f"{f['activation']}  (from {f['activation_key']})"),
        ("gated FFN", f["gated_ffn"]),
        ("parallel attention", f["parallel_attn"]),
        ("vocab", f["vocab_size"]),
        ("max context", f["max_context"]),
        ("tied embeddings", f["tied_embeddings"]),
        ("core zone (R3)", f"layers {f['core_zone'][0]}..{f['core_zone'][1]}"),
        ("llama.cpp FFN activation", report["llama_cpp_ffn_activation"]),
    ]
    for k, v in rows:
        t.add_row(k, str(v))
    console.print(t)
    for note in m["notes"]:
        console.print(f"[yellow]note:[/] {note}")
    if report["tensors"] is None:
        console.print("No weights on this machine: tensor inventory unavailable.")
        return
    inv = Table(title="Tensor inventory (from file headers; no data read)")
    for col, just in (("tensor", "left"), ("shape", "left"), ("dtype", "left"), ("bytes", "right")):
        inv.add_column(col, justify=just)  # type: ignore[arg-type]
    shown = report["tensors"] if max_tensors == 0 else report["tensors"][:max_tensors]
    for row in shown:
        inv.add_row(row["name"], "x".join(map(str, row["shape"])), row["dtype"], f"{row['bytes']:,}")
    console.print(inv)
    totals = report["totals"]
    if len(shown) < totals["tensors"]:
        console.print(f"... {totals['tensors'] - len(shown)} more (use --max-tensors 0 or --json)")
    by = ", ".join(f"{k}: {v['tensors']} tensors, {_fmt_bytes(v['bytes'])}" for k, v in totals["by_dtype"].items())
    console.print(
        f"[bold]Total:[/] {totals['tensors']} tensors, {totals['params']:,} parameters, "
        f"{_fmt_bytes(totals['bytes'])} ({by})"
    )


@main.command()
@click.argument("model")
@click.option("--revision", default="main", show_default=True)
def fetch(model: str, revision: str) -> None:
    """Download MODEL (hub id or alias) into the local Hugging Face cache (safetensors only)."""
    from aios.models.aliases import find_alias
    from aios.models.hub import download

    alias = find_alias(model)
    hub_id = alias.hub_id if alias and alias.hub_id else model
    path = download(hub_id, revision=revision)
    console.print(f"Downloaded {hub_id} to {path}")


if __name__ == "__main__":  # pragma: no cover
    main()
