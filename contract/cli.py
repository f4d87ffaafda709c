"""``aios-contract``: inspect and check models against the AIOS Model Contract.

The top layer: commands parse options, call one library function and render. This module may
import anything (``contract``, ``reports``, ``aios``); the library modules of ``contract`` never
import ``reports`` or this module — rendering of check results lives in ``reports``.
"""

from __future__ import annotations

import json
import sys

import click
from rich.table import Table

from aios.cli_common import EXIT_CODES_HELP, AiosGroup, make_console, version_option
from contract.checks.base import fmt_bytes
from contract.spec import tier_ids

console = make_console()


@click.group(cls=AiosGroup, epilog=EXIT_CODES_HELP)
@version_option()
def main() -> None:
    """Check language models against the AIOS Model Contract v1.0 (R1-R5)."""


ALLOW_PICKLE_HELP = ("Read pickled .bin/.pt weights (refused by default) with torch's weights-only "
                     "loader, which rejects any pickle that would run code.")


def _model_arg(model: str, allow_pickle: bool):
    """MODEL as typed, or an already resolved handle when pickles are allowed.

    MODEL is required and may not be empty (``check $MODEL`` with the variable unset): that is
    a usage error (exit 2), never a silent check of the bundled model.
    """
    from aios.errors import UsageError

    if not model.strip():
        raise UsageError("MODEL is empty; pass a folder, a .gguf file, a hub id or an alias "
                         "(the bundled model by its name: tiny-falcon).")
    if not allow_pickle:
        return model
    from aios.models import resolve_model

    return resolve_model(model, allow_pickle=True)


@main.command()
@click.argument("model")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON instead of tables.")
@click.option("--max-tensors", default=60, show_default=True, help="Tensor rows shown (0 = all).")
@click.option("--allow-pickle", is_flag=True, help=ALLOW_PICKLE_HELP)
def inspect(model: str, as_json: bool, max_tensors: int, allow_pickle: bool) -> None:
    """Architecture facts and tensor inventory of MODEL (e.g. the bundled tiny-falcon).

    MODEL is a local HF folder, a .gguf file, a hub id in the local Hugging Face cache,
    or a built-in alias (e.g. falcon-7b, llama-3.1-8b, tiny-falcon).
    """
    from contract.inspect import inspect_model

    report = inspect_model(_model_arg(model, allow_pickle))
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
    by = ", ".join(f"{k}: {v['tensors']} tensors, {fmt_bytes(v['bytes'], group_bytes=False)}"
                   for k, v in totals["by_dtype"].items())
    console.print(
        f"[bold]Total:[/] {totals['tensors']} tensors, {totals['params']:,} parameters, "
        f"{fmt_bytes(totals['bytes'], group_bytes=False)} ({by})"
    )


@main.command()
@click.argument("model")
@click.option("--calibration", type=click.Path(dir_okay=False), help="JSONL (text field) or TXT prompts; default: bundled set.")
@click.option("--samples", type=int, default=None, help="Use only the first N calibration samples.")
@click.option("--max-tokens", type=int, default=128, show_default=True, help="Tokens per calibration sample (each sample is cut to this many).")
@click.option("--full-calibration", is_flag=True,
              help="R1 on a GGUF: run every calibration sample, even after the set's pass or fail is settled.")
@click.option("--require-tier", type=click.Choice(tier_ids()), default=None,
              help="Exit 1 unless the model reaches this tier.")
@click.option("--require", "require", default="", help="Comma-separated requirements that must pass, e.g. R1,R3.")
@click.option("--context", "--ctx", "context", type=int, default=4096, show_default=True,
              help="Context length for KV bytes and the projection (with --bench: the bench's, unless given).")
@click.option("--format", "formats", default="json,md,junit", show_default=True,
              help="Report formats written to -o DIR: json, md, junit, html, sarif.")
@click.option("--bench", "bench_file", type=click.Path(dir_okay=False), default=None,
              help="aios-run bench JSON: its measured MB/token goes beside the projection in md/html.")
@click.option("-o", "--output", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Folder for the reports (default: print only).")
@click.option("--baseline", default=None, metavar="SOURCE",
              help="Quality gate: also measure the held-out perplexity of SOURCE (the model MODEL was "
                   "converted from) and of MODEL; exit 1 when their ratio exceeds --max-ppl-ratio.")
@click.option("--max-ppl-ratio", type=float, default=1.10, show_default=True,
              help="With --baseline: largest allowed perplexity(MODEL) / perplexity(SOURCE).")
@click.option("--json", "as_json", is_flag=True,
              help="Print the report as JSON (the aios-report.json schema) instead of tables.")
@click.option("--allow-pickle", is_flag=True, help=ALLOW_PICKLE_HELP)
def check(model, calibration, samples, max_tokens, full_calibration, require_tier, require, context, formats, bench_file,
          out_dir, baseline, max_ppl_ratio, as_json, allow_pickle) -> None:
    """Score MODEL against R1-R5 by measurement; the exit code is the CI gate.

    Without --require-tier/--require/--baseline the exit code is 0 whenever the check ran.
    """
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from contract.check import check_model
    from reports.check_reports import FORMATS, print_check, write_reports
    from reports.load import load_bench

    fmts = _formats(formats, FORMATS, "report")
    _require_output_for_formats(out_dir)
    bench = load_bench(bench_file) if bench_file else None  # fail fast (exit 4) before measuring
    if bench is not None and click.get_current_context().get_parameter_source("context") is \
            click.core.ParameterSource.DEFAULT:
        s = bench.get("settings", {})
        ran = int(s.get("prompt_tokens", 0) or 0) + int(s.get("new_tokens", 0) or 0)
        if ran > 0:  # projected and measured side by side at the same context (KV bytes grow with it)
            context = ran
            make_console(stderr=True).print(f"[dim]projecting at the bench's context, {ran} tokens "
                                            "(--context sets another)[/]", soft_wrap=True)
    bar_console = make_console(stderr=True)  # a live bar only on a terminal (not in a CI log)
    if str(model).endswith(".gguf"):  # a GGUF is measured in aios-run: say when its kernels compile first
        from runtime import compile_notice

        line = compile_notice(())
        if line:
            bar_console.print(f"[dim]{line}…[/]", soft_wrap=True, highlight=False)
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=bar_console, transient=True,
                  disable=not bar_console.is_terminal or bar_console.quiet) as bar:
        tasks: dict[str, int] = {}

        def progress(desc: str, done: int, total: int) -> None:
            if desc not in tasks:
                tasks[desc] = bar.add_task(desc, total=total)
                if bar.disable:  # a CI log: one plain line per step instead of a live bar
                    bar_console.print(f"[dim]{desc}…[/]", soft_wrap=True)
            bar.update(tasks[desc], completed=done, total=total)

        report = check_model(_model_arg(model, allow_pickle), calibration=calibration, samples=samples,
                             max_tokens=max_tokens, full_calibration=full_calibration, context=context, require_tier=require_tier,
                             require=require.split(",") if require else [], progress=progress,
                             baseline=_model_arg(baseline, allow_pickle) if baseline is not None else None,
                             max_ppl_ratio=max_ppl_ratio)
    if as_json:
        from reports.check_reports import to_json

        click.echo(to_json(report))
    else:
        print_check(report, console)
    if out_dir:
        for p in write_reports(report, out_dir, fmts, bench=bench):
            (make_console(stderr=True) if as_json else console).print(f"wrote {p}")
    sys.exit(report.gate.exit_code)


def _require_output_for_formats(out_dir: str | None) -> None:
    """``--format`` names files to write: without ``-o`` nothing would be written, so say so (exit 2)."""
    from click.core import ParameterSource

    from aios.errors import UsageError

    ctx = click.get_current_context()
    if out_dir is None and ctx.get_parameter_source("formats") == ParameterSource.COMMANDLINE:
        raise UsageError(f"--format {ctx.params['formats']} names report files, but without -o DIR nothing "
                         "is written; pass -o DIR (or drop --format to print only).")


def _formats(formats: str, allowed: tuple[str, ...] | None = None, what: str = "") -> list[str]:
    """``--format a,b`` as a list; with ``allowed``, an unknown one is a usage error (exit 2)."""
    from aios.errors import UsageError

    fmts = [f.strip() for f in formats.split(",") if f.strip()]
    bad = [f for f in fmts if allowed is not None and f not in allowed]
    if bad:
        raise UsageError(f"Unknown {what} format {', '.join(bad)}; "
                         f"choose from {', '.join(allowed or ())}.")
    return fmts


@main.command("ladder")
@click.argument("model")
@click.option("-o", "--output", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Folder for the rungs' artifacts, their records and ladder.json/md/html (rerun: resumes).")
@click.option("--budget-ppl", type=float, default=1.10, show_default=True,
              help="Largest held-out perplexity ratio vs the source a rung may cost.")
@click.option("--tiers", default="sparsify,alias,svd-residual,layout", show_default=True,
              help="Tiers to build, in order, each on the last rung built.")
@click.option("--require-reduction", type=float, default=None, metavar="X",
              help="Gate: exit 1 unless the best rung within the budget cuts measured MB/token by ≥ X (e.g. 0.3).")
@click.option("--heldout-tokens", type=int, default=4096, show_default=True, help="Held-out tokens per perplexity.")
@click.option("--decode-tokens", type=int, default=32, show_default=True, help="Decode steps per measurement round.")
@click.option("--rounds", type=int, default=3, show_default=True, help="Alternated timing rounds, ours and llama.cpp.")
@click.option("--calibration-tokens", type=int, default=2048, show_default=True, help="sparsify's calibration tokens.")
@click.option("--calibration-samples", type=int, default=None,
              help="Calibration texts of svd-residual and layout [default: all bundled].")
@click.option("--threads", type=int, default=None, help="Threads of both engines [default: physical cores].")
@click.option("--no-llamacpp", is_flag=True, help="Skip llama.cpp's dense decode of the source.")
def ladder(model, out_dir, budget_ppl, tiers, require_reduction, heldout_tokens, decode_tokens, rounds,
           calibration_tokens, calibration_samples, threads, no_llamacpp) -> None:
    """Build MODEL's tier ladder (a GGUF, or an HF folder) and measure every rung.

    Exit 1 when --require-reduction is not met, else 0 (docs/commands.md).
    """
    from contract.ladder import LadderConfig, parse_tiers, run_ladder
    from contract.ladder.report import to_markdown
    from reports.ladder import write_ladder

    cfg = LadderConfig(budget_ppl=budget_ppl, tiers=parse_tiers(tiers), require_reduction=require_reduction,
                       heldout_tokens=heldout_tokens, decode_tokens=decode_tokens, rounds=rounds,
                       llamacpp=not no_llamacpp, calibration_tokens=calibration_tokens,
                       calibration_samples=calibration_samples, threads=threads)
    err = make_console(stderr=True)
    report = run_ladder(_model_arg(model, False), out_dir, cfg,
                        log=lambda m: err.print(m, soft_wrap=True, markup=False, highlight=False))
    for p in write_ladder(report, out_dir):
        err.print(f"wrote {p}", soft_wrap=True, markup=False, highlight=False)
    click.echo(to_markdown(report), nl=False)
    sys.exit(report["gate"]["exit_code"])


@main.command("compare")
@click.argument("report_a", metavar="A.json")
@click.argument("report_b", metavar="B.json")
@click.option("--format", "formats", default="text,md,json", show_default=True,
              help="Formats written to -o DIR: text, md, json, junit, sarif, html.")
@click.option("-o", "--output", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Folder for the comparison files (default: print only).")
def compare_cmd(report_a, report_b, formats, out_dir) -> None:
    """What changed from check report A (release N) to B (release N+1).

    Exit 1 when a requirement that passed in A does not pass in B, else 0.
    """
    from reports.compare import FORMATS, compare, to_text, write_comparison
    from reports.load import load_check_report

    fmts = _formats(formats, FORMATS, "compare")
    _require_output_for_formats(out_dir)
    c = compare(load_check_report(report_a), load_check_report(report_b), report_a, report_b)
    click.echo(to_text(c), nl=False)
    if out_dir:
        for p in write_comparison(c, out_dir, fmts):
            console.print(f"wrote {p}")
    sys.exit(c.exit_code)


@main.command()
@click.argument("file", metavar="FILE.json")
@click.option("--format", "formats", default="html,md", show_default=True,
              help="Formats to write (html and md for every kind; check and compare results also json, junit, sarif).")
@click.option("--bench", "bench_file", type=click.Path(dir_okay=False), default=None,
              help="aios-run bench JSON for the measured MB/token column of a check report.")
@click.option("-o", "--output", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Folder for the reports (default: the folder of FILE).")
def report(file, formats, bench_file, out_dir) -> None:
    """Render FILE.json written by aios-contract check/compare, aios-run bench or aios-convert relufy.

    The kind is detected from the JSON.
    """
    from reports.load import load_bench
    from reports.render import render_file

    kind, paths = render_file(file, _formats(formats), out_dir, bench=load_bench(bench_file) if bench_file else None)
    for p in paths:
        console.print(f"wrote {p} ({kind})")


@main.command()
@click.argument("model")
@click.option("--revision", default="main", show_default=True,
              help="Branch, tag or commit of the hub repository to download.")
def fetch(model: str, revision: str) -> None:
    """Download MODEL (hub id or alias) into the local Hugging Face cache (safetensors only)."""
    from aios.models.aliases import find_alias
    from aios.models.hub import download

    alias = find_alias(model)
    if alias is not None and alias.local_path is not None:  # bundled: nothing to download
        console.print(f"{alias.name} is bundled with the toolchain ({alias.local_path}); nothing to fetch.")
        return
    hub_id = alias.hub_id if alias and alias.hub_id else model
    path = download(hub_id, revision=revision)
    console.print(f"Downloaded {hub_id} to {path}")


if __name__ == "__main__":  # pragma: no cover
    main()
