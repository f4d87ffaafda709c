"""Compute rate of the int8 block kernels with the weights in cache: GB/s of weight bytes, one thread.

``kernels_microbench.py`` reads matrices far larger than the cache, where a kernel runs at
memory speed if its arithmetic keeps up; this one reads a few hundred KB of rows again and again
(they stay in L2), so what it reports is the arithmetic's own ceiling. A kernel whose ceiling
per core × cores is below the machine's memory bandwidth is compute-bound in decode. Measured
on a 2-core AMD EPYC (znver4): Q8_0 23-24 GB/s, Q6_K 20.5, Q4_0 14.6-14.8, Q4_K 14.0,
IQ4_XS 9.8 per core, against ~35 GB/s of memory for two cores.

    python benchmarks/kernels_in_cache.py [--k 4096] [--rows 192] [--types q8_0,q4_0,...] [--reps 5]

Random valid blocks (tests/runtime/quant_blocks.random_blocks); each call quantizes the
activation row as decode does (``mm_block_int8``). Prints one JSON object.
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

from aios.quant import block_size  # noqa: E402
from runtime import kernels as K  # noqa: E402
from tests.runtime.quant_blocks import random_blocks  # noqa: E402

TYPES = "q8_0,q4_0,q4_1,q5_0,q5_1,iq4_nl,q2_k,q3_k,q4_k,q5_k,q6_k,iq4_xs"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, default=4096, help="Row length (a multiple of 256).")
    ap.add_argument("--rows", type=int, default=192, help="Rows (keep rows × row bytes within L2).")
    ap.add_argument("--types", default=TYPES)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    K.set_threads(1)
    rng = np.random.default_rng(0)
    X = rng.standard_normal((1, args.k)).astype(np.float32)
    rows = np.arange(args.rows, dtype=np.int64)
    Y = np.zeros((1, args.rows), np.float32)
    types = args.types.split(",")
    W = {t: random_blocks(t, args.rows, args.k // block_size(t.upper()), rng) for t in types}
    calls = {t: max(1, (256 << 20) // W[t].nbytes) for t in types}  # ~256 MB of reads per sample
    best = {t: 0.0 for t in types}
    for t in types:
        K.mm_block_int8(t, W[t], X, rows, Y)  # compile
    for _ in range(args.reps):  # the types alternate, so drift hits all alike
        for t in types:
            start = time.perf_counter()
            for _ in range(calls[t]):
                K.mm_block_int8(t, W[t], X, rows, Y)
            best[t] = max(best[t], calls[t] * W[t].nbytes / (time.perf_counter() - start) / 1e9)
    print(json.dumps({"k": args.k, "rows": args.rows, "threads": 1, "int_dot": K.int_dot_features(),
                      "gb_s": {t: round(v, 2) for t, v in best.items()},
                      "kb_per_matrix": {t: W[t].nbytes // 1024 for t in types}}))


if __name__ == "__main__":
    main()
