"""Aliasing ratio vs held-out perplexity frontier (R3) for both bundled fixtures.

    python benchmarks/alias_frontier.py [-o bench-alias] [--steps 400] [--only tiny-falcon]
        [--part all|post-hoc|trained] [--trained 0,2]     # run a subset (parallel jobs)
    python benchmarks/alias_frontier.py -o bench-alias --merge bench-alias/frontier-*.json

For each fixture it runs post-hoc ``aios-convert alias`` at several zone / delta settings
(the contract's zone thresholds reject every pair on these models, so the forced settings
use ``min_cosine=0`` and are labelled so) and trained aliasing at a few λ / zone settings,
plus a fine-tune of the *independent* weights with the same recipe (what training alone
does to perplexity). Every output is then scored by the R3 checker itself. Ratios and
‖δ‖/‖W_c‖ are measured from the written tensors; perplexity is measured on the fixtures'
held-out split. Writes ``frontier[-subset].json``, ``.md`` and ``.png``; ``--merge`` combines
subsets into ``frontier.*``.

torch and numpy's BLAS run with one thread: on the shared 2-core machine two threads were
15-40× slower (0.4 s vs 6.9 s per training step) because of contention.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from aios.data import load_texts  # noqa: E402
from aios.models import resolve_model  # noqa: E402
from contract.checks import r3_aliasing  # noqa: E402
from contract.checks.base import CheckContext  # noqa: E402
from convert.alias.posthoc import AliasConfig, alias  # noqa: E402
from convert.alias.train import AliasTrainConfig, train_alias  # noqa: E402

POST_HOC = [  # (zones, delta, min_cosine)
    ("core", "lowrank:8", None),  # the contract's thresholds
    ("core", "none", 0.0), ("core", "lowrank:8", 0.0),
    ("1-4", "lowrank:4", 0.0),
    ("all", "none", 0.0), ("all", "lowrank:4", 0.0), ("all", "lowrank:16", 0.0), ("all", "lowrank:32", 0.0),
    ("all", "q8_0", 0.0),
]
TRAINED = [  # (zones, delta, lam, types); steps, batch, lr, projection radius: AliasTrainConfig defaults
    ("all", "lowrank:8", 1e-2, None),  # the default `aios-convert alias --train`
    ("all", "lowrank:8", 0.0, None),  # projection radius only, no penalty
    ("all", "lowrank:8", 1e-1, None),
    ("1-4", "lowrank:4", 1e-2, None),
    ("all", "lowrank:8", 0.0, ()),  # independent weights, same fine-tune: the training effect alone
]


def score(folder: Path) -> dict:
    """The R3 checker's own verdict and measured metrics for an alias output folder."""
    h = resolve_model(str(folder))
    r = r3_aliasing.check(h, CheckContext(calibration_texts=load_texts(limit=1)))
    m = {x.name: x.value for x in r.metrics}
    return {"r3_status": r.status.value, "core_ratio": m.get("aliasing_ratio"),
            "model_ratio": m.get("model_aliasing_ratio"), "max_rel_delta_core": m.get("max_rel_delta_norm")}


def run(fixture: str, root: Path, steps: int, part: str, trained: list[int] | None) -> list[dict]:
    rows = []
    for zones, delta, mc in POST_HOC if part in ("all", "post-hoc") else []:
        out = root / f"{fixture}-post-{zones}-{delta.replace(':', '')}-{mc}"
        t0 = time.perf_counter()
        res = alias(fixture, out, AliasConfig(zones=zones, delta=delta, min_cosine=mc))
        rep = res.report
        row = {"fixture": fixture, "mode": "post-hoc", "zones": zones, "delta": delta,
               "thresholds": "contract zones" if mc is None else f"forced (min cosine {mc})",
               "groups": len(rep["groups"]), "heldout_ppl": rep["heldout_perplexity"],
               "source_ppl": rep["source_heldout_perplexity"], "ppl_delta": rep["perplexity_delta"],
               "seconds": round(time.perf_counter() - t0, 1), **score(out)}
        rows.append(row)
        print(json.dumps(row), flush=True)
        shutil.rmtree(out)
    if part == "post-hoc":
        return rows
    for zones, delta, lam, types in [TRAINED[i] for i in (trained or range(len(TRAINED)))]:
        out = root / f"{fixture}-train-{zones}-{delta.replace(':', '')}-{lam}-{'none' if types == () else 'all'}"
        t0 = time.perf_counter()
        res = train_alias(fixture, out, AliasTrainConfig(zones=zones, delta=delta, lam=lam, steps=steps, types=types))
        rep = res.report
        row = {"fixture": fixture, "mode": "trained" if types != () else "fine-tune, no aliasing",
               "zones": zones if types != () else "-", "delta": delta if types != () else "-", "lam": lam,
               "steps": steps, "groups": len(rep["groups"]), "heldout_ppl": rep["heldout_perplexity"],
               "source_ppl": rep["source_heldout_perplexity"], "ppl_delta": rep["perplexity_delta"],
               "seconds": round(time.perf_counter() - t0, 1), **score(out)}
        rows.append(row)
        print(json.dumps(row), flush=True)
        shutil.rmtree(out)
    return rows


def markdown(rows: list[dict]) -> str:
    head = ("| fixture | mode | zones | delta | λ | core ratio | model ratio | max ‖δ‖/‖W_c‖ (core) | "
            "ppl (source → out) | Δppl | R3 |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
    body = ""
    for r in rows:
        lam = "-" if r["mode"] != "trained" else r.get("lam", "-")  # λ means nothing without deltas
        body += (f"| {r['fixture']} | {r['mode']}{' (' + r['thresholds'] + ')' if 'thresholds' in r else ''} | "
                 f"{r['zones']} | {r['delta']} | {lam} | {r['core_ratio'] if r['core_ratio'] is not None else 0:.3f} | "
                 f"{r['model_ratio'] if r['model_ratio'] is not None else 0:.3f} | "
                 f"{r['max_rel_delta_core'] if r['max_rel_delta_core'] is not None else float('nan'):.3f} | "
                 f"{r['source_ppl']:.2f} → {r['heldout_ppl']:.2f} | {r['ppl_delta']:+.2f} | {r['r3_status']} |\n")
    return head + body


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for fixture, color in (("tiny-falcon", "tab:blue"), ("tiny-llama", "tab:orange")):
        for mode, marker in (("post-hoc", "o"), ("trained", "s")):
            pts = [(r["core_ratio"] or 0, r["ppl_delta"]) for r in rows if r["fixture"] == fixture and r["mode"] == mode]
            if pts:
                ax.scatter(*zip(*pts), c=color, marker=marker, label=f"{fixture} {mode}")
    ax.axhline(1.0, ls="--", c="gray")
    ax.axvline(0.70, ls="--", c="gray")
    ax.set_yscale("symlog", linthresh=1.0)
    ax.set_xlabel("core-zone aliasing ratio (measured from the artifact)")
    ax.set_ylabel("held-out perplexity change (measured)")
    ax.set_title("R3 frontier: pass region is right of 0.70 and below +1.0")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-o", "--out", default="bench-alias")
    ap.add_argument("--steps", type=int, default=AliasTrainConfig().steps)
    ap.add_argument("--only", choices=["tiny-falcon", "tiny-llama"], default=None)
    ap.add_argument("--part", choices=["all", "post-hoc", "trained"], default="all")
    ap.add_argument("--trained", default=None, help="comma-separated indices into TRAINED (default: all)")
    ap.add_argument("--merge", nargs="+", default=None,
                    help="combine rows of earlier frontier*.json files (or JSON-lines files) into one table")
    args = ap.parse_args()
    if args.merge:
        rows = []
        for f in args.merge:
            text = Path(f).read_text()
            rows += json.loads(text)["rows"] if text.lstrip().startswith("{\n") or '"rows"' in text[:20] \
                else [json.loads(line) for line in text.splitlines() if line.strip()]
        rows.sort(key=lambda r: (r["fixture"], r["mode"] != "post-hoc", r["mode"]))
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "frontier.json").write_text(json.dumps({"rows": rows}, indent=1) + "\n")
        (out / "frontier.md").write_text(markdown(rows))
        plot(rows, out / "frontier.png")
        print(markdown(rows))
        return
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(1)
    threadpool_limits(1)  # numpy's OpenBLAS too
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="alias-frontier-") as tmp:
        for fixture in [args.only] if args.only else ["tiny-falcon", "tiny-llama"]:
            rows += run(fixture, Path(tmp), args.steps, args.part,
                        [int(i) for i in args.trained.split(",")] if args.trained else None)
    stem = "frontier" + (f"-{args.only}" if args.only else "") + (f"-{args.part}" if args.part != "all" else "") \
        + (f"-{args.trained.replace(',', '_')}" if args.trained else "")
    (out / f"{stem}.json").write_text(json.dumps({"rows": rows, "steps": args.steps}, indent=1) + "\n")
    (out / f"{stem}.md").write_text(markdown(rows))
    plot(rows, out / f"{stem}.png")
    print(markdown(rows))
    print(f"wrote {out / stem}.json, .md and .png")


if __name__ == "__main__":
    main()
