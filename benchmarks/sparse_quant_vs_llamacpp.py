"""Benchmark: exact sparse decode on quantized weights vs llama.cpp's dense decode, one run.

A random-init ReLU model at Llama-3.1-8B dimensions (``--arch llama``: d 4096, 32 query / 8 KV
heads, d_ffn 14336, gated) or Falcon-7B dimensions (``--arch falcon``: d 4544, 71 query heads,
one KV head, d_ffn 18176, non-gated, parallel attention/MLP), --layers of them, built so most
FFN pre-activations are negative (a positive input to the FFN, its first projection's rows
shifted by --shift: ~90 % exact zeros, measured and printed) — a speed test of the sparse path
at a known sparsity, not a quality claim. (llama.cpp hard-codes GELU for falcon and SiLU for
llama, so its dense decode computes another activation on the same weights: a speed reference
only.) Files:

- ours: ``aios-convert gguf --outtype q8_0|q4_0 --sparse-down`` (down projections neuron-major),
  run in ``--mode sparse`` (gated: gate full, up rows of firing gates, down rows of nonzero
  products; non-gated: up full, down rows of nonzero activations);
- llama.cpp: its own Q4_K_M (``llama_model_quantize`` on our f16 export), run dense.

Each comparison alternates the two sides for --rounds rounds and reports the median per-round
tokens/s ratio beside every round (the machine is shared), plus the weight bytes per token our
byte counter measured. Prints one JSON object; name the CPU (``lscpu``) beside any figure.

    python benchmarks/sparse_quant_vs_llamacpp.py [--arch llama|falcon] [--layers 2] [--tokens 16] [--rounds 3] [--keep DIR]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from runtime_vs_llamacpp import TOK, LlamaCpp, Ours, paired  # noqa: E402

LLAMA_FTYPE_MOSTLY_Q4_K_M = 15  # llama.h's llama_ftype


def build_falcon(folder: Path, layers: int, shift: float) -> None:
    import torch
    from transformers import AutoTokenizer, FalconConfig, FalconForCausalLM

    tok = AutoTokenizer.from_pretrained(TOK)
    cfg = FalconConfig(hidden_size=4544, ffn_hidden_size=18176, num_hidden_layers=layers, num_attention_heads=71,
                       multi_query=True, parallel_attn=True, new_decoder_architecture=False, bias=False,
                       alibi=False, activation="relu", vocab_size=len(tok), tie_word_embeddings=True,
                       max_position_embeddings=512)
    torch.manual_seed(0)
    model = FalconForCausalLM(cfg).float()
    with torch.no_grad():
        for layer in model.transformer.h:
            layer.input_layernorm.bias.fill_(1.0)  # LayerNorm centres x: its bias makes the FFN input positive
            layer.mlp.dense_h_to_4h.weight.sub_(shift)  # most up pre-activations negative
            layer.self_attention.dense.weight.mul_(0.1)
            layer.mlp.dense_4h_to_h.weight.mul_(0.1)
    model.save_pretrained(folder, safe_serialization=True)
    tok.save_pretrained(folder)


def build_model(folder: Path, layers: int, gate_shift: float) -> None:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(TOK)
    cfg = LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=layers,
                      num_attention_heads=32, num_key_value_heads=8, vocab_size=len(tok), hidden_act="relu",
                      tie_word_embeddings=False, max_position_embeddings=512)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).float()
    with torch.no_grad():
        model.model.embed_tokens.weight.abs_().add_(1.0)  # positive residual stream
        for layer in model.model.layers:
            layer.mlp.gate_proj.weight.sub_(gate_shift)  # most gate pre-activations negative
            layer.self_attn.o_proj.weight.mul_(0.1)
            layer.mlp.down_proj.weight.mul_(0.1)
    model.save_pretrained(folder, safe_serialization=True)
    tok.save_pretrained(folder)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--arch", choices=("llama", "falcon"), default="llama")
    ap.add_argument("--shift", type=float, default=None,
                    help="Subtracted from the first FFN projection (default: ~90 %% zeros: 4.2e-4 llama, 5.4e-4 falcon).")
    ap.add_argument("--keep", type=Path, default=None)
    args = ap.parse_args()
    import llama_cpp

    from convert.gguf import GGUFExportConfig, export_gguf

    work = args.keep or Path(tempfile.mkdtemp(prefix="aios-sq-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    dims = {"llama": "Llama-3.1-8B (d 4096, 32/8 heads, d_ffn 14336, gated)",
            "falcon": "Falcon-7B (d 4544, 71/1 heads, d_ffn 18176, non-gated, parallel)"}[args.arch]
    out: dict = {"dims": dims, "layers": args.layers, "tokens": args.tokens, "rounds": args.rounds}
    try:
        src = work / "relu-hf"
        if not src.exists():
            if args.arch == "falcon":
                build_falcon(src, args.layers, 5.4e-4 if args.shift is None else args.shift)
            else:
                build_model(src, args.layers, 4.2e-4 if args.shift is None else args.shift)
        f16 = work / "relu-f16.gguf"
        export_gguf(str(src), f16, GGUFExportConfig("f16"))
        ref = work / "relu-Q4_K_M.gguf"
        p = llama_cpp.llama_model_quantize_default_params()
        p.ftype = LLAMA_FTYPE_MOSTLY_Q4_K_M
        assert llama_cpp.llama_model_quantize(str(f16).encode(), str(ref).encode(), ctypes.byref(p)) == 0
        out["llamacpp_q4_k_m_bytes"] = ref.stat().st_size
        lc = LlamaCpp(ref)
        for t in ("q8_0", "q4_0"):
            f = work / f"relu-{t}-sparse-down.gguf"
            export_gguf(str(src), f, GGUFExportConfig(t, sparse_down=True))
            out[f"ours_{t}_file_bytes"] = f.stat().st_size
            dense = Ours(f, "dense")
            d = dense(args.tokens)
            del dense
            sp = Ours(f, "sparse")
            r = paired(sp, lc, args.tokens, args.rounds)
            out[f"ffn_exact_zero_fraction_{t}"] = round(1 - r["a"]["ffn_density"], 4)
            out[f"ours_{t}_dense_weight_mb_per_token"] = round(d["weight_bytes_per_token"] / 1e6, 2)
            out[f"ours_{t}_sparse_weight_mb_per_token"] = round(r["a"]["weight_bytes_per_token"] / 1e6, 2)
            out[f"ours_{t}_dense_tok_s"] = round(d["decode_tok_s"], 3)
            out[f"ours_{t}_sparse_tok_s"] = round(r["a"]["decode_tok_s"], 3)
            out["llamacpp_q4_k_m_dense_tok_s"] = round(r["b"]["decode_tok_s"], 3)
            out[f"ratios_ours_{t}_sparse_over_llamacpp_q4_k_m"] = r["ratios"]
            out[f"ratio_ours_{t}_sparse_over_llamacpp_q4_k_m"] = r["ratio"]
            del sp
    finally:
        print(json.dumps(out, indent=2))
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
