"""``aios-convert``: turn models into contract-satisfying artifacts.

The top layer: each command parses options, calls one library entry point and renders (the
renderers are each converter package's ``cli.py``). It may compose packages (``svd-residual`` runs its file
in ``runtime``); the library modules it calls never import it. Option choices come from the
library modules' own vocabularies, all importable without torch.
"""

from __future__ import annotations

from pathlib import Path

import click

from aios.cli_common import EXIT_CODES_HELP, AiosGroup, make_console, version_option, warn
from convert.alias.config import CANONICAL_MODES, DELTA_NORMS, GGUF_OUTTYPES
from convert.gguf import OUTTYPES
from convert.lowrank.config import BASE_TYPES, FACTOR_TYPES, METHODS, RESIDUALS
from convert.relufication.config import DEVICES, RelufyConfig
from convert.sparsify.config import ALLOCATIONS as SPARSIFY_ALLOCATIONS
from convert.sparsify.config import SCOPES as SPARSIFY_SCOPES
from convert.sparsify.config import SITES as SPARSIFY_SITES
from convert.sparsity_map import MODES as SPARSITY_MODES


def _model_types(export_only: bool = False) -> str:
    """The HF ``model_type`` values of the architecture table's rows (aios/models/architectures.py),
    in row order: the help texts name them from the table, so a new row shows up by itself."""
    from aios.models.architectures import ARCHITECTURES, exportable_model_types

    if export_only:
        return ", ".join(exportable_model_types())
    return ", ".join(dict.fromkeys(t for a in ARCHITECTURES for t in a.hf_model_types if t.islower()))


@click.group(cls=AiosGroup, epilog=EXIT_CODES_HELP,
             help="Convert models: relufy, sparsity maps, aliasing, low-rank + residual, GGUF export.\n\n"
                  f"Architectures (HF model_type): {_model_types()}; which command supports which is the "
                  "README's support matrix.")
@version_option()
def main() -> None:
    """(The help above names the architecture table's model types; a docstring cannot.)"""


# --- GGUF export and R5 layout ----------------------------------------------------------------


@main.command("gguf", short_help="Export MODEL to a GGUF file llama.cpp loads.",
              help=f"Export MODEL (HF model_type {_model_types(export_only=True)}) to a GGUF file llama.cpp "
                   "loads.")
@click.argument("model")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="Output .gguf file.")
@click.option("--outtype", type=click.Choice(OUTTYPES, case_sensitive=False),
              default="f16", show_default=True,
              help="Type of 2-D weights (norms and biases stay F32; rows that do not fit the type's "
                   "blocks fall back per tensor, reported).")
@click.option("--sparsity-map", type=click.Path(dir_okay=False), default=None,
              help="Embed a sparsity map (.npz) as blk.N.ffn_active masks (file then runs in aios-run only).")
@click.option("--sparse-down", is_flag=True,
              help="Store FFN down projections neuron-major (blk.N.ffn_down.t) so aios-run's sparse modes "
                   "skip non-firing neurons in any type; the file is for aios-run, not llama.cpp.")
@click.option("--like", type=click.Path(dir_okay=False), default=None, metavar="SOURCE.gguf",
              help="Write each tensor in the type SOURCE.gguf has for it (e.g. the llama.cpp Q4_K_M file the "
                   "model came from: the same quant mix back); --outtype types the tensors it lacks.")
@click.option("--dry-run", is_flag=True, help="Print the tensor plan and metadata; write nothing.")
def gguf_command(model: str, output: str, outtype: str, sparsity_map: str | None, sparse_down: bool,
                 like: str | None, dry_run: bool) -> None:
    from convert.gguf import GGUFExportConfig, export_gguf

    console = make_console()
    result = export_gguf(model, output, GGUFExportConfig(outtype, sparsity_map, sparse_down=sparse_down,
                                                         like=like), dry_run=dry_run)
    if dry_run:
        for p in result.plan:
            fb = f"  (fallback: {p.fallback})" if p.fallback else ""
            console.print(f"{p.name:32} {str(list(p.shape)):16} {p.source_dtype:>4} -> {p.outtype.upper():5} "
                          f"{p.nbytes:>12,} B{fb}")
        for k, v in result.metadata.items():
            console.print(f"{k} = {v}")
    for w in result.warnings:  # warnings on stderr: stdout is the plan and the "wrote" line
        warn(w)
    from convert.gguf.plan import fallback_summary

    for f in fallback_summary(result.plan):  # one line per repeated fallback; the file lists each tensor
        warn(f, "fallback")
    where = "would write" if dry_run else "wrote"
    console.print(f"{where} {output}: {len(result.plan)} tensors, {result.total_bytes / 2**20:,.2f} MiB of "
                  f"tensor data, {f'types of {Path(like).name}' if like else outtype}, "
                  f"{len(result.fallbacks)} fallback(s); llama.cpp "
                  f"{result.llama_cpp_status}")


def _tenths(what: str):
    """A (done, total) progress callback printing one stderr line per tenth (long runs in a log)."""
    from aios.cli_common import err_console

    shown = {-1}

    def progress(done: int, total: int) -> None:
        tenth = done * 10 // max(1, total)
        if tenth not in shown:
            shown.add(tenth)
            err_console.print(f"[dim]{what}: {done}/{total} texts[/]")

    return progress


@main.command("layout")
@click.argument("model")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="Output .gguf file.")
@click.option("--calibration", type=click.Path(dir_okay=False), default=None,
              help="JSONL/TXT calibration texts (default: the bundled set).")
@click.option("--samples", type=click.IntRange(min=1), default=None, help="Use the first N texts.")
@click.option("--max-tokens", type=click.IntRange(min=1), default=128, show_default=True,
              help="Tokens per calibration text.")
def layout_command(model: str, output: str, calibration: str | None, samples: int | None, max_tokens: int) -> None:
    """Rewrite MODEL.gguf with blocks in descending access frequency and an R5 manifest."""

    from convert.layout import LayoutConfig, layout_gguf

    console = make_console()
    result = layout_gguf(model, output, LayoutConfig(calibration, samples, max_tokens),
                         progress=_tenths("layout: measuring access frequencies"))
    console.print("measured FFN read fraction per layer: "
                  + " ".join(f"{x:.3f}" for x in result.ffn_read_fraction))
    console.print(f"wrote {result.output} ({len(result.blocks)} blocks: {result.summary()}) "
                  f"with aios.manifest embedded and {result.sidecar}")


# --- relufy and sparsity maps ----------------------------------------------------------------


def _relufy_default(name: str):
    return getattr(RelufyConfig(), name)


@main.command("relufy")
@click.argument("model")
@click.option("-o", "--output", "out", required=True, type=click.Path(file_okay=False),
              help="Output HF folder (must not exist; work state goes to OUT.partial/).")
@click.option("--activation", default="relu", show_default=True,
              help="relu or relu2 (fatrelu:T is refused: stock transformers cannot load it).")
@click.option("--train-data", default=None, metavar="PATH|DIR|GLOB",
              help="JSONL (text field), TXT or Parquet (text column) corpus, streamed: a file, a "
                   "folder, a glob or a cached hub dataset id (default: the fixtures' pydoc train split).")
@click.option("--heldout-data", type=click.Path(dir_okay=False), default=None,
              help="JSONL/TXT held-out text for perplexity (default: the pydoc held-out split).")
@click.option("--steps", type=int, default=_relufy_default("steps"), show_default=True,
              help="Optimisation steps after the activation swap.")
@click.option("--tokens", default=None, metavar="N",
              help="Token budget instead of --steps (2B, 500M, 64k): steps = N / global batch tokens.")
@click.option("--lr", type=float, default=_relufy_default("lr"), show_default=True, help="Peak learning rate.")
@click.option("--batch", type=int, default=_relufy_default("batch"), show_default=True,
              help="Global batch in windows per step, over all processes.")
@click.option("--batch-tokens", type=int, default=None,
              help="Global batch in tokens instead of --batch (a multiple of --seq-len).")
@click.option("--micro-batch", type=int, default=None,
              help="Windows per forward pass per process; the rest is gradient accumulation "
                   "[default: the process's whole share].")
@click.option("--seq-len", type=int, default=_relufy_default("seq_len"), show_default=True,
              help="Tokens per training window.")
@click.option("--l1", type=float, default=_relufy_default("l1"), show_default=True,
              help="Final weight of the progressive activation-L1 penalty (0 = off).")
@click.option("--device", type=click.Choice(DEVICES), default="auto", show_default=True,
              help="cuda trains with bf16 autocast.")
@click.option("--gradient-checkpointing", is_flag=True,
              help="Recompute activations in the backward pass (less memory, ~30 % more compute).")
@click.option("--checkpoint-every", type=int, default=50, show_default=True,
              help="Steps between checkpoints in OUT.partial/ (0: none).")
@click.option("--seed", type=int, default=_relufy_default("seed"), show_default=True,
              help="Seed of the data order and initialisation (same seed, same output).")
@click.option("--resume", is_flag=True, help="Continue the interrupted run kept in OUT.partial/.")
@click.option("--init-thresholds", default=None, metavar="FILE",
              help="Warm start: train with the calibrated down-projection cuts of FILE (a GGUF of this "
                   "model from `aios-convert sparsify`) in place; they become part of OUT.")
@click.option("--anneal", type=float, default=_relufy_default("anneal"), show_default=True,
              help="With --init-thresholds: fraction of the steps over which the activation moves "
                   "from the source's to ReLU (0: swap at once).")
def relufy_command(model: str, out: str, activation: str, train_data: str | None, resume: bool,
                   device: str, heldout_data: str | None, tokens: str | None, init_thresholds: str | None,
                   batch_tokens: int | None, micro_batch: int | None, gradient_checkpointing: bool,
                   checkpoint_every: int, **options) -> None:
    """Swap MODEL's FFN activation to ReLU and fine-tune to recover (R1).

    Runs on one device as is; under `accelerate launch` or `torchrun` on every process they
    start (DDP, or FSDP from an accelerate config), rank 0 reporting and writing OUT.
    """
    from dataclasses import replace

    from aios.errors import UsageError
    from convert.relufication.cli import relufy_progress, render_relufy
    from convert.relufy import RelufyConfig, parse_activation, relufy

    if batch_tokens is not None:
        if batch_tokens % options["seq_len"]:
            raise UsageError(f"--batch-tokens {batch_tokens} is not a multiple of --seq-len "
                             f"{options['seq_len']}.")
        options["batch"] = batch_tokens // options["seq_len"]
    cfg = replace(RelufyConfig(), activation=parse_activation(activation), **options)
    with relufy_progress() as progress:
        result = relufy(model, out, cfg, train_data=train_data, device=device, resume=resume,
                        progress=progress, micro_batch=micro_batch, heldout_data=heldout_data,
                        gradient_checkpointing=gradient_checkpointing, tokens=tokens,
                        checkpoint_every=checkpoint_every, init_thresholds=init_thresholds)
    if result.is_main:
        render_relufy(result)


def refuse_smooth_activation(model: str) -> None:
    """A sparsity map skips neurons that are exactly zero most of the time; with GELU/SiLU no
    neuron ever is, so the map would be meaningless: refuse it (exit 4) and say what to do."""
    from aios.errors import InvalidModelError
    from aios.models import resolve_model
    from contract.spec import requirement

    facts = resolve_model(model).facts
    if facts.activation.lower() not in requirement("R1")["relu_family"]:
        raise InvalidModelError(
            f"'{model}' uses {facts.activation}, which never yields exact zeros, so a sparsity map of it "
            f"would be meaningless; relufy it first (`aios-convert relufy {model} -o OUT`).")


@main.command("sparsity-map")
@click.argument("model")
@click.option("--calibration", type=click.Path(dir_okay=False), default=None,
              help="JSONL/TXT calibration texts for neuron frequencies (default: the bundled set).")
@click.option("--mode", type=click.Choice(SPARSITY_MODES), default="conservative",
              show_default=True, help="Held-out perplexity budget: < 0.1 %, < 0.5 %, or --budget.")
@click.option("--budget", type=float, default=None, help="Perplexity budget in percent (aggressive mode).")
@click.option("-o", "--output", "out", required=True, type=click.Path(dir_okay=False),
              help="Output MAP.npz (a MAP.json header is written beside it).")
def sparsity_map_command(model: str, calibration: str | None, mode: str, budget: float | None, out: str) -> None:
    """Static mask of FFN neurons to skip, chosen by measured held-out perplexity."""
    from aios.cli_common import err_console
    from convert.sparsity_map import SparsityMapConfig, sparsity_map
    from convert.sparsity_map.cli import render_sparsity_map

    refuse_smooth_activation(model)

    result = sparsity_map(model, out, SparsityMapConfig(mode=mode, budget_pct=budget), calibration=calibration,
                          progress=lambda message: err_console.print(f"[dim]{message}[/]"))
    render_sparsity_map(result)


@main.command("sparsify", short_help="Exact-zero FFN activations without training: calibrated thresholds.")
@click.argument("model")
@click.option("-o", "--output", "out", required=True, type=click.Path(dir_okay=False),
              help="Output .gguf: MODEL's tensors unchanged plus the aios.ffn_threshold.* keys.")
@click.option("--target", default=None,
              help="Mean FFN zero fraction over layers on the calibration tokens  [default: 0.5]; or r1: "
                   "the contract's R1 (70 %) with a margin measured on held-out texts.")
@click.option("--max-ppl-ratio", type=float, default=None,
              help="Instead of --target: the sparsest thresholds whose calibration perplexity ratio stays "
                   "within this (e.g. 1.05).")
@click.option("--site", type=click.Choice(SPARSIFY_SITES), default=None,
              help="What is cut: down_in = the down projection's input (skips down rows; the default: "
                   "least perplexity per zero), gate = |act(gate)| weighted per neuron (gated FFNs; skips up "
                   "and down rows: twice the bytes, more perplexity).")
@click.option("--scope", type=click.Choice(SPARSIFY_SCOPES), default="ffn", show_default=True,
              help="ffn: the FFN's site alone; all: also the inputs of q/k/v, of the attention output and of "
                   "gate/up, each layer and site at the target (TEAL-style; aios.input_threshold.* keys).")
@click.option("--allocation", type=click.Choice(SPARSIFY_ALLOCATIONS), default="uniform", show_default=True,
              help="uniform: every layer at the target (measured best on the real Gemma 3 270M); greedy: "
                   "per-layer levels by each layer's measured KL (3 forward passes per layer).")
@click.option("--calibration", type=click.Path(dir_okay=False), default=None,
              help="JSONL/TXT calibration texts (default: the fixtures' pydoc train split).")
@click.option("--tokens", type=int, default=2048, show_default=True, help="Calibration tokens.")
@click.option("--heldout-tokens", type=int, default=4096, show_default=True,
              help="Held-out tokens for the report's perplexity and zeros (0: skip).")
@click.option("--sparse-down", is_flag=True,
              help="Also store FFN down projections neuron-major (blk.N.ffn_down.t, re-encoded) so "
                   "aios-run --mode sparse skips zeroed neurons' rows in quantized files.")
@click.option("--input-major", is_flag=True,
              help="Store every matrix a cut input feeds input-major (blk.N.X.t, re-encoded in its own type "
                   "where the blocks fit): aios-run --mode sparse then reads only the rows of nonzero inputs "
                   "of q/k/v, o, gate/up and down (with --scope all). The file is for aios-run only.")
@click.option("--input-major-type", type=click.Choice(("wider", "same")), default="wider", show_default=True,
              help="What --input-major re-encodes in: wider = one step more bits (Q4_K -> Q5_0, Q6_K -> Q8_0; "
                   "measured +1.7 % perplexity on the real Qwen 1.5B where same cost +10.5 %), same = the "
                   "source's types (fewer bytes).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def sparsify_command(model: str, out: str, target: float | None, max_ppl_ratio: float | None, site: str | None,
                     scope: str, allocation: str, calibration: str | None, tokens: int, heldout_tokens: int,
                     sparse_down: bool, input_major: bool, input_major_type: str, as_json: bool) -> None:
    """Zero FFN activations below calibrated per-layer thresholds (CATS/TEAL-style, no training).

    MODEL is a GGUF (quantized too). The weights are copied byte for byte; the thresholds go in
    the file's metadata, and aios-run applies them in every mode (llama.cpp ignores them).
    """
    from convert.sparsify import SparsifyConfig, sparsify
    from convert.sparsify.cli import render_sparsify, sparsify_progress

    from aios.errors import UsageError

    aim_r1 = str(target).lower() == "r1"
    if target is None and max_ppl_ratio is None:
        target = 0.5
    elif aim_r1:
        from convert.sparsify.config import R1_FLOOR, R1_MARGIN

        target = R1_FLOOR + R1_MARGIN  # the start; raised until held-out texts measure it
    elif target is not None:
        try:
            target = float(target)
        except ValueError:
            raise UsageError(f"--target is a zero fraction between 0 and 1 or r1; got {target!r}.") from None
    cfg = SparsifyConfig(target=target, aim_r1=aim_r1, max_ppl_ratio=max_ppl_ratio, site=site, allocation=allocation,
                         calibration=calibration, tokens=tokens, heldout_tokens=heldout_tokens,
                         sparse_down=sparse_down, input_major=input_major, input_major_type=input_major_type,
                         scope=scope)
    result = sparsify(model, out, cfg, progress=sparsify_progress())
    for w in result.warnings:
        warn(w)
    render_sparsify(result, as_json)


# The trained-aliasing defaults shown in --help (convert.alias.train.TrainConfig imports torch,
# which --help must not; tests/convert/test_cli.py keeps these equal to TrainConfig's).
ALIAS_TRAIN_DEFAULTS = {"steps": 400, "lam": 1e-2, "lr": 1e-3}


# --- canonical + delta aliasing --------------------------------------------------------------


@main.command("alias")
@click.argument("model")
@click.option("-o", "--output", "out", default=None, type=click.Path(file_okay=False),
              help="Output HF folder (canonical + deltas, aios_alias.json report); must not exist. "
                   "Omit it to only export an already aliased MODEL with --gguf/--dealias.")
@click.option("--zones", default=None,
              help="Layers sharing one canonical per matrix type: core, all, or a range A-B "
                   "[default: core; all with --train].")
@click.option("--delta", default="lowrank:8", show_default=True, help="Delta encoding: dense, lowrank:R, q8_0 or none.")
@click.option("--canonical", type=click.Choice(CANONICAL_MODES), default="mean", show_default=True)
@click.option("--types", default=None, help="Comma-separated matrix types to alias (e.g. q_proj,k_proj); default all shareable.")
@click.option("--min-cosine", type=float, default=None,
              help="Join threshold against the canonical instead of the contract's zone thresholds (post-hoc).")
@click.option("--budget-ppl", type=float, default=None,
              help="Keep a matrix type only if measured held-out perplexity rises by at most X (post-hoc).")
@click.option("--train", is_flag=True, help="Trained aliasing: fine-tune W_c + δ_i with λ Σ‖δ_i‖².")
@click.option("--steps", type=int, default=None,
              help=f"--train: optimisation steps [default: {ALIAS_TRAIN_DEFAULTS['steps']}].")
@click.option("--lam", type=float, default=None,
              help=f"--train: final λ of the delta penalty λ Σ‖δ_i‖² [default: {ALIAS_TRAIN_DEFAULTS['lam']:g}].")
@click.option("--lr", type=float, default=None,
              help=f"--train: peak learning rate [default: {ALIAS_TRAIN_DEFAULTS['lr']:g}].")
@click.option("--delta-norm", type=click.Choice(DELTA_NORMS), default=None,
              help="--train: norm of the ‖δ_i‖ ≤ 9 % ‖W_c‖ projection [default: fro, the R3 criterion].")
@click.option("--train-data", default=None, metavar="PATH|DIR|GLOB",
              help="--train: streamed JSONL/TXT/Parquet corpus (default: the pydoc train split).")
@click.option("--micro-batch", type=int, default=None,
              help="--train: windows per forward pass per process (the rest is gradient accumulation).")
@click.option("--device", type=click.Choice(DEVICES), default=None,
              help="--train: where to fine-tune [default: auto, cuda when torch sees one].")
@click.option("--checkpoint-every", type=int, default=None,
              help="--train: steps between checkpoints in OUT.partial/ [default: none].")
@click.option("--resume", is_flag=True, help="--train: continue the interrupted run in OUT.partial/.")
@click.option("--gguf", type=click.Path(dir_okay=False), default=None, help="Also write an aliased GGUF for aios-run.")
@click.option("--dealias", type=click.Path(dir_okay=False), default=None,
              help="Also write a de-aliased standard GGUF (W_i materialized) that llama.cpp loads.")
@click.option("--outtype", type=click.Choice(GGUF_OUTTYPES, case_sensitive=False), default="f32", show_default=True,
              help="Type of the GGUF outputs' 2-D weights.")
@click.option("--like", type=click.Path(dir_okay=False), default=None, metavar="SOURCE.gguf",
              help="Type the --gguf/--dealias outputs' tensors as SOURCE.gguf types them (e.g. the Q4_K_M file "
                   "MODEL came from) instead of --outtype; a canonical takes its first member's type.")
@click.option("--sparse-down", is_flag=True,
              help="Store the --gguf file's FFN down projections neuron-major (blk.N.ffn_down.t, canonical.t, "
                   "delta.t, delta.lr_v.t) so aios-run's sparse modes skip non-firing neurons in any type; the "
                   "file is for aios-run, not llama.cpp.")
def alias_command(model: str, out: str | None, zones: str | None, delta: str, canonical: str, types: str | None,
                  min_cosine: float | None, budget_ppl: float | None, train: bool, steps: int | None,
                  lam: float | None, lr: float | None, delta_norm: str | None, gguf: str | None, dealias: str | None, outtype: str,
                  train_data: str | None, micro_batch: int | None, device: str | None,
                  checkpoint_every: int | None, resume: bool, sparse_down: bool, like: str | None) -> None:
    """Share one canonical weight per matrix type across layers, plus per-layer deltas (R3).

    With --train it runs under `accelerate launch` / `torchrun` as DDP, like relufy.
    """
    from aios.cli_common import err_console
    from convert.alias.cli import render_alias, render_export
    from convert.alias.run import run_alias

    def progress(message: str) -> None:
        err_console.print(f"[dim]{message}[/]")

    type_list = tuple(t.strip() for t in types.split(",") if t.strip()) if types else None
    result = run_alias(model, out, zones=zones, delta=delta, canonical=canonical, types=type_list,
                       min_cosine=min_cosine, budget_ppl=budget_ppl, train=train, steps=steps,
                       lam=lam, lr=lr, delta_norm=delta_norm, gguf=gguf, dealias=dealias,
                       outtype=outtype, progress=progress, exported=render_export,
                       train_data=train_data, micro_batch=micro_batch, device=device,
                       checkpoint_every=checkpoint_every, resume=resume, sparse_down=sparse_down, like=like)
    if result is not None:
        render_alias(result)


# --- low-rank + quantized residual -----------------------------------------------------------


def _parse_rank(value: str | None) -> int | str | None:
    from aios.errors import UsageError

    if value is None or value == "full":
        return value
    try:
        return int(value)
    except ValueError:
        raise UsageError(f"--rank must be a positive integer or 'full', not '{value}'.") from None


@main.command("svd-residual")
@click.argument("model")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="Output .gguf file.")
@click.option("--rank", default=None, help="Rank per matrix (an integer, or 'full').")
@click.option("--energy", type=float, default=None,
              help="Smallest rank keeping this share of Σσ² per matrix (default 0.95 when no rule is given).")
@click.option("--bpw", type=float, default=None, help="Largest rank whose U, V and residual fit these bits per weight.")
@click.option("--method", type=click.Choice(METHODS), default="activation-aware",
              show_default=True, help="activation-aware whitens by calibration XᵀX before the SVD.")
@click.option("--residual", type=click.Choice(RESIDUALS, case_sensitive=False),
              default="q4_0", show_default=True, help="Type of the quantized residual E = W − U·V.")
@click.option("--factor-type", type=click.Choice(FACTOR_TYPES, case_sensitive=False), default="f16", show_default=True,
              help="Type of lr_u and lr_v.")
@click.option("--outtype", type=click.Choice(BASE_TYPES, case_sensitive=False), default="f16", show_default=True,
              help="Type of the tensors left plain (embeddings, output head).")
@click.option("--calibration", type=click.Path(dir_okay=False), default=None,
              help="JSONL/TXT calibration texts (default: the bundled set).")
@click.option("--samples", type=click.IntRange(min=1), default=None, help="Use the first N calibration texts.")
@click.option("--max-tokens", type=click.IntRange(min=1), default=128, show_default=True,
              help="Tokens per calibration text.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the randomized SVD.")
@click.option("--eval-tokens", type=click.IntRange(min=0), default=1024, show_default=True,
              help="Held-out tokens per text set for the measured perplexity (0: skip running the file).")
@click.option("--like", type=click.Path(dir_okay=False), default=None, metavar="SOURCE.gguf",
              help="Type each tensor as SOURCE.gguf types it (e.g. the Q4_K_M file MODEL came from): the plain "
                   "tensors, and each residual as the matrix it replaces (instead of --outtype and --residual; "
                   "--residual none still drops them).")
@click.option("--sparse-down", is_flag=True,
              help="Store FFN down projections' lr_v and residual neuron-major (blk.N.ffn_down.lr_v.t, "
                   ".residual.t) so aios-run's sparse modes skip non-firing neurons in any type; the file is "
                   "for aios-run, not llama.cpp.")
def svd_residual_command(model: str, output: str, rank: str | None, calibration: str | None, eval_tokens: int,
                         like: str | None, **options) -> None:
    """Factorize MODEL's block matrices as W ≈ U·V + Q(E) into a GGUF for aios-run."""
    from dataclasses import replace
    from pathlib import Path

    from aios.cli_common import err_console
    from convert.lowrank.cli import render, write_report
    from convert.svd_residual import SvdResidualConfig, svd_residual

    cfg = replace(SvdResidualConfig(), rank=_parse_rank(rank),
                  calibration=Path(calibration).name if calibration else None, **options)
    result = svd_residual(model, output, cfg, calibration=calibration, like=like,
                          progress=lambda message: err_console.print(f"[dim]{message}[/]"))
    if eval_tokens:
        from runtime.evaluate import evaluate_gguf

        err_console.print(f"[dim]running {output} in aios-run for perplexity and MB/token[/]")
        result.measured = evaluate_gguf(result.output, eval_tokens=eval_tokens)
    write_report(result)
    render(result)


if __name__ == "__main__":  # `accelerate launch -m convert.cli relufy ...`, `torchrun -m ...`
    main()
