"""Benchmark: wall time and peak memory of ``aios-contract check`` on a ~1B-parameter model.

Builds a random-init Llama-architecture model (bf16 safetensors, ~1.0B parameters; the
bundled tokenizer) in a temporary folder, then runs the full check in a fresh process and
reports its wall time and peak RSS (the child's own VmHWM), next to the model's size.

    python benchmarks/check_time_memory.py [--layers 22] [--samples 64] [--keep DIR]

Absolute times drift on shared machines; the ratio "peak RSS / model bytes" is the figure
to watch (the check loads the model once for R1 and streams tensors for R3).

``--falcon-7b-gguf PRESET`` checks a GGUF instead: a random-init checkpoint at Falcon-7B
dimensions (d 4544, 71 query heads, one KV head, d_ffn 18176, vocabulary 65024, ``--layers``
blocks, 32 for the real model) is written shard by shard as bf16 safetensors with a hub-style
index (never whole in memory), exported to f16 by ``aios-convert gguf`` (streaming), quantized
by llama.cpp's own quantizer to PRESET (e.g. Q4_K_M; in a child process,
``aios.reference.llamacpp.quantize``: ``llama_cpp_quantize_s`` is its time there), and checked
with R1 measured through aios-run on the file as stored. Peak RSS is the child's own VmHWM (``ru_maxrss`` of a child
starts from its parent's peak on Linux). Needs ~2.3 × the f16 size of free disk for a while.

    python benchmarks/check_time_memory.py --falcon-7b-gguf Q4_K_M --layers 32 --samples 8 --max-tokens 64

``--samples 0`` runs the check with its default calibration (every sample, 128 tokens each, R1
stopping once the set's pass or fail is settled); ``--full-calibration`` makes R1 run them all.
"""

from __future__ import annotations

import argparse
import json
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


FALCON_7B = dict(hidden_size=4544, num_attention_heads=71, multi_query=True, new_decoder_architecture=False,
                 parallel_attn=True, bias=False, alibi=False, vocab_size=65024)

# runs the check in this process and prints its own peak RSS last (VmHWM: this image's high-water mark)
_CHECK = """
import atexit, sys
def _hwm():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            print("VMHWM", int(line.split()[1]) * 1024, file=sys.stderr, flush=True)
atexit.register(_hwm)
from contract.cli import main
sys.argv = ["aios-contract", *sys.argv[1:]]
main()
"""


def build_falcon_shards(folder: Path, layers: int) -> int:
    """Falcon-7B dimensions, random bf16 weights, one safetensors shard per layer (plus one for the
    embedding): memory stays about one layer, as it would loading a hub checkpoint."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoTokenizer, FalconConfig

    folder.mkdir(parents=True, exist_ok=True)
    cfg = FalconConfig(num_hidden_layers=layers, activation="gelu", tie_word_embeddings=True, **FALCON_7B)
    d, ffn, hd = cfg.hidden_size, cfg.ffn_hidden_size or 4 * cfg.hidden_size, cfg.hidden_size // cfg.num_attention_heads
    g = torch.Generator().manual_seed(0)
    rnd = lambda *shape: (torch.randn(*shape, generator=g) * 0.02).to(torch.bfloat16)  # noqa: E731
    weight_map, n, total = {}, 0, 0
    shards = [("transformer.word_embeddings.weight", (cfg.vocab_size, d))]
    for name_shape in [shards, *[[
        (f"transformer.h.{i}.input_layernorm.weight", (d,)), (f"transformer.h.{i}.input_layernorm.bias", (d,)),
        (f"transformer.h.{i}.self_attention.query_key_value.weight", (d + 2 * hd, d)),
        (f"transformer.h.{i}.self_attention.dense.weight", (d, d)),
        (f"transformer.h.{i}.mlp.dense_h_to_4h.weight", (ffn, d)),
        (f"transformer.h.{i}.mlp.dense_4h_to_h.weight", (d, ffn))] for i in range(layers)],
            [("transformer.ln_f.weight", (d,)), ("transformer.ln_f.bias", (d,))]]:
        fname = f"model-{len({*weight_map.values()}) + 1:05d}.safetensors"
        tensors = {}
        for name, shape in name_shape:
            if len(shape) == 1:
                tensors[name] = (torch.ones(shape) if name.endswith("weight") else torch.zeros(shape)).to(torch.bfloat16)
            else:
                tensors[name] = rnd(*shape)
            weight_map[name] = fname
            n += tensors[name].numel()
            total += tensors[name].numel() * 2
        save_file(tensors, str(folder / fname), metadata={"format": "pt"})
        del tensors
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1))
    cfg.torch_dtype = "bfloat16"
    cfg.save_pretrained(folder)
    AutoTokenizer.from_pretrained(ROOT / "aios" / "fixtures" / "tiny-falcon").save_pretrained(folder)
    return n


def _samples(args) -> list[str]:
    return (["--samples", str(args.samples)] if args.samples else []) + \
        (["--full-calibration"] if args.full_calibration else [])


def check_falcon_gguf(args, tmp: Path) -> dict:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from runtime_vs_llamacpp import quantize_llamacpp

    from convert.gguf import GGUFExportConfig, export_gguf

    work = args.keep or tmp
    work.mkdir(parents=True, exist_ok=True)
    q = work / f"falcon-7b-dims-{args.layers}L.{args.falcon_7b_gguf}.gguf"
    steps = {}
    params = None
    if not q.exists():
        src, f16 = work / "hf", work / "f16.gguf"
        t0 = time.perf_counter()
        params = build_falcon_shards(src, args.layers)
        steps["build_s"] = round(time.perf_counter() - t0, 1)
        t0 = time.perf_counter()
        export_gguf(str(src), f16, GGUFExportConfig("f16"))
        steps["export_f16_s"] = round(time.perf_counter() - t0, 1)
        shutil.rmtree(src)
        quantize_llamacpp(f16, q, args.falcon_7b_gguf)
        # the quantizer's own time in its child process (start-up excluded), and what ran it
        steps["llama_cpp_quantize_s"] = round(quantize_llamacpp.last.seconds, 1)
        steps["llama_cpp_config"] = quantize_llamacpp.last.config
        f16.unlink()
    cmd = [sys.executable, "-c", _CHECK, "check", str(q), *_samples(args),
           "--max-tokens", str(args.max_tokens), "-o", str(tmp / "report"), "--format", "json"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - t0
    hwm = [int(x.split()[1]) for x in proc.stderr.splitlines() if x.startswith("VMHWM ")]
    report = json.loads((tmp / "report" / "aios-report.json").read_text()) if proc.returncode == 0 else None
    size = q.stat().st_size
    out = {"file": q.name, "params": params, "file_bytes": size, **steps, "check_seconds": round(wall, 1),
           "check_peak_rss_bytes": hwm[-1] if hwm else None,
           "peak_rss_over_file_bytes": round(hwm[-1] / size, 3) if hwm else None, "exit_code": proc.returncode}
    if report:
        out["per_requirement_seconds"] = {r["id"]: round(r["seconds"], 2) for r in report["requirements"]}
        out["calibration"] = {k: report["calibration"].get(k) for k in ("samples", "samples_measured", "tokens")}
        out["requirements"] = {r["id"]: {k: r.get(k) for k in ("status", "value", "evidence")} for r in report["requirements"]}
    else:
        out["stderr_tail"] = proc.stderr[-2000:]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=22)
    ap.add_argument("--samples", type=int, default=64,
                    help="calibration samples R1 runs; 0: the check's default (all of them)")
    ap.add_argument("--keep", type=Path, default=None, help="keep the model in this folder")
    ap.add_argument("--full-calibration", action="store_true",
                    help="pass --full-calibration: R1 runs every sample even once its pass or fail is settled")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--falcon-7b-gguf", metavar="PRESET", default=None,
                    help="Check llama.cpp's PRESET (e.g. Q4_K_M) of a Falcon-7B-dimension model instead.")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="aios-bench-"))
    if args.falcon_7b_gguf:
        try:
            print(json.dumps(check_falcon_gguf(args, tmp), indent=2))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return
    folder = args.keep or tmp / "model"
    try:
        t0 = time.perf_counter()
        params = build(folder, args.layers) if not (folder / "config.json").exists() else None
        build_s = time.perf_counter() - t0
        model_bytes = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
        cmd = [sys.executable, "-c", _CHECK, "check", str(folder), *_samples(args),
               "-o", str(tmp / "report"), "--format", "json"]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        wall = time.perf_counter() - t0
        # the child's own VmHWM: ru_maxrss of RUSAGE_CHILDREN carries this process's peak (the model
        # it just built) across fork+exec on Linux, which inflated the figure
        hwm = [int(x.split()[1]) for x in proc.stderr.splitlines() if x.startswith("VMHWM ")]
        peak = hwm[-1] if hwm else 0
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
