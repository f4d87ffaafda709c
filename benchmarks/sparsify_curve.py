"""Benchmark: `aios-convert sparsify` as a curve — quality, exact zeros, MB/token and decode speed per target.

One calibration (convert.sparsify.calibrate: the per-layer curves and KL sensitivities are
measured once) serves every target of --targets; per target:

- held-out perplexity ratio (cut / dense) and the exact-zero fraction of the down projections'
  inputs, both measured by running the file in aios-run on the held-out pydoc split, which the
  calibration (train split) never saw; for each allocation of --allocations (``uniform``: every
  layer at the target, the default; ``greedy``: by measured per-layer KL) and each site of --sites;
- for the targets of --speed: the file written with ``--sparse-down``; weight MB/token measured by aios-run's
  byte counter in --mode dense and --mode sparse, the checker's projection for the same file
  (``aios-contract check``, projected, not measured) and measured/projected; decode tokens/s of
  ours (--mode sparse) against llama.cpp's dense decode of the *source* file, alternated for
  --rounds rounds (median of per-round ratios; llama.cpp in its own process, on its default
  buffers or, where they crash (AMX Xeons), its plain CPU buffers: ``llama_cpp_config`` says).

Models: ``--model real`` is the real Gemma 3 270M Q4_K_M (aios/models/real.py fetches it);
``--model llama8b`` builds a random-init Llama at Llama-3.1-8B dimensions (d 4096, 32/8 heads,
d_ffn 14336, SiLU) with --layers layers, quantized by llama.cpp itself to Q4_K_M
(llama_model_quantize) — random weights: speed and bytes only, the perplexities mean nothing.
Any other value is a GGUF path. Prints one JSON object (also written to --json); name the CPU
(``lscpu``) beside any figure.

    python benchmarks/sparsify_curve.py --model real --targets 0.3,0.5,0.6,0.7,0.8,0.9 --speed 0.5,0.7
    python benchmarks/sparsify_curve.py --model real --targets 0.5,0.7 --allocations uniform,greedy --sites down_in,gate
    python benchmarks/sparsify_curve.py --model llama8b --layers 2 --targets '' --speed 0.5 --sites down_in,gate \
        --tokens 512 --heldout-tokens 0
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def build_llama8b(work: Path, layers: int) -> Path:
    """Random-init Llama-3.1-8B-dims model → our f16 export → llama.cpp's own Q4_K_M."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from aios.reference import llamacpp
    from convert.gguf import GGUFExportConfig, export_gguf
    from runtime_vs_llamacpp import TOK

    src = work / "llama8b-hf"
    if not src.exists():
        tok = AutoTokenizer.from_pretrained(TOK)
        cfg = LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=layers,
                          num_attention_heads=32, num_key_value_heads=8, vocab_size=len(tok),
                          hidden_act="silu", tie_word_embeddings=False, max_position_embeddings=1024)
        torch.manual_seed(0)
        LlamaForCausalLM(cfg).float().save_pretrained(src, safe_serialization=True)
        tok.save_pretrained(src)
    f16 = work / "llama8b-f16.gguf"
    if not f16.exists():
        export_gguf(str(src), f16, GGUFExportConfig("f16"))
    q = work / "llama8b-Q4_K_M.gguf"
    if not q.exists():
        llamacpp.quantize(f16, q, "Q4_K_M")
    return q


def speed(src: Path, out_file: Path, rounds: int, n: int) -> dict:
    """Weight MB/token (measured, dense and sparse) and the checker's projection of the
    sparsified file; decode tok/s of ours sparse vs llama.cpp dense on the source file."""
    from runtime_vs_llamacpp import LlamaCpp, Ours, paired
    from sparse_quant_vs_llamacpp import PROMPT, projection, tensor_mix

    res: dict = {"file_types_2d": tensor_mix(out_file)["types_2d"]}
    dense, sparse = Ours(out_file, "dense"), Ours(out_file, "sparse")
    src_dense = Ours(src, "dense")
    for name, o in (("dense", dense), ("sparse", sparse), ("source_dense", src_dense)):
        r = o(n)
        res[f"{name}_weight_mb_per_token"] = round(r["weight_bytes_per_token"] / 1e6, 3)
        res[f"{name}_ffn_density"] = round(r["ffn_density"], 4)
    measured = 1 - res["sparse_weight_mb_per_token"] / res["dense_weight_mb_per_token"]
    res["measured_weight_reduction"] = round(measured, 4)
    res["measured_weight_reduction_vs_source"] = round(
        1 - res["sparse_weight_mb_per_token"] / res["source_dense_weight_mb_per_token"], 4)
    p = projection(out_file, len(PROMPT) + n // 2)
    res["projection"] = p
    if p.get("projected_weight_reduction"):
        res["measured_over_projected"] = round(measured / p["projected_weight_reduction"], 3)
    lc = LlamaCpp(src)
    res["llama_cpp_config"] = lc.config
    r = paired(sparse, lc, n, rounds)
    res["ours_sparse_tok_s"] = round(r["a"]["decode_tok_s"], 2)
    res["llamacpp_dense_tok_s"] = round(r["b"]["decode_tok_s"], 2)
    res["sparse_over_llamacpp"] = r["ratio"]
    res["ratios"] = r["ratios"]
    r = paired(dense, lc, n, rounds)
    res["ours_dense_over_llamacpp"] = r["ratio"]
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="real", help="real | llama8b | a GGUF path")
    ap.add_argument("--layers", type=int, default=2, help="llama8b: decoder layers")
    ap.add_argument("--targets", default="0.3,0.5,0.6,0.7,0.8,0.9")
    ap.add_argument("--sites", default="down_in", help="comma-separated cut sites (down_in, gate)")
    ap.add_argument("--allocations", default="uniform",
                    help="comma-separated: uniform (every layer at the target), greedy (by measured KL)")
    ap.add_argument("--tokens", type=int, default=2048, help="calibration tokens")
    ap.add_argument("--heldout-tokens", type=int, default=4096)
    ap.add_argument("--speed", default="", metavar="TARGETS",
                    help="targets (comma-separated) whose --sparse-down file is also measured: MB/token and tok/s "
                         "vs llama.cpp (first allocation of --allocations)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--decode", type=int, default=32, help="decoded tokens per speed round")
    ap.add_argument("--keep", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    from convert import sparsify as S
    from runtime import kernels as K

    work = args.keep or Path(tempfile.mkdtemp(prefix="aios-sparsify-curve-"))
    work.mkdir(parents=True, exist_ok=True)
    if args.model == "real":
        from aios.models import real

        src = real.fetch(real.GEMMA3_270M_Q4_K_M)
    elif args.model == "llama8b":
        src = build_llama8b(work, args.layers)
    else:
        src = Path(args.model)
    speed_targets = {float(t) for t in args.speed.split(",") if t}
    targets = [float(t) for t in args.targets.split(",") if t]
    targets += sorted(speed_targets - set(targets))
    out: dict = {"model": str(src), "arithmetic": K.ARITHMETICS[0], "targets": targets, "runs": {}}
    t_start = time.perf_counter()
    for site in [s for s in args.sites.split(",") if s]:
        allocations = [a for a in args.allocations.split(",") if a]
        cfg = S.SparsifyConfig(target=0.5, site=site, tokens=args.tokens, heldout_tokens=args.heldout_tokens,
                               allocation="greedy" if "greedy" in allocations else "uniform")
        t0 = time.perf_counter()
        cal = S.calibrate(src, cfg)
        out["runs"][site] = {"calibration_seconds": {k: round(v, 1) for k, v in cal.seconds.items()},
                             "sensitivity_kl": [None if c.sensitivity is None else [round(float(x), 6) for x in c.sensitivity]
                                                for c in cal.curves], "targets": {}}
        print(f"{site}: calibrated in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
        dense_cache: dict = {}
        for target in targets:
            row = {}
            for allocation in allocations if target in set(float(t) for t in args.targets.split(",") if t) else []:
                c = replace(cfg, allocation=allocation, target=target)
                levels, cuts = cal.cuts_for(target, c)
                r = {"layer_sparsity": [round(float(x), 3) for x in levels],
                     "calibration_ppl_ratio": round(cal.ppl_ratio(cuts), 4)}
                if args.heldout_tokens:
                    h = S.measure_heldout(cal.model, cal.tokenizer, cal.prefix, cuts, c, dense_cache)
                    r.update({k: v for k, v in h.items() if k != "per_layer_exact_zero_fraction"})
                row[allocation] = r
                print(f"{site} {target:.2f} {allocation}: {r}", file=sys.stderr, flush=True)
            if target in speed_targets:
                c = replace(cfg, target=target, sparse_down=True, heldout_tokens=0, allocation=allocations[0])
                f = work / f"{src.stem}-{site}-{int(round(target * 100))}.gguf"
                levels, cuts = cal.cuts_for(target, c)
                S.finish(cal, f, target, levels, cuts, {}, c, {}, None, time.perf_counter())
                row["speed"] = speed(src, f, args.rounds, args.decode)
                print(f"{site} {target:.2f} speed: {row['speed']}", file=sys.stderr, flush=True)
            out["runs"][site]["targets"][str(target)] = row
    out["seconds"] = round(time.perf_counter() - t_start, 1)
    text = json.dumps(out, indent=1)
    if args.json:
        args.json.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
