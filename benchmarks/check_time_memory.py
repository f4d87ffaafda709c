"""Benchmark: wall time and peak memory of ``aios-contract check`` on a ~1B-parameter model.

Builds a random-init Llama-architecture model (bf16 safetensors, ~1.0B parameters; the
bundled tokenizer) in a temporary folder, then runs the full check in a fresh process and
reports its wall time and peak RSS (``ru_maxrss`` of the child), next to the model's size.

    python benchmarks/check_time_memory.py [--layers 22] [--samples 64] [--keep DIR]

Absolute times drift on shared machines; the ratio "peak RSS / model bytes" is the figure
to watch (the check loads the model once for R1 and streams tensors for R3).
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def build(folder: Path, layers: int) -> int:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok_src = ROOT / "aios" / "fixtures" / "tiny-llama"
    tok = AutoTokenizer.from_pretrained(tok_src)
    cfg = LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=layers,
                      num_attention_heads=16, num_key_value_heads=2, vocab_size=len(tok),
                      hidden_act="silu", tie_word_embeddings=False)
    torch.manual_seed(0)
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    model = model.to_empty(device="cpu").to(torch.bfloat16)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.02)
    n = sum(p.numel() for p in model.parameters())
    model.save_pretrained(folder, safe_serialization=True)
    tok.save_pretrained(folder)
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=22)
    ap.add_argument("--samples", type=int, default=64)
    ap.add_argument("--keep", type=Path, default=None, help="keep the model in this folder")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="aios-bench-"))
    folder = args.keep or tmp / "model"
    try:
        t0 = time.perf_counter()
        params = build(folder, args.layers) if not (folder / "config.json").exists() else None
        build_s = time.perf_counter() - t0
        model_bytes = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
        cmd = [sys.executable, "-m", "contract.cli", "check", str(folder), "--samples", str(args.samples),
               "-o", str(tmp / "report"), "--format", "json"]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        wall = time.perf_counter() - t0
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
        report = json.loads((tmp / "report" / "aios-report.json").read_text()) if proc.returncode == 0 else None
        out = {
            "params": params, "model_bytes": model_bytes, "build_seconds": round(build_s, 1),
            "check_seconds": round(wall, 1), "check_peak_rss_bytes": peak,
            "peak_rss_over_model_bytes": round(peak / model_bytes, 2), "exit_code": proc.returncode,
            "per_requirement_seconds": {r["id"]: round(r["seconds"], 2) for r in report["requirements"]} if report else None,
        }
        print(json.dumps(out, indent=2))
        if proc.returncode != 0:
            print(proc.stderr[-2000:], file=sys.stderr)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
