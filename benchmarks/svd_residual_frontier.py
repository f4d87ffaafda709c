"""Perplexity against bytes per token: low-rank (+ residual) vs plain quantization, both fixtures.

Every point is a GGUF produced by our converters and *run in aios-run*: perplexity from the
runtime's logits (fixtures' protocol, see ``runtime.evaluate.evaluate_gguf``), bytes per token
from the runtime's byte counter during decode. Variants per fixture:

  plain     aios-convert gguf --outtype q8_0 | q4_0 | q4_k (its own per-tensor fallbacks)
  lr+q4_0   svd-residual --residual q4_0 at several ranks, plain and activation-aware
  lr+q2_k   svd-residual --residual q2_k (flat 256-value super-blocks) at several ranks; rank 1
            is nearly "plain Q2_K", which the 128-wide rows of the fixtures cannot hold otherwise
  lr        svd-residual --residual none at several ranks (low-rank alone)

Low-rank variants keep embeddings/output head at Q8_0 (``--outtype q8_0``), so the x axis is
the bytes of the *block matrices* read per token (where the variants differ); the table gives
the total weight bytes too. Writes ``frontier.json``, ``frontier.md`` and ``frontier.png``.

    python benchmarks/svd_residual_frontier.py -o bench-svd-residual [--eval-tokens 1024] [--sets pydoc,heldout] [--quick]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

FIXTURES = ("tiny-falcon", "tiny-llama")


def variants(quick: bool) -> list[dict]:
    out = [{"family": "dense", "label": "plain f32", "outtype": "f32"}]  # reference line, not a point
    out += [{"family": "plain", "label": f"plain {t}", "outtype": t} for t in ("q8_0", "q4_0", "q4_k")]
    ranks = {"q4_0": (4, 16), "q2_k": (1, 4, 8, 16), "none": (32, 96)}
    if quick:
        ranks = {"q4_0": (16,), "q2_k": (1, 16), "none": (32, 96)}
    for residual, rs in ranks.items():
        for method in ("plain", "activation-aware"):
            for r in rs:
                fam = "lr" if residual == "none" else f"lr+{residual}"
                out.append({"family": fam, "label": f"{fam} r{r} {method}", "rank": r, "method": method,
                            "residual": residual})
    return out


def run(out_dir: Path, eval_tokens: int, quick: bool, sets: tuple[str, ...] = ("pydoc", "heldout")) -> dict:
    from convert.gguf import GGUFExportConfig, export_gguf
    from convert.svd_residual import SvdResidualConfig, calibrate, svd_residual
    from runtime.evaluate import evaluate_gguf

    files = out_dir / "files"
    files.mkdir(parents=True, exist_ok=True)
    rows = []
    t0 = time.time()
    for fx in FIXTURES:
        grams = calibrate(fx, SvdResidualConfig(outtype="q8_0"))
        for v in variants(quick):
            path = files / f"{fx}-{v['label'].replace(' ', '-')}.gguf"
            bpw = None
            if v["family"] in ("plain", "dense"):
                export_gguf(fx, path, GGUFExportConfig(v["outtype"]))
            else:
                cfg = SvdResidualConfig(rank=v["rank"], method=v["method"], residual=v["residual"], outtype="q8_0")
                res = svd_residual(fx, path, cfg, grams=grams if v["method"] != "plain" else None)
                bpw = res.bits_per_weight
            m = evaluate_gguf(path, eval_tokens=eval_tokens, sets=sets)
            row = {"fixture": fx, **v, "file": path.name, "bits_per_weight_blocks": bpw,
                   "block_mb_per_token": m["block_weights_mb_per_token"],
                   "weights_mb_per_token": m["weights_mb_per_token"], "pydoc_perplexity": m["pydoc_perplexity"],
                   "heldout_perplexity": m.get("heldout_perplexity"), "tokens_scored": m["pydoc_tokens_scored"]}
            rows.append(row)
            print(f"[{time.time() - t0:6.0f}s] {fx:12} {v['label']:32} block {row['block_mb_per_token']:.4f} MB/tok  "
                  f"pydoc ppl {row['pydoc_perplexity']:8.2f}  heldout ppl {row['heldout_perplexity'] or 0:8.2f}", flush=True)
    return {"tool": "benchmarks/svd_residual_frontier.py", "eval_tokens": eval_tokens, "quick": quick, "sets": list(sets),
            "evidence": "measured: every file run in aios-run (perplexity from its logits, bytes from its counter)",
            "wall_s": round(time.time() - t0, 1), "rows": rows}


def to_markdown(result: dict) -> str:
    lines = [f"# Perplexity vs bytes per token (measured in aios-run, {result['eval_tokens']} tokens per set)", "",
             "| Fixture | Variant | Block MB/token | Weight MB/token | Block bits/weight | pydoc ppl | held-out ppl |",
             "|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        bpw = "—" if r["bits_per_weight_blocks"] is None else f"{r['bits_per_weight_blocks']:.2f}"
        held = "—" if r.get("heldout_perplexity") is None else f"{r['heldout_perplexity']:.2f}"
        lines.append(f"| {r['fixture']} | {r['label']} | {r['block_mb_per_token']:.4f} | {r['weights_mb_per_token']:.4f} "
                     f"| {bpw} | {r['pydoc_perplexity']:.2f} | {held} |")
    lines += ["", "pydoc ppl: the fixtures' own held-out split (in-domain); held-out ppl: the bundled "
              "`aios/data/heldout.jsonl` passages (out of domain for these tiny models).", ""]
    return "\n".join(lines)


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(FIXTURES), figsize=(6.5 * len(FIXTURES), 4.8))
    style = {"plain": ("k", "s"), "lr+q4_0": ("tab:blue", "o"), "lr+q2_k": ("tab:orange", "^"), "lr": ("tab:green", "D")}
    for ax, fx in zip(axes, FIXTURES):
        rows = [r for r in result["rows"] if r["fixture"] == fx]
        for k, r in enumerate(x for x in rows if x["family"] == "plain"):
            ax.scatter(r["block_mb_per_token"], r["pydoc_perplexity"], c="k", marker="s", zorder=3)
            ax.annotate(r["label"], (r["block_mb_per_token"], r["pydoc_perplexity"]), fontsize=7,
                        xytext=(4, -12 + 9 * k), textcoords="offset points")
        for r in rows:
            if r["family"] == "dense":
                ax.axhline(r["pydoc_perplexity"], color="grey", lw=0.8, ls=":",
                           label=f"f32 ({r['block_mb_per_token']:.2f} MB/token)")
        for fam in ("lr+q4_0", "lr+q2_k", "lr"):
            for method, ls in (("plain", "--"), ("activation-aware", "-")):
                pts = sorted((r["block_mb_per_token"], r["pydoc_perplexity"]) for r in rows
                             if r["family"] == fam and r.get("method") == method)
                if pts:
                    color, marker = style[fam]
                    ax.plot(*zip(*pts), ls, color=color, marker=marker, label=f"{fam} ({method})")
        ax.set_yscale("log")
        ax.set_xlabel("block-matrix weight MB per token (measured)")
        ax.set_ylabel("pydoc held-out perplexity (measured)")
        ax.set_title(fx)
        ax.grid(alpha=0.3)
    axes[-1].legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--output", default="bench-svd-residual")
    ap.add_argument("--eval-tokens", type=int, default=1024)
    ap.add_argument("--quick", action="store_true", help="fewer ranks (a smoke run)")
    ap.add_argument("--sets", default="pydoc,heldout", help="perplexity text sets (pydoc first: it is plotted)")
    a = ap.parse_args()
    from aios.io import write_atomic

    out = Path(a.output)
    result = run(out, a.eval_tokens, a.quick, tuple(x.strip() for x in a.sets.split(",") if x.strip()))
    write_atomic(out / "frontier.json", json.dumps(result, indent=2) + "\n")
    write_atomic(out / "frontier.md", to_markdown(result))
    plot(result, out / "frontier.png")
    print(f"wrote {out / 'frontier.json'}, {out / 'frontier.md'}, {out / 'frontier.png'} ({result['wall_s']} s)")


if __name__ == "__main__":
    main()
