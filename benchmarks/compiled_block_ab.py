"""Benchmark: decode with the compiled block (``Model.fused_glue``) against the step by step
Python block and against llama.cpp, on one GGUF, in rotating rounds.

Three arms in one run: aios-run as it ships (``fused_glue`` on: a Llama-like or Falcon block
runs as one compiled call, ``runtime/decode_block.py``, on the int8 path and on the float path
of F16/BF16 files, and on the int8 path the other blocks' operations between kernels are
fused), aios-run with ``fused_glue`` off (every operation a Python-level call, as before), and
llama.cpp (llama-cpp-python in its own process, its defaults). Each round
decodes ``--tokens`` tokens after the same prompt in each arm, the arms' order rotating through
all six permutations so that drift on a shared machine hits every arm alike. Prints per pair of
arms the median of the per-round speed ratios with a 95 % bootstrap interval (10,000 resamples
of the rounds), and each arm's median tokens/s.

    python benchmarks/compiled_block_ab.py FILE.gguf [--rounds 48] [--tokens 16] [-o out.json]

Name the CPU (``lscpu``) beside any figure: the ratios moved between CPUs before. The llama.cpp
arm runs on its default buffers, or on plain ones where the default crashed (AMX Xeons; see
benchmarks/llamacpp_worker.py): ``llama_cpp_config`` in the JSON and on each printed ratio says
which. If it crashes on plain buffers too, that arm is reported as crashed and ours still run.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from llamacpp_worker import LlamaCppCrash  # noqa: E402
from runtime_vs_llamacpp import LlamaCpp, Ours, interval  # noqa: E402

ARMS = ("compiled", "step_by_step", "llama_cpp")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file", type=Path)
    ap.add_argument("--rounds", type=int, default=48)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("-o", "--output", type=Path, default=None)
    args = ap.parse_args()
    if not args.file.is_file():
        raise SystemExit(f"No such GGUF file: {args.file}.")
    if args.rounds < 2 or args.tokens < 2:
        raise SystemExit("--rounds and --tokens must be at least 2.")
    ours = Ours(args.file, "dense")
    try:
        theirs = LlamaCpp(args.file, repack=True)
        crashed = None
    except LlamaCppCrash as e:  # a crashing arm is reported as crashed; ours still run
        theirs, crashed = None, str(e)

    def run_ours(fused: bool) -> float:
        ours.m.fused_glue = fused
        return ours(args.tokens)["decode_tok_s"]

    def run_theirs() -> float:
        nonlocal theirs, crashed
        try:
            return theirs(args.tokens)["decode_tok_s"]
        except LlamaCppCrash as e:  # plain buffers crashed too, mid-run: the arm stops there
            theirs, crashed = None, str(e)
            return float("nan")

    calls = {"compiled": lambda: run_ours(True), "step_by_step": lambda: run_ours(False),
             "llama_cpp": run_theirs}
    arms = [a for a in ARMS if a != "llama_cpp" or theirs is not None]
    for a in arms:  # warm-up: pages, JIT caches, llama.cpp's threads
        calls[a]()
    orders = list(itertools.permutations(arms))
    tok_s = {a: [] for a in arms}
    for r in range(args.rounds):
        for a in orders[r % len(orders)]:
            if a == "llama_cpp" and theirs is None:
                continue
            v = calls[a]()
            if not math.isnan(v):  # not the NaN of a crashed llama.cpp round
                tok_s[a].append(v)
    ours.m.fused_glue = True
    plans = ours.m._block_plans()
    # the configuration every ratio against llama.cpp was measured on ("llama.cpp default buffers",
    # "plain buffers, default crashed (SIGSEGV)"), or the crash that ended its arm
    config = f"crashed: {crashed}" if crashed else theirs.config
    out = {"file": str(args.file), "rounds": args.rounds, "tokens": args.tokens,
           "compiled_blocks": sum(p is not None for p in plans) if plans else 0,
           "layers": ours.m.hp.n_layers, "llama_cpp_config": config,
           "tok_s_median": {a: round(float(np.median(v)), 2) for a, v in tok_s.items() if v}, "ratios": {}}
    for a, b in (("compiled", "llama_cpp"), ("step_by_step", "llama_cpp"), ("compiled", "step_by_step")):
        r = [x / y for x, y in zip(tok_s[a], tok_s.get(b, []))]
        if crashed and b == "llama_cpp":
            out["ratios"][f"{a}/{b}"] = {"crashed": crashed, "rounds_before": len(r)}
        elif r:
            out["ratios"][f"{a}/{b}"] = {"median": round(float(np.median(r)), 3), "ci95": interval(r)}
            if b == "llama_cpp":
                out["ratios"][f"{a}/{b}"]["llama_cpp_config"] = config
    for k, v in out["ratios"].items():
        what = f"crashed ({v['crashed']})" if "crashed" in v else f"{v['median']} {v['ci95']}"
        tail = f" [llama.cpp: {v['llama_cpp_config']}]" if "llama_cpp_config" in v else ""
        print(f"{k}: {what}{tail}", file=sys.stderr, flush=True)
    if theirs is not None:
        theirs.close()
    print(json.dumps(out))
    if args.output:
        args.output.write_text(json.dumps({**out, "tok_s": tok_s}, indent=1))


if __name__ == "__main__":
    main()
