"""Benchmark: decode speed after long prompts, aios-run vs llama.cpp on the same GGUF file.

Short-prompt benchmarks hide attention: at a 16-token context it is ~1 % of a decode step, at
2048 tokens it reads 16 MB of K/V per Llama-3.1-8B layer and ran 3.6x longer than llama.cpp's
before runtime.ggml_ops.vec_dot_f32 (docs/benchmarks.md). For each ``--contexts`` length: a
random prompt of that many tokens is prefilled (untimed, chunks of 256), then ``--tokens``
single-token decode steps are timed; ours and llama.cpp (llama-cpp-python, same threads, F32
KV cache as ours) alternate for ``--rounds`` rounds, each in a fresh process so one side's page
cache or heap does not help the other. Prints one JSON line per context: tok/s of each (median
of rounds) and the median of the per-round ratios.

    python benchmarks/long_context.py FILE.gguf [--contexts 16,512,2048] [--tokens 12] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_CHILD = r"""
import sys, time
sys.path.insert(0, {root!r})
import numpy as np
path, ctx, n, side, threads = {path!r}, {ctx}, {n}, {side!r}, {threads}
prompt = [int(x) for x in np.random.default_rng(0).integers(100, 1000, ctx)]
if side == "ours":
    from runtime import kernels
    from runtime.model import Model
    kernels.set_threads(threads)
    m = Model(path, n_ctx=ctx + n + 8)
    for c in range(0, ctx, 256):
        m.forward(prompt[c:c + 256])
    m.forward([5])
    step = lambda t: m.forward([t])
else:
    from llama_cpp import Llama
    llm = Llama(model_path=path, n_ctx=ctx + n + 8, n_threads=threads, n_batch=256, verbose=False,
                type_k=0, type_v=0)
    llm.eval(prompt + [5])
    step = lambda t: llm.eval([t])
t = time.perf_counter()
for i in range(n):
    step(6 + i)
print(n / (time.perf_counter() - t))
"""


def run(path: Path, ctx: int, n: int, side: str, threads: int) -> float:
    code = _CHILD.format(root=str(ROOT), path=str(path), ctx=ctx, n=n, side=side, threads=threads)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    if r.returncode:
        raise SystemExit(f"{side} failed at context {ctx}: {(r.stderr.strip().splitlines() or ['?'])[-1]}")
    return float(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file", type=Path)
    ap.add_argument("--contexts", default="16,512,2048")
    ap.add_argument("--tokens", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="Threads for both (default: physical cores).")
    args = ap.parse_args()
    if not args.file.is_file():
        raise SystemExit(f"No such GGUF file: {args.file}.")
    sys.path.insert(0, str(ROOT))
    from runtime.kernels import physical_cores

    threads = args.threads or physical_cores()
    for ctx in (int(c) for c in args.contexts.split(",")):
        ours, theirs, ratios = [], [], []
        for r in range(args.rounds):
            sides = ("ours", "llama.cpp") if r % 2 == 0 else ("llama.cpp", "ours")
            got = {s: run(args.file, ctx, args.tokens, s, threads) for s in sides}
            ours.append(got["ours"])
            theirs.append(got["llama.cpp"])
            ratios.append(got["ours"] / got["llama.cpp"])
        print(json.dumps({"file": args.file.name, "context": ctx, "threads": threads,
                          "tok_s": {"aios_run": round(statistics.median(ours), 2),
                                    "llama_cpp": round(statistics.median(theirs), 2)},
                          "ratios": [round(x, 3) for x in ratios], "ratio": round(statistics.median(ratios), 3)}),
              flush=True)


if __name__ == "__main__":
    main()
