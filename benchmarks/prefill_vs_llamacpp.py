"""Benchmark: prompt processing (prefill), aios-run vs llama.cpp on the same file, one run.

A prompt of ``--tokens`` tokens (fixed pseudo-random ids, ``llamacpp_worker.prompt_tokens``) is
evaluated in one call from an empty context by each side, logits of the last token only, both
with ``--threads`` threads; the two sides alternate for ``--rounds`` rounds and the figure is the
median of the per-round ratios (ours / llama.cpp tokens/s) with its 95 % bootstrap interval.

Files (``--files``, comma-separated):

* ``gemma``: the real Gemma 3 270M Q4_K_M (aios.models.real; fetched once into the cache);
* ``llama-3.1-8b:Q4_K_M``, ``llama-3.1-8b:Q8_0`` (any llama.cpp preset, and ``falcon-7b:...``):
  a random-init checkpoint at those dimensions with ``--layers`` blocks, exported to f16 by
  ``aios-convert gguf`` and quantized by llama.cpp's own ``llama_model_quantize``;
* a path to any GGUF.

Ours runs ``Model.forward`` (aios-run's prompt step) in the process's arithmetic (int8 unless
``--arithmetic float``), from 16 tokens on as GEMMs over weights decoded once per matmul
(runtime.kernels.gemm, runtime.attention_gemm). ``--per-token`` also times the one-token kernels
run over the whole prompt (``AIOS_BATCHED_GEMM=0``'s path) so the gain is measured in the same run.
``--all-logits`` asks both sides for every token's logits, as a perplexity window of
``--tokens`` does (the output head then runs for each token); ours then keeps the weights'
unpacked rows across windows (``kernels.kept_unpacked``, as runtime.perplexity does; llama.cpp
repacks at load), filled by the warm-up. ``--crossover`` times ours at 4, 8, 16, 32 and 64 tokens with and without the GEMM form
(what GEMM_MIN_TOKENS rests on).

llama.cpp (llama-cpp-python) runs in its own process (benchmarks/llamacpp_worker.py) with
n_batch = n_ubatch = the prompt, on its default buffers; where they crash (AMX Xeons) on its plain
CPU buffers, and every result names which (``llama_cpp_config``). Name the CPU beside any figure.

    python benchmarks/prefill_vs_llamacpp.py [--files gemma,llama-3.1-8b:Q4_K_M,llama-3.1-8b:Q8_0]
        [--tokens 512] [--rounds 5] [--threads 2] [--layers 4] [--per-token] [--crossover] [--all-logits]
        [--keep DIR] [-o results.json]

Prints one JSON line per file.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from llamacpp_worker import LlamaCpp, prompt_tokens
from runtime_vs_llamacpp import paired


class OursPrefill:
    """aios-run's prompt step on one file, loaded once: each call evaluates the n-token prompt
    from an empty context and returns {"prefill_tok_s": ...}."""

    def __init__(self, path: Path, n_max: int, all_logits: bool = False, arithmetic: str | None = None) -> None:
        from runtime.model import Model

        self.all_logits = all_logits
        self.m = Model(path, mode="dense", n_ctx=n_max + 16, arithmetic=arithmetic)
        self.vocab = self.m.tok_embd.n_out
        self.arith = self.m.arith
        if all_logits:  # as runtime.perplexity runs its windows: unpacked rows kept across them
            from runtime.kernels import kept_unpacked
            from runtime.measure import stored_matrices

            self._kept = kept_unpacked(matrices=stored_matrices(self.m))
            self.arith = self.arith.keeping(self._kept.__enter__())  # until close()
        self(64)  # warm-up: pages touched, the GEMM form's kernels loaded from numba's cache

    def close(self) -> None:
        if self.all_logits:
            self._kept.__exit__(None, None, None)

    def __call__(self, n: int, gemm: bool = True) -> dict:
        from dataclasses import replace

        toks = prompt_tokens(n, self.vocab)
        self.m.reset()
        t = time.perf_counter()
        self.m.forward(toks, all_logits=self.all_logits, arith=replace(self.arith, batched=gemm))
        return {"prefill_tok_s": n / (time.perf_counter() - t)}


def alternated(ours, theirs, n: int, rounds: int) -> dict:
    """ours and theirs alternated (``runtime_vs_llamacpp.paired``): best tokens/s of each,
    per-round ratios, their median and its 95 % bootstrap interval."""
    p = paired(ours, theirs, n, rounds, key="prefill_tok_s")
    return {"ours_tok_s": round(p["a"]["prefill_tok_s"], 1), "llamacpp_tok_s": round(p["b"]["prefill_tok_s"], 1),
            "ratios": p["ratios"], "ratio": p["ratio"], "ratio_ci95": p["ratio_ci95"]}


def resolve(spec: str, work: Path, layers: int) -> Path:
    """A --files entry as a GGUF path (built and quantized by llama.cpp when needed)."""
    if spec == "gemma":
        from aios.models import real

        return real.fetch()
    if ":" in spec and not Path(spec).exists():
        from q4_k_m_families import build, quantize

        from convert.gguf import GGUFExportConfig, export_gguf

        arch, preset = spec.split(":", 1)
        f16 = work / f"{arch}.F16.gguf"
        if not f16.exists():
            src = work / f"{arch}-random-init"
            build(src, arch, layers)
            export_gguf(str(src), f16, GGUFExportConfig("f16"))
            shutil.rmtree(src)
        if preset.upper() == "F16":
            return f16
        path = work / f"{arch}.{preset}.gguf"
        if not path.exists():
            quantize(f16, path, preset)
        return path
    path = Path(spec)
    if not path.is_file():
        raise SystemExit(f"No GGUF at {path}.")
    return path


def one_file(spec: str, path: Path, args) -> dict:
    from runtime import kernels

    ours = OursPrefill(path, args.tokens, args.all_logits, args.arithmetic)
    row: dict = {"file": spec, "bytes": path.stat().st_size, "tokens": args.tokens, "threads": args.threads,
                 "arithmetic": kernels.arithmetic_label(ours.arith), "rounds": args.rounds, "all_logits": args.all_logits}
    if args.crossover:
        cross = {}
        for n in (4, 8, 16, 32, 64):
            per, gemm = [], []
            for _ in range(3):
                per.append(ours(n, gemm=False)["prefill_tok_s"])
                gemm.append(ours(n, gemm=True)["prefill_tok_s"])
            cross[str(n)] = {"per_token_tok_s": round(max(per), 1), "gemm_tok_s": round(max(gemm), 1)}
        row["crossover"] = cross
    if args.per_token:
        per = [ours(args.tokens, gemm=False)["prefill_tok_s"] for _ in range(2)]
        row["ours_per_token_kernels_tok_s"] = round(max(per), 1)
    theirs = LlamaCpp(path, threads=args.threads, batch=args.tokens, all_logits=args.all_logits)
    try:
        row.update(alternated(ours, theirs, args.tokens, args.rounds))
        row["llama_cpp_config"] = theirs.config
    finally:
        theirs.close()
        ours.close()
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", default="gemma,llama-3.1-8b:Q4_K_M,llama-3.1-8b:Q8_0")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2, help="Threads for both sides.")
    ap.add_argument("--layers", type=int, default=4, help="Blocks of the random-init real-dimension models.")
    ap.add_argument("--arithmetic", choices=("int8", "float", "int16"), default="int8",
                    help="Ours: int16 is what perplexity runs in (runtime.perplexity)")
    ap.add_argument("--per-token", action="store_true", help="Also time the one-token kernels over the prompt.")
    ap.add_argument("--crossover", action="store_true", help="Time 4-64 tokens with and without the GEMM form.")
    ap.add_argument("--all-logits", action="store_true",
                    help="Every token's logits, as a perplexity window (the quality gate's measurement).")
    ap.add_argument("--keep", type=Path, default=None, help="Keep the built files in this folder (and reuse them).")
    ap.add_argument("-o", "--output", type=Path, default=None)
    args = ap.parse_args()
    from runtime import kernels

    kernels.set_threads(args.threads)
    work = args.keep or Path(tempfile.mkdtemp(prefix="aios-prefill-"))
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    try:
        for spec in [s for s in args.files.split(",") if s]:
            try:
                row = one_file(spec, resolve(spec, work, args.layers), args)
            except Exception as e:  # noqa: BLE001 - one file's failure is a finding: report it, go on
                row = {"file": spec, "error": f"{type(e).__name__}: {e}"}
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    if args.output:
        args.output.write_text(json.dumps({"rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
