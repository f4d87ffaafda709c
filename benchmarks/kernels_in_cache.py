"""Compute rate of the int8 block kernels with the weights in cache: GB/s of weight bytes, one thread.

``kernels_microbench.py`` reads matrices far larger than the cache, where a kernel runs at
memory speed if its arithmetic keeps up; this one reads a few hundred KB of rows again and again
(they stay in L2), so what it reports is the arithmetic's own ceiling, two ways:

* ``kernel_gb_s``: the four-row kernel alone (``dot4i_<type>``), called over the rows from one
  compiled loop, the activations quantized once: the arithmetic's ceiling. A kernel whose
  ceiling per core × cores is below the machine's memory bandwidth is compute-bound in decode.
* ``call_gb_s``: whole ``mm_block_int8`` calls, as decode makes them: the activation row
  quantized, the Python and numba dispatch, the kernel. At these sizes (~0.4-0.8 MB, 20-40 µs
  a call) the fixed cost of a call weighs: on a 2-core AMD EPYC (znver4) Q4_0 ran 14.8 GB/s
  per call against 22.3 alone, Q8_0 23.5 against 34.3, Q6_K 21.9 against 33.0.

    python benchmarks/kernels_in_cache.py [--k 4096] [--rows 192] [--types q8_0,q4_0,...] [--reps 5]

Random valid blocks (tests/runtime/quant_blocks.random_blocks). Prints one JSON object.
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
    call, alone = {t: 0.0 for t in types}, {t: 0.0 for t in types}
    loops = {t: _kernel_loop(t) for t in types}
    xs = {t: (K.quantize_activations_k(X) if t in K.KQ_INT_KIND else K.quantize_activations(X, t in K.AFFINE_B32))
          for t in types}
    nb = {t: args.k // block_size(t.upper()) for t in types}
    for t in types:  # compile
        K.mm_block_int8(t, W[t], X, rows, Y)
        loops[t](W[t], *(a[0] for a in xs[t]), nb[t], 1)
    for _ in range(args.reps):  # the types alternate, so drift hits all alike
        for t in types:
            start = time.perf_counter()
            for _ in range(calls[t]):
                K.mm_block_int8(t, W[t], X, rows, Y)
            call[t] = max(call[t], calls[t] * W[t].nbytes / (time.perf_counter() - start) / 1e9)
            start = time.perf_counter()
            loops[t](W[t], *(a[0] for a in xs[t]), nb[t], calls[t])
            alone[t] = max(alone[t], calls[t] * W[t].nbytes / (time.perf_counter() - start) / 1e9)
    print(json.dumps({"k": args.k, "rows": args.rows, "threads": 1, "int_dot": K.int_dot_features(),
                      "kernel_gb_s": {t: round(v, 2) for t, v in alone.items()},
                      "call_gb_s": {t: round(v, 2) for t, v in call.items()},
                      "kb_per_matrix": {t: W[t].nbytes // 1024 for t in types}}))


def _kernel_loop(fmt: str):
    """A compiled loop calling the four-row kernel of ``fmt`` over every row ``reps`` times."""
    from numba import njit

    dot = getattr(K, f"dot4i_{fmt}")

    @njit
    def run(W, xq, xd, xs, nb, reps):
        tot = np.float32(0)
        n = W.shape[0]
        for _ in range(reps):
            for g in range(n // 4):
                i = 4 * g
                nx = min(i + 4, n - 4)  # the next group, as the matmul's prefetch sees it
                y = dot(W[i], W[i + 1], W[i + 2], W[i + 3], W[nx], W[nx + 1], W[nx + 2], W[nx + 3], xq, xd, xs, nb)
                tot += y[0] + y[1] + y[2] + y[3]
        return tot

    return run


if __name__ == "__main__":
    main()
