"""Benchmark: a refactor's speed, before and after, against llama.cpp in one run.

Two source trees of the runtime (``--before DIR``, e.g. ``git worktree add /tmp/before HEAD~3``,
and this checkout) each run in a process of their own (``PYTHONPATH`` set to the tree) beside
llama.cpp on the same GGUF, and the three sides take turns, round after round, on:

* decode: ``runtime.generate.generate`` of ``--decode`` tokens after an 8-token prompt
  (llama.cpp: the same in ``llamacpp_worker``), decode tokens/s;
* prefill: ``Model.forward`` of a ``--prompt``-token prompt from an empty context, last logits
  only (llama.cpp: one batch of the same ids), tokens/s;
* window: ``runtime.perplexity.perplexity`` over ``--windows`` windows of ``--window`` tokens, every
  token's logits, in perplexity's own arithmetic (llama.cpp: one batch of ``--window`` tokens
  with all logits, per window), scored tokens/s.

Only APIs both trees have are called, so any two commits compare. Each figure is the median over
rounds of ours / llama.cpp measured in the same round, with the rounds' spread (min-max): the
run-to-run noise a before/after difference must clear. llama.cpp runs on its default buffers, or
its plain ones where the default crashes (AMX Xeons): ``llama_cpp_config`` says which. Name the
CPU beside any figure.

    python benchmarks/before_after.py --before /tmp/before [--model gemma|PATH] [--rounds 5]
        [--threads 2] [--decode 32] [--prompt 512] [--window 128] [--windows 4] [-o out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

KINDS = ("decode", "prefill", "window")


def worker(path: str, threads: int) -> None:
    """The runtime of whatever tree PYTHONPATH names, answering one JSON line per request."""
    from llamacpp_worker import PROMPT, prompt_tokens

    from runtime import kernels
    from runtime.generate import generate
    from runtime.model import Model
    from runtime.perplexity import perplexity

    kernels.set_threads(threads)
    m = Model(path, n_ctx=1024)
    vocab = m.tok_embd.n_out
    # warm-up: pages touched, and every form's compiled kernels loaded (or compiled: a tree whose
    # cache is cold compiles here, never inside a timed request)
    generate(m, PROMPT, 2)
    m.reset()
    m.forward(prompt_tokens(64, vocab))
    perplexity(m, prompt_tokens(2 * 64 + 1, vocab), window=64)
    m.reset()
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        kind, *nums = line.split()
        if kind == "q":
            break
        n = int(nums[0])
        if kind == "decode":
            _, tm = generate(m, PROMPT, n)
            out = {"tok_s": tm.decode_tps}
        elif kind == "prefill":
            m.reset()
            t = time.perf_counter()
            m.forward(prompt_tokens(n, vocab))
            out = {"tok_s": n / (time.perf_counter() - t)}
        else:  # window n, over nums[1] windows
            ids = prompt_tokens(n * int(nums[1]) + 1, vocab)
            t = time.perf_counter()
            res = perplexity(m, ids, window=n)
            out = {"tok_s": res["tokens_scored"] / (time.perf_counter() - t)}
        m.reset()
        print(json.dumps(out), flush=True)


class Ours:
    """One tree's runtime in a child process, loaded once."""

    def __init__(self, tree: Path, path: Path, threads: int) -> None:
        env = dict(os.environ, PYTHONPATH=f"{tree}{os.pathsep}{ROOT / 'benchmarks'}")
        self.proc = subprocess.Popen([sys.executable, __file__, "--worker", str(path), "--threads", str(threads)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=tree)
        self._read()

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"our worker ended (exit {self.proc.wait()})")
        return json.loads(line)

    def __call__(self, *request) -> float:
        self.proc.stdin.write(" ".join(map(str, request)) + "\n")
        self.proc.stdin.flush()
        return self._read()["tok_s"]

    def close(self) -> None:
        self.proc.stdin.write("q\n")
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, help="Source tree of the earlier runtime.")
    ap.add_argument("--after", type=Path, default=ROOT, help="Source tree of the later runtime (this checkout).")
    ap.add_argument("--model", default="gemma", help="'gemma' (the real Gemma 3 270M Q4_K_M) or a GGUF path.")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--window", type=int, default=128)
    ap.add_argument("--windows", type=int, default=4)
    ap.add_argument("-o", "--output", type=Path, default=None)
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, args.threads)
        return
    if args.before is None:
        ap.error("--before DIR is required (a source tree of the earlier commit)")
    sys.path.insert(0, str(ROOT))
    from llamacpp_worker import LlamaCpp

    if args.model == "gemma":
        from aios.models import real

        path = real.fetch()
    else:
        path = Path(args.model)
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    ours = {k: Ours(t, path, args.threads) for k, t in trees.items()}
    theirs = {"decode": LlamaCpp(path, threads=args.threads),
              "prefill": LlamaCpp(path, threads=args.threads, batch=args.prompt),
              "window": LlamaCpp(path, threads=args.threads, batch=args.window, all_logits=True)}
    ask = {"decode": (args.decode,), "prefill": (args.prompt,), "window": (args.window, args.windows)}
    ratios: dict = {(k, kind): [] for k in trees for kind in KINDS}
    try:
        for r in range(args.rounds):
            for kind in KINDS:
                order = ["llama", "before", "after"] if r % 2 == 0 else ["after", "before", "llama"]
                got = {}
                for side in order:
                    if side == "llama":
                        n = ask[kind][0]
                        if kind == "window":  # per window, as many as ours scores
                            got[side] = statistics.median(theirs[kind](n)["prefill_tok_s"] for _ in range(args.windows))
                        else:
                            got[side] = theirs[kind](n)["decode_tok_s" if kind == "decode" else "prefill_tok_s"]
                    else:
                        got[side] = ours[side](kind, *ask[kind])
                for k in trees:
                    ratios[k, kind].append(got[k] / got["llama"])
                print(json.dumps({"round": r, "kind": kind, **{k: round(v, 2) for k, v in got.items()}}),
                      file=sys.stderr, flush=True)
    finally:
        for o in ours.values():
            o.close()
        for t in theirs.values():
            t.close()
    out = {"model": str(path), "threads": args.threads, "rounds": args.rounds, "trees": {k: str(t) for k, t in trees.items()},
           "llama_cpp_config": {kind: t.config for kind, t in theirs.items()}, "rows": []}
    for kind in KINDS:
        row = {"kind": kind}
        for k in trees:
            rs = ratios[k, kind]
            row[k] = {"median_ratio": round(statistics.median(rs), 3), "min": round(min(rs), 3), "max": round(max(rs), 3)}
        out["rows"].append(row)
        print(f"{kind:8s} ours/llama.cpp  before {row['before']['median_ratio']:.3f} "
              f"[{row['before']['min']:.3f}-{row['before']['max']:.3f}]  after {row['after']['median_ratio']:.3f} "
              f"[{row['after']['min']:.3f}-{row['after']['max']:.3f}]", flush=True)
    print(json.dumps(out), flush=True)
    if args.output:
        args.output.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
