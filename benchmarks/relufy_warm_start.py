"""Benchmark: relufy warm-started from calibrated thresholds vs plain relufy, same steps.

Both runs start from the same model (default: the real Gemma 3 270M Q4_K_M, through its
dequantized HF twin), swap GELU → ReLU and fine-tune with the same config, data and seed; the
warm run also trains with the down-projection cuts of a sparsified GGUF in place
(``aios-convert relufy --init-thresholds``). Without ``--thresholds`` the script makes that file
first with ``aios-convert sparsify --target 0.7`` (default calibration: the pydoc train split,
which the held-out text never overlaps).

Reported per run, from the relufy provenance: held-out perplexity before / after the swap /
after the fine-tune (relufy's protocol, each 128-token window after the model's BOS), the exact
zeros by the R1 checker's code on all 241 calibration prompts (what ``aios-contract check``
measures on the output folder), and wall time. Both fine-tunes train on Python documentation,
so their pydoc held-out perplexity also measures adaptation to that domain (it can fall below
the original's); the general-domain perplexity on ``aios/data/heldout.jsonl`` (the quality
gate's text) is measured for the source and each output too. Then each output is exported in the source
GGUF's own quant mix (``aios-convert gguf --like``) and that file is checked as a user would:
R1 through aios-run (``aios-contract check``'s code), and whether llama.cpp loads it. Writes
``DIR/relufy_warm_start.json`` (``--export-only`` redoes the export step on earlier outputs).

    python benchmarks/relufy_warm_start.py -o warm-vs-plain \\
        [--model real|FOLDER|GGUF] [--thresholds FILE] [--steps 40 --batch 8 --seq-len 128 \\
         --lr 5e-5 --l1 1.0] [--heldout-tokens 4096] [--only plain|warm]

On CPUs with AMX, ``ACCELERATE_MIXED_PRECISION=bf16`` trains with bf16 autocast (about 1.8×
faster on the 270M model here); the JSON records the precision each run used. Timings drift on
shared machines: wall and process CPU seconds are both recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import time
from pathlib import Path


def heldout_file(tokenizer, n_tokens: int, path: Path) -> Path:
    """The first ``n_tokens`` tokens' worth of the pydoc held-out split, as a TXT file (so both
    runs score the same text and the measurement stays a few seconds per point)."""
    from aios.evaluation import pydoc_split

    ids = pydoc_split(tokenizer, "heldout").ids[:n_tokens].tolist()
    path.write_text(tokenizer.decode(ids))
    return path


def one_run(name: str, model: str, out: Path, cfg, heldout: Path, thresholds: Path | None) -> dict:
    from convert.relufy import relufy

    target = out / f"relu-{name}"
    shutil.rmtree(target, ignore_errors=True)
    shutil.rmtree(target.with_name(target.name + ".partial"), ignore_errors=True)

    def progress(event: str, **info) -> None:
        if event == "phase":
            print(f"[{name}] {info['message']}", flush=True)
        elif event == "step" and (info["stats"].step % 10 == 0 or info["stats"].step + 1 == info["total"]):
            s = info["stats"]
            print(f"[{name}] step {s.step + 1}/{info['total']}: loss {s.loss:.3f}, batch zeros "
                  f"{s.zero_fraction:.3f}, {info['tokens_per_second']:.0f} tok/s", flush=True)

    wall, cpu = time.perf_counter(), time.process_time()
    res = relufy(model, target, cfg, heldout_data=heldout, checkpoint_every=0, progress=progress,
                 init_thresholds=thresholds)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    p = res.provenance
    m = p["metrics"]
    row = {"run": name, "output": str(target), "wall_seconds": round(wall, 1),
           "cpu_seconds": round(cpu, 1), "precision": p["training"]["precision"],
           "tokens_seen": p["training"]["tokens_seen"],
           "train_tokens_per_second": p["throughput"]["tokens_per_second"]}
    for key in ("before", "after_swap", "after"):
        row[key] = {"heldout_perplexity": m[key]["heldout_perplexity"],
                    "mean_exact_zero_fraction": m[key]["mean_exact_zero_fraction"],
                    "min_layer_exact_zero_fraction": min(m[key]["per_layer_exact_zero_fraction"])}
    row["perplexity_ratio"] = m["perplexity_ratio"]
    row["r1_pass"] = m["after"]["mean_exact_zero_fraction"] >= 0.70
    if thresholds is not None:
        row["thresholds"] = {k: v for k, v in p["result"]["ffn_threshold"].items() if k != "values"}
    print(f"[{name}] zeros {row['after']['mean_exact_zero_fraction']:.4f}, ppl "
          f"{row['before']['heldout_perplexity']:.3f} -> {row['after']['heldout_perplexity']:.3f} "
          f"(x{row['perplexity_ratio']:.3f}), {wall:.0f} s", flush=True)
    return row


def general_perplexity(model_spec: str, cut_from: Path | None = None) -> float:
    """Held-out perplexity on ``aios/data/heldout.jsonl`` (66 general-domain passages, the quality
    gate's text; not Python documentation), 128-token windows after BOS, the model loaded by our
    loader (its calibrated cut applied). The fine-tunes train on the pydoc train split, so their
    pydoc held-out perplexity also measures adaptation to that domain; this one does not."""
    from aios.data import HELDOUT_FILE
    from aios.evaluation import file_tokens
    from aios.models import resolve_model
    from aios.models.from_gguf import hf_source
    from convert import evaluation as ev
    from convert.sparsify import bos_prefix

    handle = hf_source(resolve_model(model_spec))
    tok = handle.load_tokenizer()
    model = handle.load_torch(dtype="float32")
    if cut_from is not None:  # the sparsified GGUF's cut on the source model: sparsify's quality
        from aios.models import ffn_cut
        from aios.models.tensors import GGUFStore

        n = handle.facts.n_layers
        ffn_cut.install(model, [handle.arch.block(i, handle.arch.ffn_down) for i in range(n)],
                        ffn_cut.from_gguf(GGUFStore(cut_from), n, str(cut_from)))
    return round(ev.heldout_perplexity(model, file_tokens(tok, HELDOUT_FILE), bos_prefix(tok)), 4)


def export_and_check(row: dict, source: str, samples: int | None) -> dict:
    """The run's output folder exported in the source GGUF's quant mix (``gguf --like``), then
    what a user of that file gets: R1 measured through aios-run by ``aios-contract check``'s
    code, and whether llama.cpp loads it (and what the export says llama.cpp would run)."""
    from aios.reference import llamacpp
    from contract.check import check_model
    from convert.gguf import GGUFExportConfig, export_gguf

    folder = Path(row["output"])
    out = folder.with_suffix(".gguf")
    t0 = time.perf_counter()
    res = export_gguf(str(folder), out, GGUFExportConfig("f16", like=source))
    export_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    report = check_model(str(out), **({"samples": samples} if samples else {}))
    r1 = next(r for r in report.requirements if r.id == "R1")
    info = {"gguf": str(out), "bytes": out.stat().st_size, "export_seconds": round(export_s, 1),
            "types": sorted({p.outtype for p in res.plan}), "fallbacks": res.fallbacks,
            "export_warnings": res.warnings,
            "r1": {"status": r1.status.value, "summary": r1.summary,
                   "mean_exact_zero_fraction": r1.metric("mean_exact_zero_fraction").value,
                   "engine": r1.details.get("engine"), "zeros_from": r1.details.get("zeros_from"),
                   "seconds": round(time.perf_counter() - t0, 1)},
            "llama_cpp_load_error": llamacpp.load_error(out) if llamacpp.available() else "not installed"}
    print(f"[{row['run']}] {out.name}: {info['bytes'] / 1e6:.1f} MB, R1 {info['r1']['status']} "
          f"({info['r1']['mean_exact_zero_fraction']:.4f}, through {info['r1']['engine']}); llama.cpp "
          f"load: {info['llama_cpp_load_error'] or 'ok'}", flush=True)
    return info


def main() -> None:
    from dataclasses import replace

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-o", "--out", type=Path, default=Path("relufy-warm-start"))
    ap.add_argument("--model", default="real", help="real | an HF folder | a GGUF")
    ap.add_argument("--thresholds", type=Path, default=None,
                    help="a sparsified GGUF of the model (default: made with sparsify --target 0.7)")
    ap.add_argument("--target", type=float, default=0.7, help="sparsify target when making the thresholds")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--l1", type=float, default=1.0)
    ap.add_argument("--heldout-tokens", type=int, default=4096)
    ap.add_argument("--only", choices=("plain", "warm"), default=None)
    ap.add_argument("--no-export", action="store_true",
                    help="skip exporting each output with --like the source GGUF and checking R1 on it")
    ap.add_argument("--export-only", action="store_true",
                    help="only the export and check, on the outputs of an earlier run in -o")
    ap.add_argument("--samples", type=int, default=None, help="R1 calibration texts (default: all 241)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    from aios.models import resolve_model
    from convert.relufy import RelufyConfig

    model = args.model
    if model == "real":
        from aios.models import real

        model = str(real.fetch(real.GEMMA3_270M_Q4_K_M))
    thresholds = args.thresholds
    made = None
    if thresholds is None and args.only != "plain" and not args.export_only:
        from convert.sparsify import SparsifyConfig, sparsify

        if not model.endswith(".gguf"):
            raise SystemExit("--thresholds is needed for a folder model (sparsify takes a GGUF).")
        thresholds = args.out / f"sparsify-{args.target:g}.gguf"
        t0 = time.perf_counter()
        if not thresholds.exists():
            sparsify(Path(model), thresholds, SparsifyConfig(target=args.target, heldout_tokens=0))
        made = {"file": thresholds.name, "target": args.target, "seconds": round(time.perf_counter() - t0, 1)}
    path = args.out / "relufy_warm_start.json"
    if args.export_only:
        report = json.loads(path.read_text())
        report["source_general_perplexity"] = general_perplexity(model)
        if args.thresholds is not None:
            report["thresholds_general_perplexity"] = general_perplexity(model, args.thresholds)
        for row in report["runs"]:
            if args.only in (None, row["run"]):
                row["general_perplexity"] = general_perplexity(row["output"])
                row["export"] = export_and_check(row, model, args.samples)
        path.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {path}")
        return
    handle = resolve_model(model)
    heldout = heldout_file(handle.load_tokenizer(), args.heldout_tokens, args.out / "heldout.txt")
    cfg = replace(RelufyConfig(), steps=args.steps, batch=args.batch, seq_len=args.seq_len, lr=args.lr,
                  l1=args.l1)
    runs = [r for r in ("plain", "warm") if args.only in (None, r)]
    results = [one_run(r, model, args.out, cfg, heldout, thresholds if r == "warm" else None) for r in runs]
    general = general_perplexity(model)
    sparsified = general_perplexity(model, thresholds) if thresholds is not None else None
    for row in results:
        row["general_perplexity"] = general_perplexity(row["output"])
        print(f"[{row['run']}] general held-out perplexity {general:.3f} -> {row['general_perplexity']:.3f}")
    if not args.no_export and model.endswith(".gguf"):
        for row in results:
            row["export"] = export_and_check(row, model, args.samples)
    report = {"model": model, "config": cfg.to_dict(), "heldout_tokens": args.heldout_tokens,
              "thresholds_made": made, "cpu": platform.processor() or platform.machine(),
              "threads": os.environ.get("OMP_NUM_THREADS"),
              "mixed_precision_env": os.environ.get("ACCELERATE_MIXED_PRECISION"),
              "source_general_perplexity": general,
              "thresholds_general_perplexity": sparsified, "runs": results}
    if args.only and path.exists():  # one run at a time: merge with the other's
        old = json.loads(path.read_text())
        report["runs"] = [r for r in old.get("runs", []) if r["run"] != args.only] + results
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
