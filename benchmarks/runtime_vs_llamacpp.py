"""Benchmark the runtime as ratios measured side by side in one run.

1. Streaming bandwidth of this machine: the best of several parallel read kernels over a 1 GiB
   float32 array (64 independent lanes; 1, 4 or 8 rows at a time with or without prefetch, the
   GEMV's own access patterns without its multiplications: ``READS``), each printed.
2. Our dense f32 decode of a ~1 GB random-init Llama-architecture model: effective weight
   bandwidth (weight bytes read per token × tokens/s) as a fraction of (1).
3. Decode tokens/s, ours vs llama.cpp (llama-cpp-python, same threads), on the same f32,
   q8_0, q4_0 and q4_k_m files (q4_k_m: our f16 export quantized by llama.cpp's own
   llama_model_quantize to the Q4_K_M preset, Q4_K + Q6_K tensors, the most deployed preset).
   The quantized files run once per --arithmetic (default both): ``int8`` quantizes the
   activations per matmul (Q8_0 blocks of 32, Q8_K blocks of 256 for Q4_K/Q6_K) and uses
   integer dot products as llama.cpp does, ``float`` decodes the weights to float; with both,
   int8 and float are also paired against each other (``ratio_int8_over_float_*``).
4. Exact sparse decode of a ReLU model with ≥ 85 % exact-zero FFN activations vs llama.cpp's
   dense decode of the same weights. The model is random-init, built so most gate
   pre-activations are negative (positive residual stream, gate rows shifted by
   --gate-shift; the default gives ~90 % zeros, measured and printed): a speed test of the
   sparse path at a known sparsity, not a quality claim. Exact sparse reads the gate, the
   up rows of nonzero gates and the down rows of nonzero activations. For reference the
   lossy ``predict`` mode (a predictor fitted on the bundled calibration text) is run too,
   with its false-negative rate.

Each comparison alternates the two sides for --rounds rounds (a,b then b,a ...) and reports
the median of the per-round ratios beside each round's ratio, because this machine is shared
and one slow round should not decide a figure.

    python benchmarks/runtime_vs_llamacpp.py [--layers 6] [--tokens 16] [--rounds 3] [--gate-shift 6e-4] [--keep DIR]
        [--arithmetic int8|float|both] [--quant-only] [--quant-types q8_0,q4_0,q4_k_m]

--quant-only runs only the quantized-file comparisons (3) of --quant-types, skipping the f32
bandwidth, f32 and ReLU-sparse sections.

Needs llama-cpp-python (in the test extra). llama.cpp runs in its own process
(benchmarks/llamacpp_worker.py): if it crashes on its default buffers (AMX Xeons, see
docs/benchmarks.md) it runs on its plain CPU buffers, and every ratio names the configuration it
was measured against (``llama_cpp_config_<file>`` in the JSON, "[llama.cpp: ...]" on each ratio line
printed to stderr as it is measured). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from numba import njit, prange

from llamacpp_worker import PROMPT, LlamaCpp  # the other benchmarks import them from here
from aios.reference import llamacpp
from runtime import kernels as S

ROOT = Path(__file__).resolve().parents[1]
TOK = ROOT / "aios" / "fixtures" / "tiny-llama"


@njit(parallel=True, fastmath=True, cache=True)
def _psum(a):
    # 64 independent lanes per row of 64 floats: a single running sum is a dependency chain
    # that runs at the adder's latency (~7 GB/s here), not at memory speed
    n = a.shape[0] // 64
    b = a[: n * 64].reshape(n, 64)
    nch = 64
    parts = np.zeros((nch, 64), np.float32)
    step = (n + nch - 1) // nch
    for c in prange(nch):
        acc = parts[c]
        for r in range(c * step, min(n, (c + 1) * step)):
            row = b[r]
            for u in range(64):
                acc[u] += row[u]
    return parts.sum()


# The plain reads the bandwidth figures are judged against: rows of 8 KiB read as integers
# (name: (rows per step, each row prefetched ROW_AHEAD on or not)). The fastest differs by CPU: on a 2-core
# Xeon (emeraldrapids) four rows prefetched; on a 2-core AMD EPYC (znver4) eight rows without
# prefetch read the matrices of a Llama-3.1-8B-dims F16 file 1.14× as fast as that (30 rounds).
READS = {"rows4_prefetch": (4, True), "rows8_prefetch": (8, True), "rows8": (8, False), "rows1": (1, False)}
_READERS = {}


def _reader(pattern: str):
    if pattern not in _READERS:
        nrows, prefetch = READS[pattern]
        rd = S.read_rows_u32(nrows, prefetch)

        @njit(parallel=True)
        def run(w):  # w (n, k) uint32, n a multiple of nrows, k of 16
            n, k = w.shape
            parts = np.zeros(n // nrows, np.uint32)
            for g in prange(n // nrows):
                parts[g] = rd(w[g * nrows:], k)
            return parts

        _READERS[pattern] = run
    return _READERS[pattern]


def read_rows(b, pattern: str = "rows4_prefetch") -> int:
    """One read of ``b`` (a C-contiguous array of a multiple of 64 KiB, any dtype) in rows of
    8 KiB by one of the READS patterns: the runtime's GEMV access pattern without its arithmetic.
    Integer ops only, so the bytes of a quantized file read as fast as any others (see
    ``kernels.read_rows_u32``)."""
    w = b.reshape(-1).view(np.uint32).reshape(-1, 2048)
    return int(np.bitwise_xor.reduce(_reader(pattern)(w)))


def fastest_read(arrays, rounds: int = 5) -> str:
    """The READS pattern that reads ``arrays`` (each as ``read_rows`` takes it) fastest here:
    the median of ``rounds`` alternated reads of all of them per pattern."""
    times = {p: [] for p in READS}
    for p in READS:  # compile and warm
        for a in arrays:
            read_rows(a, p)
    for _ in range(rounds):
        for p in READS:
            t = time.perf_counter()
            for a in arrays:
                read_rows(a, p)
            times[p].append(time.perf_counter() - t)
    return min(READS, key=lambda p: float(np.median(times[p])))


def stream_bandwidth(nbytes: int = 1 << 30, reps: int = 5) -> dict:
    """Read bandwidth of a 1 GiB float32 array by several kernels; the machine's figure is the best.

    A probe weaker than the code it judges would flatter the ratio, so the strongest read
    patterns available (the GEMV's, with and without prefetch) are among the probes.
    """
    return {k: max(v) for k, v in stream_samples(nbytes, reps).items()}


class WeightProbe:
    """The fastest plain read of the very bytes a decode step reads, in the same order: the
    model's matrices (each layer's, then the output head) read by the fastest READS pattern on
    this machine (``fastest_read``, chosen once over these bytes; ``pattern``), a matrix's
    bytes seen as rows of 8 KiB, the last < 64 KiB of each left out. Timed right after
    each decode step (``presets_real_dims.step_pairs``), it sees the machine in the same ~100 ms
    and the same cache state; a probe over its own 1 GiB array minutes away saw neither (on this
    shared machine it swung 20-40 GB/s between rounds, and the host's 260 MB L3 keeps part of a
    repeatedly read array)."""

    def __init__(self, model) -> None:
        mats = [p for L in model.layers for op in L.values() if hasattr(op, "parts") for p in op.parts()]
        mats += model.output.parts()
        seen, self.views = set(), []
        for p in mats:
            if id(p.data) in seen:
                continue
            seen.add(id(p.data))
            flat = np.asarray(p.data).reshape(-1).view(np.uint8)
            n = flat.nbytes // (8 * 8192) * (8 * 8192)
            if n:
                self.views.append(flat[:n].view(np.float32).reshape(-1, 2048))
        self.nbytes = sum(v.nbytes for v in self.views)
        self.pattern = fastest_read(self.views)

    def __call__(self) -> float:
        """GB/s of one read of every view."""
        t = time.perf_counter()
        for v in self.views:
            read_rows(v, self.pattern)
        return self.nbytes / (time.perf_counter() - t) / 1e9


def stream_samples(nbytes: int = 1 << 30, reps: int = 5) -> dict:
    """Every repetition's GB/s of each ``stream_bandwidth`` probe ({probe: [GB/s, ...]}):
    ``lanes64`` and every READS pattern."""
    a = np.ones(nbytes // 4, np.float32)
    b = a.reshape(-1, 2048)
    out = {}
    fns = {"lanes64": lambda: _psum(a), **{p: (lambda p=p: read_rows(b, p)) for p in READS}}
    for name, fn in fns.items():
        fn()
        out[name] = [nbytes / _timed(fn) / 1e9 for _ in range(reps)]
    return out


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def build_model(folder: Path, layers: int, relu_sparse: bool, gate_shift: float = 6e-4) -> None:
    """Random-init Llama (d 2048, ffn 5632, GQA 16/2): ~1.06 GB of f32 weights at 6 layers."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(TOK)
    cfg = LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=layers,
                      num_attention_heads=16, num_key_value_heads=2, vocab_size=len(tok),
                      hidden_act="relu" if relu_sparse else "silu", tie_word_embeddings=False,
                      max_position_embeddings=512)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).float()
    if relu_sparse:
        with torch.no_grad():
            model.model.embed_tokens.weight.abs_().add_(1.0)  # positive residual stream
            for layer in model.model.layers:
                # gate pre-activation ≈ N(0, 0.02·√d) − shift·Σx: shift 6e-4 leaves ~10 % positive
                layer.mlp.gate_proj.weight.sub_(gate_shift)
                layer.self_attn.o_proj.weight.mul_(0.1)
                layer.mlp.down_proj.weight.mul_(0.1)
    model.save_pretrained(folder, safe_serialization=True)
    tok.save_pretrained(folder)


def export(src: Path, out: Path, outtype: str) -> Path:
    from convert.gguf import GGUFExportConfig, export_gguf

    export_gguf(str(src), out, GGUFExportConfig(outtype=outtype))
    return out


class Ours:
    """Our runtime on one file, loaded once; each call decodes ``n`` tokens after a prompt."""

    def __init__(self, path: Path, mode: str, predictor: Path | None = None, arithmetic: str | None = None) -> None:
        from runtime.model import Model

        self.m = Model(path, mode=mode, n_ctx=256, predictor=predictor, arithmetic=arithmetic)
        self.mode = mode
        self(2)  # warm-up (compiles nothing: numba kernels are cached; touches the pages)

    def __call__(self, n: int) -> dict:
        from runtime.generate import generate

        m = self.m
        _, tm = generate(m, PROMPT, n)
        density = tm.decode_ffn_nnz / (tm.generated * m.hp.n_layers * m.hp.d_ffn)
        return {"decode_tok_s": tm.decode_tps, "weight_bytes_per_token": tm.decode_bytes["weights"] / tm.generated,
                "ffn_density": density}

    def fnr(self, n: int) -> dict:
        """The same decode again, untimed, counting the predictor's misses (predict mode)."""
        from runtime.generate import generate

        self.m.measure_fnr = True
        generate(self.m, PROMPT, n)
        self.m.measure_fnr = False
        s = self.m.pred_stats
        return {"predictor_fnr": s["missed"] / max(1, s["fired"]), "predicted_density": s["predicted"] / max(1, s["rows"])}




def interval(ratios, seed: int = 0) -> list[float]:
    """95 % bootstrap interval (10,000 resamples) of the median of ``ratios``: how far the
    reported median could move on this machine's round-to-round noise."""
    x = np.asarray(ratios, float)
    boot = np.median(np.random.default_rng(seed).choice(x, (10000, len(x))), axis=1)
    return [round(float(v), 3) for v in np.percentile(boot, [2.5, 97.5])]


def paired(a, b, n: int, rounds: int, key: str = "decode_tok_s") -> dict:
    """Alternate a and b (a,b then b,a ...) so drift on a shared machine hits both alike.

    Returns the best tokens/s (``key`` of each call's answer) of each, the per-round ratios a/b,
    their median (the figure reported: a single slow round on either side does not decide it)
    and its 95 % bootstrap interval.
    """
    ra, rb, ratios = [], [], []
    for r in range(rounds):
        if r % 2 == 0:
            x, y = a(n), b(n)
        else:
            y, x = b(n), a(n)
        ra.append(x)
        rb.append(y)
        ratios.append(x[key] / y[key])
    best = lambda rs: max(rs, key=lambda d: d[key])  # noqa: E731
    return {"a": best(ra), "b": best(rb), "ratios": [round(x, 3) for x in ratios],
            "ratio": round(float(np.median(ratios)), 3), "ratio_ci95": interval(ratios)}


QUANT_TYPES = ("q8_0", "q4_0", "q4_k_m")


def quantize_llamacpp(src: Path, dst: Path, preset: str) -> Path:
    """``src`` (a GGUF) quantized by llama.cpp's llama_model_quantize to ``preset`` ("Q4_K_M"),
    in a child process (``aios.reference.llamacpp.quantize``). ``quantize_llamacpp.last`` is
    that call's Result: ``.seconds`` the quantizer's own time in the child, ``.config`` the
    llama.cpp configuration."""
    quantize_llamacpp.last = llamacpp.quantize(src, dst, preset)
    return dst


quantize_llamacpp.last = None


def config_text(config: str) -> str:
    """How a printed line names the llama.cpp configuration a ratio was measured against."""
    return f"[llama.cpp: {config}]"


def quant_vs_llamacpp(work: Path, src: Path, arith: list[str], n: int, rounds: int, out: dict,
                      kinds=QUANT_TYPES) -> None:
    """Quantized files: ours (each arithmetic) vs llama.cpp, and int8 vs float when both run."""
    for t in kinds:
        path = work / f"dense-{t}.gguf"
        if not path.exists():
            if t == "q4_k_m":
                f16 = work / "dense-f16.gguf"
                if not f16.exists():
                    export(src, f16, "f16")
                quantize_llamacpp(f16, path, "Q4_K_M")
            else:
                export(src, path, t)
        theirs = LlamaCpp(path)
        ours = {a: Ours(path, "dense", arithmetic=a) for a in arith}
        for a, o in ours.items():
            p = paired(o, theirs, n, rounds)
            out[f"ours_{t}_{a}_tok_s"] = round(p["a"]["decode_tok_s"], 3)
            out[f"llamacpp_{t}_tok_s"] = max(out.get(f"llamacpp_{t}_tok_s", 0.0), round(p["b"]["decode_tok_s"], 3))
            out[f"ratios_ours_{a}_over_llamacpp_{t}"], out[f"ratio_ours_{a}_over_llamacpp_{t}"] = p["ratios"], p["ratio"]
            out[f"llama_cpp_config_{t}"] = theirs.config  # beside the ratios measured against it
            print(f"ours {a} / llama.cpp, {t}: {p['ratio']:.3f} {config_text(theirs.config)}",
                  file=sys.stderr, flush=True)
        if len(ours) == 2:
            p = paired(ours["int8"], ours["float"], n, rounds)
            out[f"ratios_int8_over_float_{t}"], out[f"ratio_int8_over_float_{t}"] = p["ratios"], p["ratio"]
        del theirs, ours


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3, help="Alternating rounds per comparison (median reported).")
    ap.add_argument("--gate-shift", type=float, default=6e-4,
                    help="Subtracted from the ReLU model's gate weights (sets its sparsity).")
    ap.add_argument("--keep", type=Path, default=None)
    ap.add_argument("--arithmetic", choices=[*S.ARITHMETICS, "both"], default="both",
                    help="Our block kernels' arithmetic for the quantized-file comparisons.")
    ap.add_argument("--quant-only", action="store_true", help="Only the quantized-file comparisons.")
    ap.add_argument("--quant-types", default=",".join(QUANT_TYPES),
                    help=f"Quantized files compared (subset of {','.join(QUANT_TYPES)}).")
    args = ap.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="aios-rt-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    out: dict = {"tokens": args.tokens, "rounds": args.rounds}
    arith = list(S.ARITHMETICS) if args.arithmetic == "both" else [args.arithmetic]
    kinds = [t for t in args.quant_types.split(",") if t]
    if not set(kinds) <= set(QUANT_TYPES):
        ap.error(f"--quant-types: choose from {','.join(QUANT_TYPES)}")
    out["arithmetic"] = {a: S.arithmetic_label("int8", {"Q8_0", "Q4_K", "Q6_K"}) if a == "int8" else "float" for a in arith}
    n, R = args.tokens, args.rounds
    try:
        dense_src, relu_src = work / "dense-hf", work / "relu-hf"
        if not dense_src.exists():
            build_model(dense_src, args.layers, relu_sparse=False)
        if not relu_src.exists() and not args.quant_only:
            build_model(relu_src, args.layers, relu_sparse=True, gate_shift=args.gate_shift)
        if args.quant_only:
            quant_vs_llamacpp(work, dense_src, arith, n, R, out, kinds)
            return
        f32 = export(dense_src, work / "dense-f32.gguf", "f32")
        relu = export(relu_src, work / "relu-f32.gguf", "f32")
        out["model_f32_bytes"] = f32.stat().st_size

        # 1-2: effective weight bandwidth of dense f32 decode vs the stream probe, alternated
        ours32 = Ours(f32, "dense")
        eff, probes = [], {}
        for _ in range(R):
            for k, v in stream_bandwidth().items():
                probes[k] = max(probes.get(k, 0.0), v)
            o = ours32(n)
            eff.append(o["weight_bytes_per_token"] * o["decode_tok_s"] / 1e9)
        out["stream_probes_gb_s"] = {k: round(v, 2) for k, v in probes.items()}
        out["stream_gb_s"] = round(max(probes.values()), 2)
        out["f32_weight_bytes_per_token"] = int(o["weight_bytes_per_token"])
        out["ours_f32_effective_gb_s"] = round(max(eff), 2)
        out["ratio_effective_over_stream"] = round(max(eff) / out["stream_gb_s"], 3)

        # 3: same files, ours vs llama.cpp
        lc32 = LlamaCpp(f32)
        p = paired(ours32, lc32, n, R)
        out["ours_f32_tok_s"], out["llamacpp_f32_tok_s"] = round(p["a"]["decode_tok_s"], 3), round(p["b"]["decode_tok_s"], 3)
        out["ratios_ours_over_llamacpp_f32"], out["ratio_ours_over_llamacpp_f32"] = p["ratios"], p["ratio"]
        out["llama_cpp_config_f32"] = lc32.config
        print(f"ours / llama.cpp, f32: {p['ratio']:.3f} {config_text(lc32.config)}", file=sys.stderr, flush=True)
        del lc32
        del ours32
        quant_vs_llamacpp(work, dense_src, arith, n, R, out, kinds)

        # 4: exact sparse vs llama.cpp dense on the same ReLU weights
        lr = LlamaCpp(relu)
        sp = Ours(relu, "sparse")
        p = paired(sp, lr, n, R)
        out["relu_ffn_exact_zero_fraction"] = round(1 - p["a"]["ffn_density"], 4)
        out["sparse_weight_bytes_per_token"] = int(p["a"]["weight_bytes_per_token"])
        out["ours_sparse_tok_s"], out["llamacpp_dense_same_weights_tok_s"] = round(p["a"]["decode_tok_s"], 3), round(p["b"]["decode_tok_s"], 3)
        out["ratios_ours_sparse_over_llamacpp_dense"], out["ratio_ours_sparse_over_llamacpp_dense"] = p["ratios"], p["ratio"]
        out["llama_cpp_config_relu_f32"] = lr.config
        print(f"ours sparse / llama.cpp dense, relu f32: {p['ratio']:.3f} {config_text(lr.config)}",
              file=sys.stderr, flush=True)
        del sp
        # lossy, for reference: the up/gate predictor (aios-run fit-predictor) on the same file
        from runtime import predictor as P
        from runtime.fit_predictor import fit

        pf = P.save(fit(relu, P.PredictorConfig(max_tokens=2048)), work / "relu-f32.predictor.npz")
        pr = Ours(relu, "predict", pf)
        p = paired(pr, lr, n, R)
        f = pr.fnr(n)
        out["ours_predict_lossy_tok_s"] = round(p["a"]["decode_tok_s"], 3)
        out["predict_decode_fnr"] = round(f["predictor_fnr"], 4)
        out["predict_rows_computed"] = round(f["predicted_density"], 4)
        out["ratios_ours_predict_lossy_over_llamacpp_dense"] = p["ratios"]
        out["ratio_ours_predict_lossy_over_llamacpp_dense"] = p["ratio"]
        out["llama_cpp_config_relu_f32"] = lr.config  # again: a crash during these rounds changes it
        print(f"ours predict (lossy) / llama.cpp dense, relu f32: {p['ratio']:.3f} {config_text(lr.config)}",
              file=sys.stderr, flush=True)
    finally:
        print(json.dumps(out, indent=2))
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
