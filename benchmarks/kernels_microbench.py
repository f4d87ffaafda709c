"""Throughput of each runtime kernel on matrices far larger than the cache, beside the stream probe.

One GEMV per stored type (F32, F16, BF16 and every block type of runtime.kernels.BLOCK_TYPES,
each read in place as the file's interleaved blocks) over ~0.5–1 GB of
distinct matrices (5632 × 2048, the FFN shape of the runtime benchmark's model), plus the
two sparse paths at 10 % of the rows: a gathered-row GEMV (the up projection of active
neurons) and the row-contiguous sparse down projection, over F32 rows and over every block
type's neuron-major rows ("<type>_sparse_down_10pct": a --sparse-down file's ffn_down.t,
K.sparse_block_rows, float axpy in either arithmetic). Reported as GB/s of stored bytes
and G values/s, best of --reps, with the stream probe of benchmarks/runtime_vs_llamacpp.py
measured in the same run (its ratio is the figure that travels between machines).

    python benchmarks/kernels_microbench.py [--gb 0.6] [--reps 3] [--arithmetic int8|float|both]

The types with an int8 kernel (32-value block types and K.KQ_INT's K-quants: K.INT8_ALL)
run in each --arithmetic (default both): ``float`` is ``mm_block`` (weights decoded to float, float
activations; reported under the type's name), ``int8`` is ``mm_block_int8`` (the activation
quantized inside each call, to Q8_0 blocks of 32 or Q8_K blocks of 256, integer dot products;
"<type>_int8", e.g. q4_k_int8, q5_k_int8, q6_k_int8).

Quantized matrices are real encodings (gguf-py for Q4_0/Q4_1/Q5_0/Q5_1/Q8_0, convert.kquants
for the K-quants; random valid blocks for IQ4_NL/IQ4_XS, which neither encodes) of one random
matrix, copied to fill the size.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from aios import quant  # noqa: E402
from runtime import kernels as K  # noqa: E402

N, D = 5632, 2048


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gb", type=float, default=0.6, help="Bytes of distinct matrices per kernel (GB).")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--arithmetic", choices=[*K.ARITHMETICS, "both"], default="both",
                    help="Arithmetic of the types in runtime.kernels.INT8_ALL (the others: float).")
    ap.add_argument("--types", default=None, help="Comma-separated subset of the cases (e.g. q8_0,q8_0_int8).")
    args = ap.parse_args()
    from gguf import GGMLQuantizationType as G
    from gguf import quantize

    from convert import kquants
    from runtime_vs_llamacpp import stream_bandwidth

    rng = np.random.default_rng(0)
    W = rng.standard_normal((N, D), dtype=np.float32)
    x = rng.standard_normal((1, D), dtype=np.float32)
    everything = np.arange(N, dtype=np.int64)
    tenth = np.sort(rng.choice(N, N // 10, replace=False)).astype(np.int64)
    a = rng.standard_normal(N).astype(np.float32)
    keep = args.types.split(",") if args.types else None
    blocks = {}
    for k in K.BLOCK_TYPES:
        if keep is not None and not any(c == k or c.startswith(f"{k}_") for c in keep):
            continue
        if k in kquants.TYPES:
            blocks[k] = np.ascontiguousarray(kquants.quantize(W, k)).reshape(N, -1)
        elif k.startswith("iq4"):
            rng_b = np.random.default_rng(1)
            raw = rng_b.integers(0, 256, (N, D // quant.block_size(k), quant.type_size(k)), dtype=np.uint8)
            raw[:, :, :2] = (rng_b.standard_normal((N, raw.shape[1], 1)) * 0.01).astype(np.float16).view(np.uint8)
            blocks[k] = raw.reshape(N, -1)
        else:
            blocks[k] = np.ascontiguousarray(quantize(W, G[k.upper()])).reshape(N, -1)
        assert blocks[k].shape[1] == quant.row_bytes(k, D)
    f16 = W.astype(np.float16).view(np.uint16)
    bf16 = (W.view(np.uint32) >> 16).astype(np.uint16)
    cases = {  # name: (arrays copied to fill the size, call(arrays, Y), stored bytes read per call)
        "f32": ([W], lambda m, Y: K.mm_f32(m[0], x, everything, Y), W.nbytes),
        "f16": ([f16], lambda m, Y: K.mm_f16(m[0], x, everything, Y), f16.nbytes),
        "bf16": ([bf16], lambda m, Y: K.mm_bf16(m[0], x, everything, Y), bf16.nbytes),
        **{k: ([b], lambda m, Y, k=k: K.mm_block(k, m[0], x, everything, Y), b.nbytes) for k, b in blocks.items()
           if args.arithmetic != "int8" or k not in K.INT8_ALL},
        **{f"{k}_int8": ([b], lambda m, Y, k=k: K.mm_block_int8(k, m[0], x, everything, Y), b.nbytes)
           for k, b in blocks.items() if args.arithmetic != "float" and k in K.INT8_ALL},
        "f32_gather_10pct": ([W], lambda m, Y: K.mm_f32(m[0], x, tenth, Y), len(tenth) * D * 4),
        "f32_sparse_down_10pct": ([W], lambda m, Y: K.sparse_rows_f32(m[0], a, tenth, Y[0, :D]), len(tenth) * D * 4),
        **{f"{k}_sparse_down_10pct": ([b], lambda m, Y, k=k: K.sparse_block_rows(k, m[0], a, tenth, Y[0, :D]),
                                      len(tenth) * b.shape[1]) for k, b in blocks.items()},
    }
    if keep is not None:
        cases = {k: v for k, v in cases.items() if k in keep}
    probes = stream_bandwidth()
    out: dict = {"stream_probes_gb_s": {k: round(v, 2) for k, v in probes.items()}, "kernels": {},
                 "int8": K.arithmetic_label("int8", {"Q8_0", *(t.upper() for t in K.KQ_INT)})}
    stream = max(probes.values())
    for name, (arrays, call, nbytes) in cases.items():
        per = sum(a.nbytes for a in arrays)
        copies = [[a.copy() for a in arrays] for _ in range(max(2, int(args.gb * 1e9 / per)))]
        Y = np.zeros((1, N), np.float32)
        call(copies[0], Y)  # compile / load from cache
        best = float("inf")
        for _ in range(args.reps):
            t = time.perf_counter()
            for m in copies:
                call(m, Y)
            best = min(best, time.perf_counter() - t)
        gbs = len(copies) * nbytes / best / 1e9
        values = len(copies) * (len(tenth) if "10pct" in name else N) * D / best / 1e9
        out["kernels"][name] = {"gb_s": round(gbs, 2), "gvalues_s": round(values, 2), "of_stream": round(gbs / stream, 3)}
        print(f"{name:24s} {gbs:6.2f} GB/s  {values:6.2f} Gvalues/s  {gbs / stream:.2f} of stream", flush=True)
        del copies
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
