"""One many-token matmul of a signed 32-value block type (Q8_0, Q4_0, Q5_0) in each form the runtime
has without AMX: the row tiles (runtime.kernels.row_tiles: 16 rows in a vector's lanes), the lane
tiles (runtime.kernels.kq_tiles: 16 blocks of a row side by side) and the float32 GEMM over
weights decoded once, in int8 (one activation plane) and int16 (two), at the shapes where they
differ: rows of 640 values (the real Gemma 3 270M's Q5_0 layers and a 16,384-row chunk of its
Q8_0 output head, 20 blocks a row: 12 of the lane tiles' 32 lanes are padding) and of 4,096 and
14,336 (Llama-3.1-8B's). Rows unpacked per call, or kept unpacked as ``kept_unpacked`` keeps them
across perplexity windows (``--kept``). Median ms of --reps calls after one warm-up; the products
are checked equal between the tile forms.

    python benchmarks/many_token_tiles.py [--tokens 128] [--reps 7] [--kept] [--types q8_0,q5_0]

Weights are real encodings (gguf-py's quantizer) of a random Gaussian matrix; activations are
Gaussian with every 7th channel 20× larger (outliers, as real activations have).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

SHAPES = [(2048, 640), (16384, 640), (4096, 4096), (1024, 14336)]


def _blocks(fmt: str, n: int, k: int, rng) -> np.ndarray:
    from gguf import GGMLQuantizationType, quants

    W = rng.standard_normal((n, k)).astype(np.float32) * 0.02
    return np.ascontiguousarray(quants.quantize(W, GGMLQuantizationType[fmt.upper()]))


def _median_ms(f, reps: int) -> float:
    f()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return round(1e3 * statistics.median(times), 3)


def one(fmt: str, n: int, k: int, T: int, reps: int, kept: bool, rng) -> dict:
    from runtime.kernels import dispatch, gemm, kq_tiles, row_tiles
    from runtime.kernels.kept import kept_unpacked
    from runtime.kernels.quantize import quantize_activations

    W = _blocks(fmt, n, k, rng)
    X = rng.standard_normal((T, k)).astype(np.float32)
    X[:, ::7] *= 20
    xq, xd = quantize_activations(X)[:2]
    out = {"type": fmt, "rows": n, "values_per_row": k, "tokens": T, "kept": kept}
    ys = {}
    for two in (False, True):
        plane = "int16" if two else "int8"
        rows_x = row_tiles.arranged_rows(xq, xd, X if two else None)
        lanes_x = kq_tiles.arranged_two(fmt, X, xq, xd) if two else kq_tiles.arranged(fmt, xq, xd)
        with kept_unpacked(budget=1 << 40, matrices=[(fmt, n, k)] if kept else []) as store:
            rows_kept = store.rows(fmt, W, k, "rows") if kept else None
            lanes_kept = store.rows(fmt, W, k, "lanes") if kept else None
            for form, call in (("rows", lambda Y: row_tiles.mm_rows(fmt, W, rows_x, Y, gemm.CHUNK_VALUES, rows_kept)),
                               ("lanes", lambda Y: kq_tiles.mm_tiles(fmt, W, lanes_x, Y, gemm.CHUNK_VALUES, lanes_kept))):
                Y = np.empty((T, n), np.float32)
                out[f"{plane}_{form}_ms"] = _median_ms(lambda: call(Y), reps)
                ys[plane, form] = Y.copy()
        scale = float(np.abs(ys[plane, "lanes"]).max())
        out[f"{plane}_rows_vs_lanes_max_diff"] = float(np.abs(ys[plane, "rows"] - ys[plane, "lanes"]).max()) / scale
        out[f"{plane}_lanes_over_rows"] = round(out[f"{plane}_lanes_ms"] / out[f"{plane}_rows_ms"], 2)
    Y = np.empty((T, n), np.float32)
    out["float_gemm_ms"] = _median_ms(lambda: dispatch.mm_block_gemm(fmt, W, X, Y, False), reps)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--kept", action="store_true", help="rows kept unpacked across calls (perplexity's windows)")
    ap.add_argument("--types", default="q8_0,q5_0")
    args = ap.parse_args()
    from runtime.kernels import kq_tiles
    from runtime.kernels.ir_helpers import int_dot_features

    rng = np.random.default_rng(0)
    print(json.dumps({"int_dot": int_dot_features()}))
    for fmt in args.types.split(","):
        if not kq_tiles.tiled(fmt):
            print(json.dumps({"type": fmt, "skipped": "no integer tiles for this type on this CPU"}))
            continue
        for n, k in SHAPES:
            print(json.dumps(one(fmt, n, k, args.tokens, args.reps, args.kept, rng)), flush=True)


if __name__ == "__main__":
    main()
