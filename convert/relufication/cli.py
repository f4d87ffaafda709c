"""Rendering for ``aios-convert relufy``: a rich progress bar on stderr and the result table."""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Any, Iterator

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from aios.cli_common import err_console, make_console
from convert.relufy import ProgressFn, RelufyResult


@contextmanager
def relufy_progress() -> Iterator[ProgressFn]:
    """A progress callback: phases as lines, training steps as a bar with running loss, ppl, ETA."""
    bar = Progress(TextColumn("[bold]fine-tune"), BarColumn(), MofNCompleteColumn(),
                   TextColumn("loss {task.fields[loss]}  ppl {task.fields[ppl]}  "
                              "zeros {task.fields[zeros]}  λ {task.fields[l1]}  "
                              "{task.fields[rate]} tok/s{task.fields[mfu]}"),
                   TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                   console=err_console, transient=False)
    task: list[Any] = []
    running: list[float] = []  # exponential moving average of the LM loss
    live = [False]

    def finish() -> None:
        """Stop the bar once. Off a terminal (a CI log, a pipe) rich draws the bar only here, so
        it must stop when the fine-tune ends, not when relufy returns: its final line would
        otherwise come after "measuring the fine-tuned model" and the lines after it."""
        if live[0]:
            live[0] = False
            bar.stop()

    def progress(event: str, **info: Any) -> None:
        if event == "phase":
            if task:  # the fine-tune is over (or interrupted): its bar's last line first
                finish()
            err_console.print(f"[dim]{info['message']}[/]")
        elif event == "eval":
            err_console.print(f"step {info['step']}: held-out ppl {info['heldout_perplexity']:.3f}, "
                              f"exact zeros {info['mean_exact_zero_fraction']:.4f}")
        elif event == "step":
            s = info["stats"]
            running[:] = [s.loss if not running else 0.9 * running[0] + 0.1 * s.loss]
            mfu = info.get("mfu")
            fields = dict(loss=f"{running[0]:.3f}", ppl=f"{math.exp(min(running[0], 50)):.1f}",
                          zeros=f"{s.zero_fraction:.3f}", l1=f"{s.l1:.3g}",
                          rate=f"{info.get('tokens_per_second', 0):,.0f}",
                          mfu=f"  MFU {mfu:.1%}" if mfu is not None else "")
            if not task:
                task.append(bar.add_task("fine-tune", total=info["total"], completed=s.step, **fields))
            bar.update(task[0], completed=s.step + 1, **fields)
            if s.step + 1 >= info["total"]:
                finish()

    bar.start()
    live[0] = True
    try:
        yield progress
    finally:
        finish()


def render_relufy(result: RelufyResult) -> None:
    """The before / after-swap / after table on stdout."""
    p = result.provenance
    m = p["metrics"]
    t = Table(title=f"relufy {p['source']['name']}: {p['source']['activation']} → "
                    f"{p['result']['activation']} ({p['result']['config_key']})")
    for col in ("", "held-out ppl", "× original", "exact zeros (R1 code)"):
        t.add_column(col, justify="left" if not col else "right")
    base = m["before"]["heldout_perplexity"]
    for name, key in (("original", "before"), ("after swap", "after_swap"), ("after fine-tune", "after")):
        r = m[key]
        t.add_row(name, f"{r['heldout_perplexity']:.3f}", f"{r['heldout_perplexity'] / base:.3f}",
                  f"{r['mean_exact_zero_fraction']:.4f}")
    console = make_console()
    console.print(t)
    per_layer = " ".join(f"{x:.3f}" for x in m["after"]["per_layer_exact_zero_fraction"])
    console.print(f"per-layer exact zeros: {per_layer}")
    resumed = f", resumed from step {result.resumed_from}" if result.resumed_from is not None else ""
    t, tp = p["training"], p["throughput"]
    mfu = f", MFU {tp['mfu']:.1%}" if tp.get("mfu") is not None else ""
    console.print(f"trained on {t['world_size']} process{'es' if t['world_size'] > 1 else ''} "
                  f"({p['runtime']['device']}, {t['precision']}): {t['tokens_seen']:,} tokens, "
                  f"{tp['tokens_per_second']:,.0f} tok/s{mfu}")
    console.print(f"wrote {result.out} ({p['steps']} steps{resumed}, {result.seconds:.1f} s); "
                  f"check it with `aios-contract check {result.out}`")
