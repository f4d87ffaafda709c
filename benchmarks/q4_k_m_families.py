"""Benchmark: llama.cpp quant presets of every family aios-run runs, at real dimensions.

For each family, a random-init checkpoint with the real widths, heads, head size, FFN size and
vocabulary of a published model (``--layers`` blocks; the bundled tiny-falcon tokenizer, the
embedding padded to the real vocabulary) is exported to f16 by ``aios-convert gguf`` and
quantized by llama.cpp's own quantizer (``llama_model_quantize`` from llama-cpp-python) with
``--preset`` (default Q4_K_M: the mix people deploy, with llama.cpp's per-tensor fallbacks
where a row is no multiple of 256). On that file, in one run:

* the tensor-type mix llama.cpp wrote;
* aios-run's logits in its float arithmetic against the same model with every block-typed
  weight replaced by gguf-py's dequantization (decode exactness of every type in the mix; goal
  ≤ 1e-4 of the largest logit);
* aios-run's logits in its default arithmetic against llama.cpp's on the same file (both
  quantize activations to 8 bits where they use integer dots, so expect ~1-3 % of the largest
  logit on random weights) and top-1 agreement over the prompt's positions;
* decode tokens/s of both on the same file, side by side (``--tokens``, best of ``--rounds``).

    python benchmarks/q4_k_m_families.py [--families llama-3.1-8b,gemma-3-4b] [--layers 1] [--preset Q4_K_M]

llama.cpp runs in child processes (``aios.reference.llamacpp`` for the quantizer and the logits,
benchmarks/llamacpp_worker.py for the timed decode), on its default buffers, or on its plain CPU
buffers where the default crashed (AMX Xeons): each line names the configuration
(``llama_cpp_config`` beside the decode ratio, ``llama_cpp_logits_config`` beside the logits).

Random weights: the figures are about exactness and speed, not text quality. Each family needs
up to ~4 GB of RAM (gemma's 262k vocabulary); the work folder is deleted afterwards.
"""

from __future__ import annotations

import argparse
import collections
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

TOK = ROOT / "aios" / "fixtures" / "tiny-falcon"
# model_type -> config of a published model (text part), without the layer count
FAMILIES = {
    "llama-3.1-8b": dict(model_type="llama", hidden_size=4096, intermediate_size=14336,
                         num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                         rope_theta=500000.0, tie_word_embeddings=False,
                         rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                       "high_freq_factor": 4.0,
                                       "original_max_position_embeddings": 8192}),
    "mistral-7b": dict(model_type="mistral", hidden_size=4096, intermediate_size=14336,
                       num_attention_heads=32, num_key_value_heads=8, vocab_size=32768,
                       sliding_window=4096, tie_word_embeddings=False),
    "qwen2.5-7b": dict(model_type="qwen2", hidden_size=3584, intermediate_size=18944,
                       num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
                       tie_word_embeddings=False),
    "qwen3-8b": dict(model_type="qwen3", hidden_size=4096, intermediate_size=12288, head_dim=128,
                     num_attention_heads=32, num_key_value_heads=8, vocab_size=151936,
                     tie_word_embeddings=False),
    "gemma-2-9b": dict(model_type="gemma2", hidden_size=3584, intermediate_size=14336, head_dim=256,
                       num_attention_heads=16, num_key_value_heads=8, vocab_size=256000),
    "gemma-3-4b": dict(model_type="gemma3_text", hidden_size=2560, intermediate_size=10240,
                       head_dim=256, num_attention_heads=8, num_key_value_heads=4, vocab_size=262144,
                       sliding_window=1024),
    "phi-3-mini": dict(model_type="phi3", hidden_size=3072, intermediate_size=8192,
                       num_attention_heads=32, num_key_value_heads=32, vocab_size=32064,
                       tie_word_embeddings=False),
    "falcon-7b": dict(model_type="falcon", hidden_size=4544, num_attention_heads=71, multi_query=True,
                      new_decoder_architecture=False, parallel_attn=True, bias=False, alibi=False,
                      vocab_size=65024),
}
IDS = list(range(5, 37))


def build(folder: Path, family: str, layers: int) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    spec = dict(FAMILIES[family])
    cfg = AutoConfig.for_model(spec.pop("model_type"), num_hidden_layers=layers,
                               max_position_embeddings=4096, **spec)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():  # keep the residual stream moderate so logits are not saturated
        for name, p in model.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight", "dense.weight", "dense_4h_to_h.weight")):
                p.mul_(0.3)
    model.to(torch.bfloat16).save_pretrained(folder, safe_serialization=True)
    AutoTokenizer.from_pretrained(TOK).save_pretrained(folder)


def quantize(src: Path, dst: Path, preset: str) -> None:
    """llama.cpp's ``llama_model_quantize`` of ``src`` to ``preset``, in a child process."""
    from aios.reference import llamacpp

    llamacpp.quantize(src, dst, preset)


def dequantized_logits(path: Path) -> np.ndarray:
    """Logits of the model with every block-typed matrix replaced by gguf-py's dequantization."""
    from runtime.model import Model
    from tests.runtime.quant_blocks import dequantized

    return dequantized(Model(path, arithmetic="float")).forward(IDS, all_logits=True)


def llama_cpp_run(path: Path, tokens: int, rounds: int) -> tuple[np.ndarray, float, dict]:
    """llama.cpp's logits over IDS (one child, ``aios.reference.llamacpp.logits``) and its best
    decode tokens/s over ``rounds`` rounds of ``tokens`` (the benchmarks' worker; timed in its
    process, start-up and load excluded), with the configuration each ran on."""
    from llamacpp_worker import LlamaCpp

    from aios.reference import llamacpp

    ref = llamacpp.logits(path, IDS, n_ctx=256, n_threads=2)
    best, lc = 0.0, LlamaCpp(path, threads=2)
    try:
        for _ in range(rounds):
            best = max(best, lc(tokens)["decode_tok_s"])
    finally:
        lc.close()
    return np.asarray(ref.value), best, {"logits": ref.config, "decode": lc.config}


def ours_run(path: Path, tokens: int, rounds: int, arithmetic: str | None = None) -> tuple[np.ndarray, float]:
    from runtime.generate import generate
    from runtime.model import Model

    model = Model(path, arithmetic=arithmetic)
    logits = model.forward(IDS, all_logits=True)
    best = 0.0
    for _ in range(rounds):
        _, stats = generate(model, IDS, tokens)
        best = max(best, stats.decode_tps)
    return logits, best


def one(family: str, work: Path, layers: int, preset: str, tokens: int, rounds: int) -> dict:
    import gguf

    from convert.gguf import GGUFExportConfig, export_gguf

    # general.name comes from the folder name; llama.cpp's vocab loader special-cases names with
    # "phi-3" (it then requires "</s>" and "<s>" in the vocabulary, which the toy tokenizer lacks)
    src, f16, q = work / "random-init", work / f"{family}.f16.gguf", work / f"{family}.{preset}.gguf"
    build(src, family, layers)
    export_gguf(str(src), f16, GGUFExportConfig("f16"))
    shutil.rmtree(src)
    quantize(f16, q, preset)
    f16.unlink()
    from runtime import kernels

    mix = collections.Counter(t.tensor_type.name for t in gguf.GGUFReader(str(q)).tensors)
    default = kernels.ARITHMETICS[0]  # what aios-run runs by default (int8 where a kernel exists)
    exact, _ = ours_run(q, 0, 0, "float")  # the decode-exactness reference path
    ref = dequantized_logits(q)
    ours, ours_tps = ours_run(q, tokens, rounds, default)
    lc, lc_tps, configs = llama_cpp_run(q, tokens, rounds)
    scale = float(np.abs(ref).max())
    return {"family": family, "layers": layers, "preset": preset, "file_bytes": q.stat().st_size,
            "types": dict(sorted(mix.items())), "arithmetic": default,
            "max_err_float_path_vs_gguf_py_dequant": float(np.abs(exact - ref).max()) / scale,
            "max_err_vs_llama_cpp": float(np.abs(ours - lc).max()) / scale,
            "top1_agreement_vs_llama_cpp": float(np.mean(ours.argmax(-1) == lc.argmax(-1))),
            "llama_cpp_logits_config": configs["logits"],
            "decode_tok_s": {"aios_run": round(ours_tps, 2), "llama_cpp": round(lc_tps, 2)},
            "decode_ratio_ours_over_llama_cpp": round(ours_tps / lc_tps, 3),
            "llama_cpp_config": configs["decode"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--preset", default="Q4_K_M")
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("-o", "--output", type=Path, default=None)
    args = ap.parse_args()
    results = []
    for family in args.families.split(","):
        work = Path(tempfile.mkdtemp(prefix="aios-fam-"))
        try:
            results.append(one(family, work, args.layers, args.preset, args.tokens, args.rounds))
        except Exception as e:  # report and go on: one family's failure is a finding, not the end
            results.append({"family": family, "error": f"{type(e).__name__}: {e}"})
        finally:
            shutil.rmtree(work, ignore_errors=True)
        print(json.dumps(results[-1]), flush=True)
    if args.output:
        args.output.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
