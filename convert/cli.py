"""``aios-convert``: turn models into contract-satisfying artifacts."""

from __future__ import annotations

import click

from aios.cli_common import EXIT_CODES_HELP, AiosGroup, version_option


@click.group(cls=AiosGroup, epilog=EXIT_CODES_HELP)
@version_option()
def main() -> None:
    """Convert models: relufy, sparsity maps, aliasing, low-rank + residual, GGUF export."""


# --- GGUF export and R5 layout (issue 5) ----------------------------------------------------


@main.command("gguf")
@click.argument("model")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="Output .gguf file.")
@click.option("--outtype", type=click.Choice(["f32", "f16", "bf16", "q8_0", "q4_0"]), default="f16",
              show_default=True, help="Type of 2-D weights (norms and biases stay F32).")
@click.option("--sparsity-map", type=click.Path(dir_okay=False), default=None,
              help="Embed a sparsity map (.npz) as blk.N.ffn_active masks (file then runs in aios-run only).")
@click.option("--dry-run", is_flag=True, help="Print the tensor plan and metadata; write nothing.")
def gguf_command(model: str, output: str, outtype: str, sparsity_map: str | None, dry_run: bool) -> None:
    """Export MODEL (falcon, llama family, gpt2) to a GGUF file llama.cpp loads."""
    from rich.console import Console

    from convert.gguf_export import GGUFExportConfig, export_gguf

    console = Console(highlight=False)
    result = export_gguf(model, output, GGUFExportConfig(outtype, sparsity_map), dry_run=dry_run)
    if dry_run:
        for p in result.plan:
            fb = f"  (fallback: {p.fallback})" if p.fallback else ""
            console.print(f"{p.name:32} {str(list(p.shape)):16} {p.source_dtype:>4} -> {p.outtype.upper():5} "
                          f"{p.nbytes:>12,} B{fb}")
        for k, v in result.metadata.items():
            console.print(f"{k} = {v}")
    for w in result.warnings:
        console.print(f"[yellow]warning:[/] {w}")
    for f in result.fallbacks:
        console.print(f"[yellow]fallback:[/] {f}")
    where = "would write" if dry_run else "wrote"
    console.print(f"{where} {output}: {len(result.plan)} tensors, {result.total_bytes / 2**20:,.2f} MiB of "
                  f"tensor data, {outtype}, {len(result.fallbacks)} fallback(s); llama.cpp "
                  f"{result.llama_cpp_status}")


@main.command("layout")
@click.argument("model")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="Output .gguf file.")
@click.option("--calibration", type=click.Path(dir_okay=False), default=None,
              help="JSONL/TXT calibration texts (default: the bundled set).")
@click.option("--samples", type=click.IntRange(min=1), default=None, help="Use the first N texts.")
@click.option("--max-tokens", type=click.IntRange(min=1), default=128, show_default=True)
def layout_command(model: str, output: str, calibration: str | None, samples: int | None, max_tokens: int) -> None:
    """Rewrite MODEL.gguf with blocks in descending access frequency and an R5 manifest."""
    from collections import Counter

    from rich.console import Console

    from convert.layout import LayoutConfig, layout_gguf

    console = Console(highlight=False)
    result = layout_gguf(model, output, LayoutConfig(calibration, samples, max_tokens))
    access = Counter(b.access for b in result.blocks)
    tiers = Counter(b.tier for b in result.blocks)
    console.print("measured FFN read fraction per layer: "
                  + " ".join(f"{x:.3f}" for x in result.ffn_read_fraction))
    console.print(f"wrote {result.output} ({len(result.blocks)} blocks: "
                  + ", ".join(f"{access[k]} {k}" for k in ("high", "medium", "low")) + "; "
                  + ", ".join(f"{tiers[k]} {k}" for k in ("HOT", "WARM", "STREAM"))
                  + f") with aios.manifest embedded and {result.sidecar}")
