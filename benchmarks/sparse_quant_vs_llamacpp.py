"""Benchmark: exact sparse decode on quantized weights vs llama.cpp's dense decode, one run.

A random-init ReLU model at Llama-3.1-8B dimensions (``--arch llama``: d 4096, 32 query / 8 KV
heads, d_ffn 14336, gated) or Falcon-7B dimensions (``--arch falcon``: d 4544, 71 query heads,
one KV head, d_ffn 18176, non-gated, parallel attention/MLP), --layers of them, built so most
FFN pre-activations are negative (a positive input to the FFN, its first projection's rows
shifted by --shift: ~90 % exact zeros, measured and printed) — a speed test of the sparse path
at a known sparsity, not a quality claim. (llama.cpp hard-codes GELU for falcon and SiLU for
llama, so its dense decode computes another activation on the same weights: a speed reference
only.) Our side decodes tokens drawn at random (a random-init model decoded greedily repeats one
token, and every step would then fire the same neurons, whose rows stay in cache); the fraction of
neurons firing per token and in the union over the decoded tokens is printed. A full-rank random
first projection is no function a low-rank predictor can learn (it then computes most rows); with
--up-rank R that projection is a random rank-R matrix, the predictor's best case (a synthetic
model, not a trained one's predictability). Files:

- ours: ``aios-convert gguf --outtype T --sparse-down`` for each T of --outtypes (default
  q8_0,q4_0,q4_k; down projections neuron-major; a tensor whose rows are no multiple of T's
  block falls back per tensor, e.g. Q4_K -> Q4_0 at Falcon's d_model 4544 — the mix actually
  written is printed per file), each run in ``--mode dense`` and ``--mode sparse`` (gated: gate
  full, up rows of firing gates, down rows of nonzero products; non-gated: up full, down rows of
  nonzero activations) and, for the files of --predict, in lossy ``--mode predict`` with a
  predictor fitted on that file (runtime.fit_predictor.fit, 2,048 calibration tokens of the
  bundled text) and its false-negative rate measured on the decoded tokens;
- llama.cpp: its own Q4_K_M (``llama_model_quantize`` on our f16 export), run dense.

Each comparison alternates the two sides for --rounds rounds and reports the median per-round
tokens/s ratio beside every round (the machine is shared). Per file it also prints the MB/token
our byte counter measured in each mode (weights, KV cache, activations) and what the checker
(``aios-contract check``, as ``aios-run bench`` calls it) projects for the same file at the same
context length (prompt + tokens/2), with the measured / projected reduction, and the arithmetic
of our block kernels (runtime.kernels.arithmetic_label). Prints one JSON object; name the CPU
(``lscpu``) beside any figure. llama.cpp runs in its own process (benchmarks/llamacpp_worker.py),
on its default buffers or, where they crash (AMX Xeons), on its plain CPU buffers:
``llama_cpp_config`` beside every ratio says which.

    python benchmarks/sparse_quant_vs_llamacpp.py [--arch llama|falcon] [--layers 2] [--tokens 16] [--rounds 3]
        [--outtypes q8_0,q4_0,q4_k] [--predict q4_k] [--up-rank 0] [--no-project] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from runtime_vs_llamacpp import PROMPT, TOK, LlamaCpp, Ours, paired  # noqa: E402

LLAMA_FTYPE_MOSTLY_Q4_K_M = 15  # llama.h's llama_ftype


def _sampling():
    from runtime.generate import Sampling

    return Sampling(temperature=1000.0, seed=0)


def _low_rank_(w, rank: int, seed: int) -> None:
    """Replace ``w`` (d_ffn × d) by a random rank-``rank`` matrix with the same entry scale (0.02)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    u = torch.randn(w.shape[0], rank, generator=g)
    v = torch.randn(rank, w.shape[1], generator=g)
    w.copy_(u @ v * (0.02 / rank**0.5))


def build_falcon(folder: Path, layers: int, shift: float, up_rank: int = 0) -> None:
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
        for i, layer in enumerate(model.transformer.h):
            if up_rank:
                _low_rank_(layer.mlp.dense_h_to_4h.weight, up_rank, 1 + i)
            layer.input_layernorm.bias.fill_(1.0)  # LayerNorm centres x: its bias makes the FFN input positive
            layer.mlp.dense_h_to_4h.weight.sub_(shift)  # most up pre-activations negative
            layer.self_attention.dense.weight.mul_(0.1)
            layer.mlp.dense_4h_to_h.weight.mul_(0.1)
    model.save_pretrained(folder, safe_serialization=True)
    tok.save_pretrained(folder)


def build_model(folder: Path, layers: int, gate_shift: float, up_rank: int = 0) -> None:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(TOK)
    cfg = LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=layers,
                      num_attention_heads=32, num_key_value_heads=8, vocab_size=len(tok), hidden_act="relu",
                      tie_word_embeddings=False, max_position_embeddings=512)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).float()
    with torch.no_grad():
        # residual stream N(1, 1) per coordinate: positive on average (the shifted gate rows make ~90 % of
        # gate pre-activations negative) and varying from token to token as much as around its mean, so
        # each token fires its own neurons (|N(0, 0.02)| + 1 made every token fire the same ~10 %)
        model.model.embed_tokens.weight.normal_(1.0, 1.0)
        for i, layer in enumerate(model.model.layers):
            if up_rank:
                _low_rank_(layer.mlp.gate_proj.weight, up_rank, 1 + i)
            layer.mlp.gate_proj.weight.sub_(gate_shift)  # most gate pre-activations negative
            layer.self_attn.o_proj.weight.mul_(0.1)
            layer.mlp.down_proj.weight.mul_(0.1)
    model.save_pretrained(folder, safe_serialization=True)
    tok.save_pretrained(folder)


class OursTerms(Ours):
    """``Ours`` that also returns the measured MB/token of every term (weights, KV, activations), and
    decodes tokens drawn at random (temperature 1000, seeded) instead of greedily: a random-init model
    decoded greedily repeats one token, and in Falcon's parallel block layer 0's FFN input depends only
    on the token, so every step would fire the same neurons and find their rows in cache."""

    def __call__(self, n: int) -> dict:
        from runtime.generate import generate

        m = self.m
        _, tm = generate(m, PROMPT, n, sampling=_sampling())
        per_tok = {k: v / tm.generated / 1e6 for k, v in tm.decode_bytes.items()}
        return {"decode_tok_s": tm.decode_tps, "weight_bytes_per_token": tm.decode_bytes["weights"] / tm.generated,
                "mb_per_token": per_tok, "ffn_density": tm.decode_ffn_nnz / (tm.generated * m.hp.n_layers * m.hp.d_ffn)}

    def fnr(self, n: int) -> dict:
        """The same decode again, untimed, counting the predictor's misses (predict mode)."""
        from runtime.generate import generate

        self.m.measure_fnr = True
        try:
            generate(self.m, PROMPT, n, sampling=_sampling())
        finally:
            self.m.measure_fnr = False
        s = self.m.pred_stats
        return {"predictor_fnr": s["missed"] / max(1, s["fired"]), "predicted_density": s["predicted"] / max(1, s["rows"])}


def active_sets(o: Ours, n: int) -> dict:
    """One more decode of ``n`` tokens (untimed): the fraction of FFN neurons firing per token and in
    the union over the ``n`` tokens (per layer, averaged). A union near the per-token figure would mean
    every token fires the same neurons, whose rows then stay in cache: not what a trained model does."""
    import numpy as np

    from runtime.generate import generate

    m = o.m
    seen: list[tuple[int, np.ndarray]] = []
    m.ffn_act_hook = lambda layer, a: seen.append((layer, a[0] != 0)) if a.shape[0] == 1 else None
    try:
        generate(m, PROMPT, n, sampling=_sampling())
    finally:
        m.ffn_act_hook = None
    union = [np.logical_or.reduce([x for i, x in seen if i == k]).mean() for k in range(m.hp.n_layers)]
    return {"per_token": round(float(np.mean([x.mean() for _, x in seen])), 4),
            "union_over_tokens": round(float(np.mean(union)), 4), "tokens": n}


def tensor_mix(path: Path) -> dict:
    """Tensor types actually written (2-D tensors, count per type), the exporter's fallback lines
    and a hash of every tensor's bytes (two files with the same hash hold the same weights)."""
    import hashlib
    from collections import Counter

    import gguf

    r = gguf.GGUFReader(str(path))
    mix = Counter(t.tensor_type.name for t in r.tensors if len(t.shape) >= 2 and int(t.shape[1]) > 1)
    down = sorted({t.tensor_type.name for t in r.tensors if t.name.endswith("ffn_down.t")})
    f = r.fields.get("aios.export.fallbacks")
    fallbacks = [bytes(f.parts[i]).decode() for i in f.data] if f is not None else []
    h = hashlib.sha256()
    for t in r.tensors:
        h.update(t.name.encode() + t.tensor_type.name.encode())
        h.update(memoryview(t.data).cast("B"))
    return {"types_2d": dict(sorted(mix.items())), "ffn_down_t_type": down, "fallbacks": fallbacks,
            "tensors_sha256": h.hexdigest()[:16]}


def dense_weight_mb(path: Path) -> float:
    """Weight MB a dense decode step reads from ``path`` (analytic: every tensor once, the token
    embedding only as one row unless it is also the output head, as in tied Falcon)."""
    import gguf

    ts = {t.name: t for t in gguf.GGUFReader(str(path)).tensors}
    emb = ts["token_embd.weight"]
    total = sum(int(t.n_bytes) for t in ts.values())
    if "output.weight" in ts:
        total -= int(emb.n_bytes) - int(emb.n_bytes) // int(emb.shape[1])
    else:
        total += int(emb.n_bytes) // int(emb.shape[1])
    return round(total / 1e6, 3)


def projection(path: Path, context: int) -> dict:
    """What ``aios-contract check`` projects for ``path`` at ``context`` (as runtime.bench._projection
    runs it: 32 calibration samples of 64 tokens), with its terms. The checker counts a
    ``--sparse-down`` file's ``blk.N.ffn_down.t`` as the down projection (contract/projection.py)."""
    from contract.check import check_model

    t0 = time.perf_counter()
    rep = check_model(str(path), samples=32, max_tokens=64, context=context)
    p = rep.projection

    def metric(rid: str, name: str) -> float:
        m = next(r for r in rep.requirements if r.id == rid).metric(name)
        return float(m.value) if m is not None and m.value is not None else 0.0

    terms = {t.term: [round(t.baseline_bytes / 1e6, 3), round(t.projected_bytes / 1e6, 3)] for t in p.terms}
    w_base = sum(t.baseline_bytes for t in p.terms if t.term.startswith("weights"))
    w_proj = sum(t.projected_bytes for t in p.terms if t.term.startswith("weights"))
    return {
        "evidence": "projected (aios-contract check; not a measurement)",
        "context": context, "tier": rep.tier,
        "r1_exact_zero_fraction_checker": round(metric("R1", "mean_exact_zero_fraction"), 4),
        "r3_aliasing_ratio": round(metric("R3", "aliasing_ratio"), 4),
        "baseline_mb_per_token": p.baseline_mb_per_token, "projected_mb_per_token": p.projected_mb_per_token,
        "projected_reduction": p.projected_reduction,
        "projected_weight_reduction": round(1 - w_proj / w_base, 4) if w_base else None,
        "spec_projected_reduction": p.spec_projected_reduction,
        "terms_mb_baseline_projected": terms,
        "seconds": round(time.perf_counter() - t0, 1),
    }


def _mb(d: dict) -> dict:
    return {k: round(v, 3) for k, v in d["mb_per_token"].items()} | {"total": round(sum(d["mb_per_token"].values()), 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--arch", choices=("llama", "falcon"), default="llama")
    ap.add_argument("--shift", type=float, default=None,
                    help="Subtracted from the first FFN projection (default: ~90 %% zeros: 5.7e-4 llama, 5.4e-4 falcon).")
    ap.add_argument("--outtypes", default="q8_0,q4_0,q4_k", help="Our --sparse-down files' --outtype, comma-separated.")
    ap.add_argument("--predict", default=None,
                    help="Outtypes whose file also runs --mode predict (a predictor fitted on it; default: the "
                         "last of --outtypes); '' for none.")
    ap.add_argument("--up-rank", type=int, default=0,
                    help="Build the first FFN projection (falcon up, llama gate) as a random rank-R matrix (same "
                         "entry scale): FFN pre-activations a rank-32 predictor can learn, so predict mode runs at "
                         "a working predictor's density (0: full-rank random, which no low-rank predictor can "
                         "learn). A synthetic best case for the predictor, not a trained model's predictability.")
    ap.add_argument("--no-project", action="store_true", help="Skip the checker's projection (aios-contract check).")
    ap.add_argument("--keep", type=Path, default=None)
    args = ap.parse_args()
    from aios.reference import llamacpp
    from convert.gguf import GGUFExportConfig, export_gguf
    from runtime import kernels as K
    from runtime import predictor as P
    from runtime.bench import model_arithmetic
    from runtime.fit_predictor import fit

    outtypes = [t for t in args.outtypes.split(",") if t]
    predict = outtypes[-1:] if args.predict is None else [t for t in args.predict.split(",") if t]
    if not set(predict) <= set(outtypes):
        ap.error("--predict: each type must also be in --outtypes")
    work = args.keep or Path(tempfile.mkdtemp(prefix="aios-sq-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    dims = {"llama": "Llama-3.1-8B (d 4096, 32/8 heads, d_ffn 14336, gated)",
            "falcon": "Falcon-7B (d 4544, 71/1 heads, d_ffn 18176, non-gated, parallel)"}[args.arch]
    n = args.tokens
    context = len(PROMPT) + n // 2  # as aios-run bench: prompt + half the decoded tokens
    out: dict = {"dims": dims, "layers": args.layers, "tokens": args.tokens, "rounds": args.rounds,
                 "up_rank": args.up_rank or "full (random)", "arithmetic_setting": K.ARITHMETICS[0], "projection_context": context, "files": {}}
    t_start = time.perf_counter()
    try:
        src = work / "relu-hf"
        if not src.exists():
            if args.arch == "falcon":
                build_falcon(src, args.layers, 5.4e-4 if args.shift is None else args.shift, args.up_rank)
            else:
                build_model(src, args.layers, 5.7e-4 if args.shift is None else args.shift, args.up_rank)
        f16 = work / "relu-f16.gguf"
        export_gguf(str(src), f16, GGUFExportConfig("f16"))
        ref = work / "relu-Q4_K_M.gguf"
        llamacpp.quantize(f16, ref, LLAMA_FTYPE_MOSTLY_Q4_K_M)
        out["llamacpp_q4_k_m_bytes"] = ref.stat().st_size
        out["llamacpp_q4_k_m_types_2d"] = tensor_mix(ref)["types_2d"]
        out["llamacpp_q4_k_m_weight_mb_per_token_analytic"] = dense_weight_mb(ref)
        lc = LlamaCpp(ref)
        out["llama_cpp_config"] = lc.config
        lc_best = 0.0
        seen: dict[str, str] = {}  # tensors hash -> the outtype first measured with them
        dense_of: dict[str, dict] = {}  # outtype -> its dense measurement
        for t in outtypes:
            t0 = time.perf_counter()
            f = work / f"relu-{t}-sparse-down.gguf"
            export_gguf(str(src), f, GGUFExportConfig(t, sparse_down=True))
            res: dict = {"file_bytes": f.stat().st_size, **tensor_mix(f)}
            out["files"][t] = res
            same = seen.get(res["tensors_sha256"])
            if same is None:
                seen[res["tensors_sha256"]] = t
                modes = {"dense": OursTerms(f, "dense"), "sparse": OursTerms(f, "sparse")}
                res["arithmetic"] = model_arithmetic(modes["dense"].m)
            else:  # the fallbacks wrote the same tensors as an earlier type: measured there
                res["same_tensors_as"] = same
                res["note"] = f"every tensor identical to the {same} file's (fallbacks): dense/sparse/projection measured there"
                modes = {}
            if t in predict:
                t1 = time.perf_counter()
                pred = fit(f, P.PredictorConfig(max_tokens=2048))
                pf = P.save(pred, work / f"relu-{t}.predictor.npz")
                res["predictor_heldout_fnr_at_fit"] = round(pred.info["heldout"]["fnr"], 4)
                res["predictor_heldout_predicted_density_at_fit"] = round(pred.info["heldout"]["predicted_density"], 4)
                res["predictor_fit_seconds"] = round(time.perf_counter() - t1, 1)
                modes["predict"] = OursTerms(f, "predict", pf)
                res.setdefault("arithmetic", model_arithmetic(modes["predict"].m))
            measured = {}
            for mode, o in modes.items():
                r = paired(o, lc, n, args.rounds)
                lc_best = max(lc_best, r["b"]["decode_tok_s"])
                measured[mode] = r["a"]
                res[f"{mode}_mb_per_token"] = _mb(r["a"])
                res[f"{mode}_ffn_density"] = round(r["a"]["ffn_density"], 4)
                res[f"{mode}_tok_s"] = round(r["a"]["decode_tok_s"], 3)
                res[f"ratios_{mode}_over_llamacpp_q4_k_m"] = r["ratios"]
                res[f"ratio_{mode}_over_llamacpp_q4_k_m"] = r["ratio"]
                res["llama_cpp_config"] = lc.config  # what these ratios were measured against
                print(f"{t} {mode} / llama.cpp Q4_K_M: {r['ratio']:.3f} [llama.cpp: {lc.config}]",
                      file=sys.stderr, flush=True)
            if "sparse" in modes:
                res["ffn_firing_fraction"] = active_sets(modes["sparse"], n)
            if "predict" in modes:
                fr = modes["predict"].fnr(n)
                res["predict_decode_fnr"] = round(fr["predictor_fnr"], 4)
                res["predict_rows_computed"] = round(fr["predicted_density"], 4)
            if "sparse" in measured:
                res["ffn_exact_zero_fraction"] = round(1 - measured["sparse"]["ffn_density"], 4)
            dense_of[t] = measured.get("dense") or dense_of[same]
            dw = dense_of[t]["mb_per_token"]
            for mode in ("sparse", "predict"):
                if mode in measured:
                    mw = measured[mode]["mb_per_token"]
                    res[f"measured_weight_reduction_{mode}"] = round(1 - mw["weights"] / dw["weights"], 4)
                    res[f"measured_reduction_{mode}"] = round(1 - sum(mw.values()) / sum(dw.values()), 4)
            del modes
            if not args.no_project and same is None:
                pr = projection(f, context)
                res["projection"] = pr
                red = res["measured_reduction_sparse"]
                pk = pr["projected_reduction"]
                res["measured_over_projected_sparse"] = round(red / pk, 3) if pk else None
            res["seconds"] = round(time.perf_counter() - t0, 1)
        out["llamacpp_q4_k_m_dense_tok_s"] = round(lc_best, 3)
        out["llama_cpp_config"] = lc.config  # again: a crash during the rounds changes it
        lc.close()
    finally:
        out["seconds"] = round(time.perf_counter() - t_start, 1)
        print(json.dumps(out, indent=2))
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
