"""Benchmark: exact-zero sparsity and held-out perplexity against relufy fine-tuning steps.

Runs ``aios-convert relufy`` with its default settings (unless overridden) on the bundled
fixtures, measuring held-out perplexity (fixtures' protocol) and the mean exact-zero
fraction (the R1 checker's code, all 241 calibration prompts) every ``--every`` steps, then
checks the relufied model with ``aios-contract check``. Writes ``DIR/relufy_curve.json``,
``DIR/relufy_curve.png`` and keeps the relufied models in ``DIR/<fixture>-relu``.

    python benchmarks/relufy_curve.py [-o DIR] [--only tiny-falcon] [--every 50] [--steps N]

Wall time includes the intermediate measurements; the acceptance figure (default settings,
no intermediate measurements, ≤ 10 CPU minutes) is a plain run:

    time aios-convert relufy tiny-falcon -o falcon-relu --device cpu

Timings drift on shared machines: the JSON records wall and process CPU seconds.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from dataclasses import replace
from pathlib import Path

FIXTURES = ("tiny-falcon", "tiny-llama")


def run_one(name: str, out: Path, every: int, steps: int | None) -> dict:
    from contract.check import check_model
    from convert.relufy import RelufyConfig, relufy

    cfg = RelufyConfig() if steps is None else replace(RelufyConfig(), steps=steps)
    target = out / f"{name}-relu"
    shutil.rmtree(target, ignore_errors=True)
    shutil.rmtree(target.with_name(target.name + ".partial"), ignore_errors=True)

    def progress(event: str, **info) -> None:
        if event == "phase":
            print(f"[{name}] {info['message']}", flush=True)
        elif event == "eval":
            print(f"[{name}] step {info['step']:4d}: ppl {info['heldout_perplexity']:.3f}  "
                  f"zeros {info['mean_exact_zero_fraction']:.4f}", flush=True)

    wall, cpu = time.perf_counter(), time.process_time()
    res = relufy(name, target, cfg, device="cpu", eval_every=every, progress=progress)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    m = res.provenance["metrics"]
    points = [{"step": 0, **m["after_swap"]}, *res.provenance["curve"], {"step": cfg.steps, **m["after"]}]
    report = check_model(str(target))
    r1 = next(r for r in report.requirements if r.id == "R1")
    return {
        "model": name, "config": cfg.to_dict(), "wall_seconds": round(wall, 1),
        "cpu_seconds": round(cpu, 1), "before": m["before"], "curve": points,
        "perplexity_ratio": m["perplexity_ratio"],
        "check": {"R1": r1.status.value, "tier": report.tier,
                  "mean_exact_zero_fraction": r1.metric("mean_exact_zero_fraction").value},
    }


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for r in results:
        steps = [p["step"] for p in r["curve"]]
        a.plot(steps, [p["mean_exact_zero_fraction"] for p in r["curve"]], marker="o", label=r["model"])
        b.plot(steps, [p["heldout_perplexity"] / r["before"]["heldout_perplexity"] for p in r["curve"]],
               marker="o", label=r["model"])
    a.axhline(0.70, ls="--", c="grey", lw=1, label="R1 floor 0.70")
    a.axhline(0.85, ls=":", c="grey", lw=1, label="issue target 0.85")
    a.set(xlabel="fine-tuning step", ylabel="mean exact-zero fraction (R1 code)", ylim=(0, 1))
    b.axhline(1.10, ls=":", c="grey", lw=1, label="1.10 × original")
    b.set(xlabel="fine-tuning step", ylabel="held-out ppl / original", yscale="log")
    for ax in (a, b):
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.suptitle("relufy: sparsity and perplexity vs steps (step 0 = right after the swap)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-o", "--out", type=Path, default=Path("relufy-curve"))
    ap.add_argument("--only", choices=FIXTURES)
    ap.add_argument("--every", type=int, default=50, help="measure every N steps")
    ap.add_argument("--steps", type=int, default=None, help="override the default step count")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    names = [args.only] if args.only else FIXTURES
    results = [run_one(n, args.out, args.every, args.steps) for n in names]
    (args.out / "relufy_curve.json").write_text(json.dumps(results, indent=2) + "\n")
    plot(results, args.out / "relufy_curve.png")
    for r in results:
        last = r["curve"][-1]
        print(f"{r['model']}: zeros {last['mean_exact_zero_fraction']:.4f}, ppl "
              f"{r['before']['heldout_perplexity']:.3f} -> {last['heldout_perplexity']:.3f} "
              f"(x{r['perplexity_ratio']:.3f}); R1 {r['check']['R1']}, tier {r['check']['tier']}; "
              f"{r['wall_seconds']:.0f} s wall, {r['cpu_seconds']:.0f} s CPU")
    print(f"wrote {args.out / 'relufy_curve.json'} and {args.out / 'relufy_curve.png'}")


if __name__ == "__main__":
    main()
