"""Benchmark: every llama.cpp CPU preset at real dimensions, aios-run vs llama.cpp, one run.

For each architecture (``--archs``: Falcon-7B dimensions — d 4544, 71 query heads, one KV head,
d_ffn 18176, vocabulary 65024 — and Llama-3.1-8B dimensions — d 4096, 32/8 heads, d_ffn 14336,
vocabulary 128256, llama3 RoPE), a random-init checkpoint with ``--layers`` blocks (bf16
safetensors, as the hub ships them) is exported to f16 by ``aios-convert gguf`` and quantized by
llama.cpp's own quantizer (``llama_model_quantize`` from llama-cpp-python) to each ``--presets``
(F16 is our export itself). Per file, in the same run:

* ``tok_s``: decode tokens/s of aios-run (its default arithmetic, int8 activations for block
  types) and of llama.cpp (llama-cpp-python) on the same file, both ``--threads`` threads,
  alternated for ``--rounds`` rounds; ``ratio`` is the median of the per-round ratios and
  ``ratio_ci95`` its 95 % bootstrap interval (at 5-7 rounds on this shared machine it spans
  ±5-15 %: judge a preset over runs, or run more rounds);
* ``eff_gb_s``: our effective weight bandwidth (the weight bytes our counter says one decode
  token reads × tokens/s) and its fraction of the machine's streaming read bandwidth, probed
  right after each of ``--rounds`` further decode rounds (best of several parallel read kernels
  over 1 GiB, 3 repetitions each, ``runtime_vs_llamacpp.stream_bandwidth``): the median of the
  per-round ratios. ``eff_over_stream_per_step`` pairs finer: ``--tokens × --rounds`` single
  decode steps, each paired with the fastest plain read of the same weight bytes in the same
  order (``WeightProbe``; the read pattern fastest on those bytes on this CPU, chosen first
  and recorded as ``step_probe_pattern``) just before or just after it, alternately: the median of the
  per-step ratios, and its quartiles (on this shared machine the 1 GiB probe swung 20-40 GB/s
  between rounds; paired per step, both see the same ~100 ms and the same cache state).
  ``eff_over_array_per_step`` pairs each step the same way with a read of a 1 GiB anonymous
  array: on this VM the file's page-cache pages read up to ~20 % slower than freshly
  allocated anonymous memory with the same kernel (depending on which physical pages the page
  cache holds: 0.80 before and 0.91 after dropping and re-reading the file), so this column is
  the stricter one;
* ``rss``: peak resident memory of a fresh process that loads the file and decodes ``--tokens``
  tokens (ours, then llama.cpp's, each in its own subprocess) against the file size, and our
  load time (``Model(path)``: mmap + per-layer vectors; JIT excluded: the kernels are cached).

llama.cpp runs in processes of its own (benchmarks/llamacpp_worker.py for the timed decode, a
fresh one for its RSS), on its default buffers, or with ``--llamacpp-no-repack`` on its plain
CPU buffers. Where the default crashes (llama-cpp-python built natively on AMX Xeons) it runs
again on plain buffers; ``llama_cpp_config`` in each row (and the table's last column) says which
configuration the ratio was measured against, or that llama.cpp crashed on both (our side is then
still measured).

Random weights: these are speed and memory figures, not text quality (quality per preset is
tested on the trained fixtures in tests/runtime/test_llamacpp_presets.py). The machine is
shared: only the paired ratios are claims; name the CPU (``lscpu``) beside any figure.

    python benchmarks/presets_real_dims.py [--archs falcon-7b,llama-3.1-8b] [--layers 4]
        [--presets F16,Q8_0,Q4_0,Q4_K_M,...] [--tokens 16] [--rounds 3] [-o results.json]

Needs ~5 GB of free RAM and ~10 GB of disk per architecture at 4 layers (the work folder is
deleted afterwards unless --keep). Prints one JSON line per file.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from q4_k_m_families import build, quantize  # noqa: E402
from aios.reference.llamacpp import DEFAULT, clean_env, exit_text, plain_config  # noqa: E402
from llamacpp_worker import PLAIN_ASKED, LlamaCppCrash  # noqa: E402
from runtime_vs_llamacpp import (PROMPT, LlamaCpp, Ours, WeightProbe, interval, paired, read_rows,  # noqa: E402
                                 stream_bandwidth)

PRESETS = ("F16", "Q8_0", "Q4_0", "Q4_K_M", "Q2_K", "Q3_K_M", "Q4_K_S", "Q5_0", "Q5_K_M", "Q6_K", "IQ4_XS")
ARCHS = ("falcon-7b", "llama-3.1-8b")

# one fresh process per measurement: peak RSS of exactly one load + decode, nothing else resident.
# VmHWM, not getrusage's ru_maxrss: Linux carries the parent's high-water mark across fork+exec
# into ru_maxrss (so every child would report this process's peak), while VmHWM is the new image's.
_HWM = """
def hwm():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
"""
_OURS_RSS = """
import json, sys, time
""" + _HWM + """
from runtime.generate import generate
from runtime.model import Model
from runtime import kernels
kernels.set_threads(int(sys.argv[3]))
t = time.perf_counter()
m = Model(sys.argv[1], n_ctx=256)
load = time.perf_counter() - t
_, tm = generate(m, list(range(1, 9)), int(sys.argv[2]))
print(json.dumps({"load_s": load, "tok_s": tm.decode_tps,
                  "peak_rss": hwm()}))
"""
_LLAMA_RSS = """
import json, sys, time
""" + _HWM + """
from aios.reference.llamacpp import load
t = time.perf_counter()
llm = load(sys.argv[1], plain=sys.argv[4] == "0", n_ctx=256, n_threads=int(sys.argv[3]))
load = time.perf_counter() - t
llm.eval(list(range(1, 9)))
for _ in range(int(sys.argv[2])):
    llm.eval([int(llm.scores[llm.n_tokens - 1].argmax())])
print(json.dumps({"load_s": load, "peak_rss": hwm()}))
"""


def _subprocess(code: str, path: Path, tokens: int, threads: int, repack: bool = True) -> dict:
    """One fresh process running ``code``: its JSON line, or {"error": how it ended}. llama.cpp's
    (``_LLAMA_RSS``) falls back as every use of llama.cpp does: if it dies of a signal on its
    default buffers (``repack``), once more on plain buffers; its dict says which ("config")."""
    # llama.cpp's child gets the environment it would have alone (clean_env: without the
    # OpenMP wait policy our runtime set for its own threads)
    # (the repository first on the path, the caller's own PYTHONPATH kept after it)
    env = clean_env() if code is _LLAMA_RSS else dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    r = subprocess.run([sys.executable, "-c", code, str(path), str(tokens), str(threads), str(int(repack))],
                       env=env, capture_output=True, text=True, check=False)
    if code is _LLAMA_RSS and r.returncode < 0 and repack:
        got = _subprocess(code, path, tokens, threads, repack=False)
        return {**got, "config": plain_config(r.returncode)} if "error" not in got else \
            {"error": f"crashed on default buffers ({exit_text(r.returncode)}) and on plain ones: {got['error']}"}
    if r.returncode:
        return {"error": f"{exit_text(r.returncode)}: {(r.stderr.strip().splitlines() or ['nothing on stderr'])[-1]}"}
    got = json.loads(r.stdout.strip().splitlines()[-1])
    if code is _LLAMA_RSS:
        got["config"] = DEFAULT if repack else PLAIN_ASKED
    return got


def step_pairs(m, bpt: float, n: int) -> tuple[list[tuple[float, float, float]], str]:
    """n greedy decode steps, each paired with two plain reads: of the same weights
    (``WeightProbe``: the same pages, in the same order, by the read pattern fastest on them
    here) and of a 1 GiB anonymous array (by the same pattern), right before or right after
    the step, alternately (so a read that runs faster or slower for coming second, e.g. on
    cache left by the first, biases neither side): ([(step GB/s ÷ same-pages GB/s, same-pages
    GB/s, step GB/s ÷ array GB/s)], the pattern)."""
    import numpy as np

    probe = WeightProbe(m)
    anon = np.ones((1 << 30) // 4, np.float32).reshape(-1, 2048)
    read_rows(anon, probe.pattern)

    def array() -> float:
        t = time.perf_counter()
        read_rows(anon, probe.pattern)
        return anon.nbytes / (time.perf_counter() - t) / 1e9

    m.reset()
    tok = int(np.argmax(m.forward(PROMPT)[-1]))
    out = []
    for s in range(n):
        if s % 2:  # the same-pages read next to the step either way, the array read outside it
            a = array()
            p = probe()
        t = time.perf_counter()
        logits = m.forward([tok])
        eff = bpt / (time.perf_counter() - t) / 1e9
        if not s % 2:
            p = probe()
            a = array()
        out.append((eff / p, p, eff / a))
        tok = int(np.argmax(logits[-1]))
        if m.pos + 1 >= m.hp.n_ctx:
            m.reset()
            m.forward(PROMPT)
    return out, probe.pattern


def quartiles(xs) -> list[float]:
    """[first quartile, median, third quartile] of ``xs``, rounded to 3 places."""
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return [round(v, 3) for v in q]


def one_file(path: Path, preset: str, args) -> dict:
    import gguf

    from runtime import kernels

    mix = collections.Counter(t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors
                              if len(t.shape) >= 2)
    size = path.stat().st_size
    ours = Ours(path, "dense")
    try:
        theirs = LlamaCpp(path, repack=not args.llamacpp_no_repack)
        p = paired(ours, theirs, args.tokens, args.rounds)
        config = theirs.config  # "llama.cpp default buffers", or plain ones after a crash
        theirs.close()
        del theirs
    except LlamaCppCrash as e:  # llama.cpp's arm crashed on plain buffers too: ours still measured
        p, config = None, f"crashed: {e}"
    mine_tok = p["a"] if p else ours(args.tokens)
    bpt = mine_tok["weight_bytes_per_token"]
    # bandwidth, paired: each round decodes, then probes the stream bandwidth right after, and the
    # figure is the median of the per-round ratios (the probe alone swung 20-30 GB/s between
    # rounds minutes apart on this shared machine, so one probe per file judged a round it never saw)
    bw = []
    for _ in range(args.rounds):
        e = bpt * ours(args.tokens)["decode_tok_s"] / 1e9
        bw.append((e / max(stream_bandwidth(reps=3).values()), e))
    bw.sort()
    ratio_bw, eff = bw[len(bw) // 2]
    stream = eff / ratio_bw
    steps, pattern = step_pairs(ours.m, bpt, args.tokens * args.rounds)
    del ours
    mine = _subprocess(_OURS_RSS, path, args.tokens, args.threads)
    lc = _subprocess(_LLAMA_RSS, path, args.tokens, args.threads, not args.llamacpp_no_repack)
    row = {"preset": preset, "file_bytes": size, "types_2d": dict(sorted(mix.items())),
           "arithmetic": kernels.arithmetic_label("int8", set(mix)),
           "tok_s": {"aios_run": round(mine_tok["decode_tok_s"], 2),
                     "llama_cpp": round(p["b"]["decode_tok_s"], 2) if p else None},
           "ratios": p["ratios"] if p else [], "ratio": p["ratio"] if p else None,
           "ratio_ci95": p["ratio_ci95"] if p else None,
           "llama_cpp_config": config,  # what the ratio was measured against
           "weight_bytes_per_token": int(bpt), "eff_gb_s": round(eff, 2),
           "stream_gb_s": round(stream, 2), "eff_over_stream": round(ratio_bw, 3),
           "eff_over_stream_rounds": [round(r, 3) for r, _ in bw],
           "eff_over_stream_per_step": round(statistics.median(r for r, _, _ in steps), 3),
           "eff_over_stream_per_step_quartiles": quartiles([r for r, _, _ in steps]),
           "step_probe_gb_s": round(statistics.median(p for _, p, _ in steps), 2), "step_probe_pattern": pattern,
           "eff_over_array_per_step": round(statistics.median(a for _, _, a in steps), 3),
           "eff_over_array_per_step_quartiles": quartiles([a for _, _, a in steps])}
    if "peak_rss" in mine:
        row["rss"] = {"aios_run_peak": mine["peak_rss"], "aios_run_over_file": round(mine["peak_rss"] / size, 3),
                      "llama_cpp_peak": lc.get("peak_rss"), "aios_run_load_s": round(mine["load_s"], 2),
                      "llama_cpp_load_s": round(lc["load_s"], 2) if "load_s" in lc else None,
                      "llama_cpp_config": lc.get("config", lc.get("error"))}
    else:
        row["rss"] = {"error": mine.get("error"), "llama_cpp": lc}
    return row


def one_arch(arch: str, args) -> list[dict]:
    from convert.gguf import GGUFExportConfig, export_gguf

    work = args.keep / arch if args.keep else Path(tempfile.mkdtemp(prefix="aios-presets-"))
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    try:
        f16 = work / f"{arch}.F16.gguf"
        if not f16.exists():
            src = work / "random-init"
            t = time.perf_counter()
            build(src, arch, args.layers)
            export_gguf(str(src), f16, GGUFExportConfig("f16"))
            shutil.rmtree(src)
            print(f"# {arch}: built and exported f16 in {time.perf_counter() - t:.0f} s", file=sys.stderr, flush=True)
        for preset in args.presets.split(","):
            path = f16 if preset == "F16" else work / f"{arch}.{preset}.gguf"
            try:
                if not path.exists():
                    quantize(f16, path, preset)
                row = {"arch": arch, "layers": args.layers, **one_file(path, preset, args)}
            except Exception as e:  # one preset's failure is a finding: report it and go on
                row = {"arch": arch, "preset": preset, "error": f"{type(e).__name__}: {e}"}
            if path != f16 and not args.keep:
                path.unlink(missing_ok=True)
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return rows


def _iqr_text(r: dict, key: str = "eff_over_stream_per_step_quartiles") -> str:
    """"(Q1–Q3) " of a row's stored quartiles, for the table; empty for runs without them."""
    q = r.get(key)
    return f"({q[0]:.2f}–{q[2]:.2f}) " if q else ""


def _ci_text(r: dict) -> str:
    """"[lo–hi] " of a row's bootstrap interval of the median ratio (computed from the rounds for
    results files written before the interval was stored)."""
    ci = r.get("ratio_ci95") or (interval(r["ratios"]) if len(r.get("ratios", ())) > 1 else None)
    return f"[{ci[0]:.2f}–{ci[1]:.2f}] " if ci else ""


def markdown(result: dict) -> str:
    """The run as a Markdown table (one row per file), as docs/benchmarks.md shows it."""
    head = ("| arch | preset | file MiB | 2-D types | ours tok/s | llama.cpp tok/s | ratio [95 % interval] (rounds) "
            "| eff GB/s / stream (best probe) | eff / same pages, per step (quartiles) "
            "| eff / 1 GiB array, per step (quartiles) | ours RSS / file | load s ours / llama.cpp "
            "| llama.cpp configuration |")
    lines = [head, "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        if "error" in r:
            lines.append(f"| {r['arch']} | {r['preset']} | error: {r['error']} ||||||||||")
            continue
        rss = r.get("rss", {})
        types = ", ".join(f"{k}×{v}" for k, v in r["types_2d"].items())
        ratio = (f"**{r['ratio']:.2f}** {_ci_text(r)}({', '.join(f'{x:.2f}' for x in r['ratios'])})"
                 if r.get("ratio") is not None else "—")
        lines.append(
            f"| {r['arch']} | {r['preset']} | {r['file_bytes'] / 2**20:.0f} | {types} | {r['tok_s']['aios_run']} "
            f"| {r['tok_s']['llama_cpp']} | {ratio} "
            f"| {r['eff_gb_s']} / {r['stream_gb_s']} = {r['eff_over_stream']:.2f} "
            f"| {r.get('eff_over_stream_per_step', '?')} {_iqr_text(r)}"
            f"| {r.get('eff_over_array_per_step', '?')} {_iqr_text(r, 'eff_over_array_per_step_quartiles')}"
            f"| {rss.get('aios_run_over_file', '?')} | {rss.get('aios_run_load_s', '?')} / {rss.get('llama_cpp_load_s', '?')} "
            f"| {r.get('llama_cpp_config', 'not recorded')} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--archs", default=",".join(ARCHS))
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--presets", default=",".join(PRESETS))
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--llamacpp-no-repack", action="store_true",
                    help="Run llama.cpp with weights read in place (no repacked copies of Q4_0/Q4_K/IQ4_NL "
                         "weights: its --no-repack), as aios-run reads them.")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="Threads for both runtimes (default: physical cores).")
    ap.add_argument("--keep", type=Path, default=None, help="Keep the files in this folder (and reuse them).")
    ap.add_argument("-o", "--output", type=Path, default=None)
    ap.add_argument("--table", type=Path, default=None, metavar="RESULTS.json",
                    help="Print the Markdown table of an earlier run's -o file and exit.")
    args = ap.parse_args()
    if args.table:
        try:
            result = json.loads(args.table.read_text())
            table = markdown(result)
        except OSError as e:
            raise SystemExit(f"Cannot read {args.table}: {e.strerror}.") from None
        except (ValueError, KeyError, TypeError) as e:
            raise SystemExit(f"{args.table} is not a results file of this benchmark ({type(e).__name__}: {e}).") from None
        print(table)
        return
    from runtime import kernels

    args.threads = kernels.set_threads(args.threads)
    probes = stream_bandwidth()
    stream = max(probes.values())
    head = {"stream_gb_s": round(stream, 2), "stream_probes_gb_s": {k: round(v, 2) for k, v in probes.items()},
            "threads": args.threads, "tokens": args.tokens, "llama_cpp_repack": not args.llamacpp_no_repack,
            "rounds": args.rounds, "prompt_tokens": len(PROMPT)}
    print(json.dumps(head), flush=True)
    rows = []
    for arch in args.archs.split(","):
        rows += one_arch(arch, args)
    if args.output:
        args.output.write_text(json.dumps({**head, "rows": rows}, indent=2) + "\n")
    print(markdown({**head, "rows": rows}))


if __name__ == "__main__":
    main()
