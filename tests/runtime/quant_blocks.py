"""Test data for the block kernels: valid GGUF blocks of any type without an encoder, and the
gguf-py-dequantized twin of a loaded model (the reference the block kernels are held to)."""

from __future__ import annotations

import numpy as np

from aios.quant import type_size

# byte offsets of each block type's fp16 fields (d, and dmin/m where there is one): ggml's layouts
F16_FIELDS = {"q8_0": [0], "q4_0": [0], "q4_1": [0, 2], "q5_0": [0], "q5_1": [0, 2], "iq4_nl": [0],
              "q2_k": [80, 82], "q3_k": [108], "q4_k": [0, 2], "q5_k": [0, 2], "q6_k": [208], "iq4_xs": [0]}


def random_blocks(kind: str, n: int, nblk: int, rng=None) -> np.ndarray:
    """(n, nblk · block bytes) uint8: random bytes (every quant and scale bit pattern) with
    finite fp16 scales; a valid encoding of every block type."""
    rng = np.random.default_rng(0) if rng is None else rng
    raw = rng.integers(0, 256, (n, nblk, type_size(kind)), dtype=np.uint8)
    for o in F16_FIELDS[kind]:
        raw[:, :, o:o + 2] = (rng.standard_normal((n, nblk, 1)) * 0.01).astype(np.float16).view(np.uint8)
    return raw.reshape(n, -1)


def arithmetic_errors(fmt: str, W: np.ndarray, X: np.ndarray, arithmetics=("int8", "int16")) -> dict:
    """{arithmetic: max over outputs of |Y − X·Wᵀ| / (|X|·|W|ᵀ)}: ``kernels.mm_block_arith`` of
    the file blocks W (``fmt``) in each arithmetic against the float64 product of the decoded
    weights."""
    from runtime import kernels as K

    Wf = K.decode_rows_at(fmt, W, np.arange(W.shape[0])).astype(np.float64)
    exact = X.astype(np.float64) @ Wf.T
    scale = np.abs(X).astype(np.float64) @ np.abs(Wf).T
    err = {}
    for arith in arithmetics:
        Y = np.full(exact.shape, np.nan, np.float32)
        K.mm_block_arith(fmt, W, X, None, Y, K.Arithmetic(arith))
        err[arith] = float((np.abs(Y - exact) / scale).max())
    return err


def dequantized(model):
    """``model`` (a runtime.model.Model) with every block-typed matrix replaced by gguf-py's
    dequantization of its bytes, multiplied by the F32 kernel; modified in place and returned."""
    import gguf

    from runtime.weights import BLOCK_TYPES, Matrix

    def f32(m):
        if not isinstance(m, Matrix) or m.kind not in BLOCK_TYPES:
            return m
        W = gguf.dequantize(np.asarray(m.data), gguf.GGMLQuantizationType[m.kind]).astype(np.float32)
        return Matrix(m.name, "F32", m.n_out, m.n_in, W.reshape(m.n_out, m.n_in))

    tied = model.output is model.tok_embd
    model.tok_embd = f32(model.tok_embd)
    model.output = model.tok_embd if tied else f32(model.output)
    for layer in model.layers:
        for k, v in list(layer.items()):
            layer[k] = f32(v)
    return model


_OTHER_CPU_CHECK = """
import numpy as np
from gguf import GGMLQuantizationType, dequantize
from runtime import kernels as K
from tests.runtime.quant_blocks import random_blocks
assert K.int_dot_features() == {want!r}, K.int_dot_features()
rng = np.random.default_rng(0)
n, nb, T, B = 5, {blocks}, 2, {block}
X = rng.standard_normal((T, B * nb)).astype(np.float32)
from tests.runtime.quant_blocks import q8_1_min_term
for kind in K.{types}:
    affine = kind in getattr(K, "AFFINE_B32", ())
    xq, xd, xs = K.{quantize}(X, affine) if affine else K.{quantize}(X)
    Xq = (xq.reshape(T, nb, B).astype(np.float64) * xd[..., None]).reshape(T, -1)
    raw = random_blocks(kind, n, nb, rng)
    W = dequantize(raw, GGMLQuantizationType[kind.upper()]).reshape(n, -1).astype(np.float64)
    Y = np.zeros((T, n), np.float32)
    K.mm_block_int8(kind, raw, X, np.arange(n, dtype=np.int64), Y)
    ref = Xq @ W.T + (q8_1_min_term(kind, raw, xq, xd, xs) if affine else 0)
    assert np.all(np.abs(Y - ref) <= 1e-5 * (np.abs(Xq) @ np.abs(W).T) + 1e-7), kind
print("ok")
"""


def q8_1_min_term(kind: str, raw: np.ndarray, xq: np.ndarray, xd: np.ndarray, xs: np.ndarray) -> np.ndarray:
    """(T, n): what a Q4_1/Q5_1 dot product adds beyond the dequantized weights times d·q: ggml
    multiplies each block's minimum m by the Q8_1 sum s, stored in fp16 from d·Σq before d's own
    rounding, so Σ_b m·(s − d·Σq) (m: the fp16 at bytes 2-3 of each block)."""
    n = raw.shape[0]
    nb = xd.shape[1]
    m = raw.reshape(n, nb, -1)[:, :, 2:4].copy().view(np.float16)[..., 0].astype(np.float64)  # (n, nb)
    isum = xq.reshape(xq.shape[0], nb, -1).astype(np.float64).sum(axis=2)
    return (xs.astype(np.float64) - xd.astype(np.float64) * isum) @ m.T


def int8_on_other_cpu(tmp_path, cpu: str, features: str, want: str, *, block: int, blocks: int,
                      quantize: str, types: str) -> None:
    """Compile the int8 kernels of ``runtime.kernels.<types>`` for another CPU (NUMBA_CPU_NAME /
    NUMBA_CPU_FEATURES, their own cache) in a subprocess and check them against the reference on
    the activations quantized by ``<quantize>``; skips where this CPU lacks the instructions."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    import pytest
    from llvmlite import binding

    host = {k for k, v in binding.get_host_cpu_features().items() if v}
    if not {f[1:] for f in features.split(",")} <= host:
        pytest.skip(f"this CPU cannot run code built for {cpu}")
    env = dict(os.environ, NUMBA_CPU_NAME=cpu, NUMBA_CPU_FEATURES=features, NUMBA_CACHE_DIR=str(tmp_path),
               NUMBA_NUM_THREADS="1")
    script = _OTHER_CPU_CHECK.format(want=want, block=block, blocks=blocks, quantize=quantize, types=types)
    res = subprocess.run([sys.executable, "-c", script], env=env, cwd=Path(__file__).resolve().parents[2],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr[-2000:]
