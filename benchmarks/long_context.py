"""Benchmark: decode speed after long prompts, aios-run vs llama.cpp on the same GGUF file.

Short-prompt benchmarks hide attention: at a 16-token context it is ~1 % of a decode step, at
2048 tokens it reads 16 MB of K/V per Llama-3.1-8B layer and ran 3.6x longer than llama.cpp's
before runtime.ggml_ops.vec_dot_f32 (docs/benchmarks.md). For each ``--contexts`` length: a
random prompt of that many tokens is prefilled (untimed, chunks of 256), then ``--tokens``
single-token decode steps are timed; ours and llama.cpp (llama-cpp-python, same threads, F32
KV cache as ours) alternate for ``--rounds`` rounds, each in a fresh process so one side's page
cache or heap does not help the other. Prints one JSON line per context: tok/s of each (median
of rounds), the median of the per-round ratios, and ``llama_cpp_config``: llama.cpp's child runs
on its default buffers until one dies of a signal there (llama-cpp-python built natively on AMX
Xeons), then on its plain CPU buffers (``aios.reference.llamacpp.load(plain=True)``); a crash
there too leaves its side empty and says so, and ours is still measured. Both sides time only
their decode steps, inside their own process.

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
    from aios.reference.llamacpp import load
    llm = load(path, plain=side == "llama.cpp plain", n_ctx=ctx + n + 8, n_threads=threads, n_batch=256,
               type_k=0, type_v=0)
    llm.eval(prompt + [5])
    step = lambda t: llm.eval([t])
t = time.perf_counter()
for i in range(n):
    step(6 + i)
print(n / (time.perf_counter() - t))
"""


def run(path: Path, ctx: int, n: int, side: str, threads: int) -> float:
    """tok/s of ``n`` decode steps after a ``ctx``-token prompt, timed in a fresh process of
    ``side`` ("ours", "llama.cpp" on its default buffers, "llama.cpp plain")."""
    from aios.reference.llamacpp import no_core_dump, clean_env

    code = _CHILD.format(root=str(ROOT), path=str(path), ctx=ctx, n=n, side=side, threads=threads)
    # llama.cpp's child: the environment it would have alone (without our runtime's OpenMP wait)
    env = None if side == "ours" else clean_env()
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, env=env,
                       preexec_fn=None if side == "ours" else no_core_dump)
    if r.returncode:
        if r.returncode < 0 and side != "ours":
            raise _Crash(r.returncode)
        raise SystemExit(f"{side} failed at context {ctx}: {(r.stderr.strip().splitlines() or ['?'])[-1]}")
    return float(r.stdout.strip().splitlines()[-1])


class _Crash(Exception):
    """llama.cpp's child died of a signal (return code ``rc``)."""

    def __init__(self, rc: int) -> None:
        super().__init__(rc)
        self.rc = rc


class LlamaCppSide:
    """llama.cpp's side: default buffers until a child dies of a signal there, plain buffers from
    then on (``config`` says which); a crash on plain buffers too sets ``crashed``."""

    def __init__(self) -> None:
        from aios.reference.llamacpp import DEFAULT

        self.side, self.config, self.crashed = "llama.cpp", DEFAULT, None

    def __call__(self, path: Path, ctx: int, n: int, threads: int) -> float | None:
        from aios.reference.llamacpp import exit_text, plain_config

        while self.crashed is None:
            try:
                return run(path, ctx, n, self.side, threads)
            except _Crash as c:
                if self.side == "llama.cpp plain":
                    self.crashed = (f"llama.cpp {exit_text(c.rc)} at context {ctx} on its plain CPU buffers too "
                                    f"({self.config})")
                else:
                    self.side, self.config = "llama.cpp plain", plain_config(c.rc)
        return None


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
    lc = LlamaCppSide()
    for ctx in (int(c) for c in args.contexts.split(",")):
        ours, theirs, ratios = [], [], []
        for r in range(args.rounds):
            sides = ("ours", "llama.cpp") if r % 2 == 0 else ("llama.cpp", "ours")
            got = {}
            for side in sides:
                got[side] = (run(args.file, ctx, args.tokens, side, threads) if side == "ours"
                             else lc(args.file, ctx, args.tokens, threads))
            ours.append(got["ours"])
            if got["llama.cpp"] is not None:
                theirs.append(got["llama.cpp"])
                ratios.append(got["ours"] / got["llama.cpp"])
        line = {"file": args.file.name, "context": ctx, "threads": threads,
                "tok_s": {"aios_run": round(statistics.median(ours), 2),
                          "llama_cpp": round(statistics.median(theirs), 2) if theirs else None},
                "ratios": [round(x, 3) for x in ratios],
                "ratio": round(statistics.median(ratios), 3) if ratios else None,
                # what the ratio was measured against ("llama.cpp default buffers", "plain buffers,
                # default crashed (SIGSEGV)"), or the crash that left llama.cpp's side empty
                "llama_cpp_config": lc.config if lc.crashed is None else f"crashed: {lc.crashed}"}
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
