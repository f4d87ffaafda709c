"""Benchmark: our K-quant encoders (convert/kquants/) against llama.cpp's on the same tensors.

For each type (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) and tensor set, both encoders quantize the same
float32 rows; both results are decoded by gguf-py, and the script reports RMS error, SQNR
(20·log10(‖x‖/‖x−x̂‖)), the error ratio ours / llama.cpp (goal ≤ 1.1) and encode throughput
(million values per second; ours on all cores through threads, llama.cpp's
``ggml_quantize_chunk`` — the function ``llama-quantize`` calls — in one call on one core).

Tensor sets:
  tiny-falcon, tiny-llama   every 2-D weight of the bundled fixture, read as 256-wide rows
                            (their rows are 128/352 wide: the values are the model's, the
                            super-blocks span row ends; the same rows for both encoders)
  gaussian                  N(0, 1), SIZE × SIZE (default 4096)
  student-t3                heavy-tailed (Student t, 3 degrees of freedom), SIZE × SIZE
  gaussian+imatrix          N(0, 1) with per-column importances (chi-square, 1 dof, + 0.01)
                            given to both encoders; error weighted by them

    python benchmarks/kquant_vs_llamacpp.py [--size 4096] [--types q4_k,q6_k] [--json out/kq.json]

Needs llama-cpp-python (its bundled libggml-base) in the environment. llama.cpp's encoder runs in
a child process (``aios.reference.llamacpp.quantize_rows_timed``) and is timed there around the
encoding alone (start-up and import excluded); it loads no model,
so it runs on "llama.cpp default buffers" (the configuration every line and the JSON name).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from convert import kquants as kq  # noqa: E402


def fixture_rows(name: str) -> np.ndarray:
    from safetensors import safe_open

    from aios.models.aliases import FIXTURES_DIR

    parts = []
    for f in sorted((FIXTURES_DIR / name).glob("*.safetensors")):
        with safe_open(str(f), "np") as s:
            for k in s.keys():
                a = s.get_tensor(k).astype(np.float32)
                if a.ndim == 2 and a.size % kq.QK_K == 0:
                    parts.append(a.reshape(-1, kq.QK_K))
    return np.concatenate(parts)


def tensor_sets(size: int) -> dict[str, tuple[np.ndarray, np.ndarray | None]]:
    rng = np.random.default_rng(0)
    sets: dict[str, tuple[np.ndarray, np.ndarray | None]] = {
        "tiny-falcon": (fixture_rows("tiny-falcon"), None),
        "tiny-llama": (fixture_rows("tiny-llama"), None),
        "gaussian": (rng.standard_normal((size, size), dtype=np.float32), None),
        "student-t3": (rng.standard_t(3, (size, size)).astype(np.float32), None),
    }
    im = (rng.standard_normal(size) ** 2 + 0.01).astype(np.float32)
    sets["gaussian+imatrix"] = (sets["gaussian"][0], im)
    return sets


def ours(x: np.ndarray, t: str, imatrix: np.ndarray | None) -> tuple[np.ndarray, float, None]:
    t0 = time.perf_counter()
    q = kq.quantize(x, t, imatrix)
    return q, time.perf_counter() - t0, None


def llama_cpp(x: np.ndarray, t: str, imatrix: np.ndarray | None) -> tuple[np.ndarray, float, str]:
    """llama.cpp's ``ggml_quantize_chunk`` on the same rows, in a child process (as
    ``kq.llama_cpp_quantize``), timed there around the encoding: neither the child's start-up and
    llama-cpp-python's import nor the rows' trip to the child and back is counted."""
    from aios import quant
    from aios.reference import llamacpp

    r = llamacpp.quantize_rows_timed(x, t, int(quant.qtype(t)), kq.row_bytes(x.shape[1], quant.outtype_name(t)),
                                     imatrix)
    rows, seconds = r.value
    return rows, seconds, r.config


def measure(x: np.ndarray, t: str, imatrix: np.ndarray | None) -> dict:
    w = np.ones(x.shape[1], np.float64) if imatrix is None else imatrix.astype(np.float64)
    row = {}
    for who, fn in (("ours", ours), ("llama_cpp", llama_cpp)):
        q, dt, config = fn(x, t, imatrix)
        if config is not None:
            row["llama_cpp_config"] = config
        e = x.astype(np.float64) - kq.dequantize(q, t)
        rms = float(np.sqrt(np.mean(w * e * e)))
        sig = float(np.sqrt(np.mean(w * x.astype(np.float64) ** 2)))
        row[who] = {"rms_error": rms, "sqnr_db": 20 * np.log10(sig / rms) if rms else float("inf"),
                    "seconds": dt, "mvalues_per_s": x.size / dt / 1e6}
    row["error_ratio"] = row["ours"]["rms_error"] / row["llama_cpp"]["rms_error"]
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", type=int, default=4096, help="rows = columns of the random tensors")
    ap.add_argument("--types", default=",".join(kq.TYPES))
    ap.add_argument("--json", type=Path, default=ROOT / "out" / "kquant_vs_llamacpp.json")
    args = ap.parse_args()
    types = [t.strip().lower() for t in args.types.split(",")]
    kq.quantize(np.ones((1, kq.QK_K), np.float32), "q4_k")  # numba compile / cache load, not timed
    kq.quantize(np.ones((1, kq.QK_K), np.float32), "q6_k")
    results = []
    print(f"{'type':5} {'tensors':17} {'values':>10} {'RMS ours':>10} {'RMS llama':>10} {'ratio':>6} "
          f"{'SQNR ours':>9} {'SQNR llama':>10} {'Mv/s ours':>9} {'Mv/s llama':>10}")
    for name, (x, im) in tensor_sets(args.size).items():
        for t in types:
            r = measure(x, t, im)
            results.append({"type": t, "tensors": name, "values": int(x.size), **r})
            o, l = r["ours"], r["llama_cpp"]
            print(f"{t:5} {name:17} {x.size:>10,} {o['rms_error']:>10.5f} {l['rms_error']:>10.5f} "
                  f"{r['error_ratio']:>6.3f} {o['sqnr_db']:>9.2f} {l['sqnr_db']:>10.2f} "
                  f"{o['mvalues_per_s']:>9.2f} {l['mvalues_per_s']:>10.2f}  [llama.cpp: {r['llama_cpp_config']}]",
                  flush=True)
    worst = max(r["error_ratio"] for r in results)
    configs = sorted({r["llama_cpp_config"] for r in results})
    print(f"worst error ratio ours / llama.cpp: {worst:.3f} (goal <= 1.1) [llama.cpp: {'; '.join(configs)}]")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"size": args.size, "results": results, "worst_error_ratio": worst,
                                     "llama_cpp_config": "; ".join(configs)}, indent=2))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
