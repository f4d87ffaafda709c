"""The int8-activation block kernels ("--arithmetic int8") against numpy references.

1. ``quantize_activations`` equals ggml's x86 quantize_row_q8_0 written in numpy (d =
   max|x|/127 stored as fp16, q = round half to even of x·(127/max|x|)), bit for bit.
2. The integer block dot products equal a float64 reference that multiplies gguf-py's
   dequantized weights by the *quantized* activations (tight: 1e-5 of Σ|w·x|, the float32
   rounding of the scales and the accumulation; the integer sums are exact), for every
   32-value type, real encodings and random bytes, block counts that do and do not fill the
   16-block chunk, rows in any order, several tokens.
3. Against the float path (unquantized activations) they differ only by the activations'
   8-bit rounding: relative error of Y ≤ 1e-2.
4. Whole models (tiny-llama exported as Q8_0 and Q4_0): int8 gives the float path's greedy
   tokens and close logits; the float setting runs the float kernel bit for bit; a GELU model
   takes ggml's GELU table only under int8.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType, dequantize, quantize

from runtime import kernels as K
from runtime.weights import Matrix
from tests.runtime.quant_blocks import int8_on_other_cpu, q8_1_min_term, random_blocks

RNG = np.random.default_rng(11)


def _q8_numpy(X: np.ndarray, affine: bool = False):
    """ggml's x86 quantize_row_q8_0 / q8_1 (AVX) in numpy: d = max|x|/127 stored as fp16, q =
    round half to even of x·(127/max|x|); s = d·Σq with the stored d (what the Q8_0 partners'
    dot products amount to), or for Q8_1 (``affine``) the fp16 of d·Σq taken before d's rounding."""
    B = X.reshape(X.shape[0], -1, 32)
    amax = np.abs(B).max(axis=2)
    d = amax / np.float32(127)
    inv = np.zeros_like(d)
    np.divide(np.float32(127), amax, out=inv, where=amax != 0)
    q = np.rint(B * inv[..., None])
    d16 = d.astype(np.float16).astype(np.float32)
    isum = q.sum(axis=2).astype(np.float32)
    s = (d * isum).astype(np.float16).astype(np.float32) if affine else d16 * isum
    return q.astype(np.int8).reshape(X.shape), d16, s


def test_quantize_q8_matches_ggml_reference():
    X = RNG.standard_normal((3, 32 * 9), dtype=np.float32) * np.float32(3)
    X[1, 32:64] = 0  # an all-zero block: d = 0, quants 0
    X[2, 64:96] = np.linspace(-1, 1, 32, dtype=np.float32)  # 127·x/max: ties at ±k.5 round to even
    X[0, 96:128] = np.float32(1e-6) * np.arange(32, dtype=np.float32)  # d below fp16's normal range
    for affine in (False, True):
        xq, xd, xs = K.quantize_activations(X, affine)
        q, d, s = _q8_numpy(X, affine)
        assert np.array_equal(xq, q) and np.array_equal(xd, d) and np.array_equal(xs, s)
    assert np.array_equal(xd, xd.astype(np.float16).astype(np.float32))  # d as ggml stores it
    assert np.abs(xq).max() == 127 and xq.min() >= -127  # never −128 (the sign trick relies on it)
    assert not xq[1, 32:64].any() and xd[1, 1] == 0


def _weights(kind: str, n: int, nb: int) -> list[np.ndarray]:
    raws = [random_blocks(kind, n, nb, RNG)]
    if kind != "iq4_nl":  # gguf-py has no IQ4_NL encoder
        raws.append(quantize(RNG.standard_normal((n, 32 * nb), dtype=np.float32) * 0.1,
                             GGMLQuantizationType[kind.upper()]).reshape(n, -1))
    return raws


def _deq(raw: np.ndarray, kind: str, n: int, k: int) -> np.ndarray:
    return dequantize(raw, GGMLQuantizationType[kind.upper()]).reshape(n, k).astype(np.float64)


@pytest.mark.parametrize("kind", K.INT8_TYPES)
@pytest.mark.parametrize("nb,T", [(1, 1), (2, 2), (16, 1), (18, 1), (37, 3)])
def test_int8_kernel_equals_quantized_activation_reference(kind, nb, T):
    n, k = 9, 32 * nb
    X = RNG.standard_normal((T, k), dtype=np.float32)
    affine = kind in K.AFFINE_B32
    xq, xd, xs = _q8_numpy(X, affine)
    Xq = (xq.reshape(T, nb, 32).astype(np.float64) * xd[..., None]).reshape(T, k)  # what int8 multiplies
    for raw in _weights(kind, n, nb):
        W = _deq(raw, kind, n, k)
        for rows in (np.arange(n), np.arange(n)[::-1].copy(), np.array([n - 1]), np.array([0, 0, n - 1, 3])):
            Y = np.zeros((T, n), np.float32)
            K.mm_block_int8(kind, raw, X, rows.astype(np.int64), Y)
            ref = np.zeros((T, n))
            r = np.unique(rows)
            ref[:, r] = Xq @ W[r].T + (q8_1_min_term(kind, raw[r], xq, xd, xs) if affine else 0)
            bound = np.zeros((T, n))
            bound[:, r] = np.abs(Xq) @ np.abs(W[r]).T
            assert np.all(np.abs(Y - ref) <= 1e-5 * bound + 1e-7), (kind, rows)
            others = np.setdiff1d(np.arange(n), r)
            assert not Y[:, others].any()  # rows not asked for stay 0


@pytest.mark.parametrize("kind", K.INT8_TYPES)
def test_int8_is_the_float_path_up_to_activation_rounding(kind):
    n, nb, T = 64, 40, 2
    X = RNG.standard_normal((T, 32 * nb), dtype=np.float32)
    rows = np.arange(n, dtype=np.int64)
    for raw in _weights(kind, n, nb):
        Yi, Yf = np.zeros((T, n), np.float32), np.zeros((T, n), np.float32)
        K.mm_block_int8(kind, raw, X, rows, Yi)
        K.mm_block(kind, raw, X, rows, Yf)
        ref = X.astype(np.float64) @ _deq(raw, kind, n, 32 * nb).T  # gguf-py's weights, float x
        rel = np.linalg.norm(Yi - ref) / np.linalg.norm(ref)
        assert 1e-5 < rel <= 1e-2, (kind, rel)  # nonzero: the activations really were quantized
        assert np.linalg.norm(Yf - ref) / np.linalg.norm(ref) <= 1e-5


def test_matrix_matmul_follows_the_setting():
    n, nb = 8, 20
    raw = _weights("q4_0", n, nb)[1]
    m = Matrix("w", "Q4_0", n, 32 * nb, raw)
    X = RNG.standard_normal((2, 32 * nb), dtype=np.float32)
    rows = np.arange(n, dtype=np.int64)
    Yi, Yf = np.zeros((2, n), np.float32), np.zeros((2, n), np.float32)
    K.mm_block_int8("q4_0", raw, X, rows, Yi)
    K.mm_block("q4_0", raw, X, rows, Yf)
    assert np.array_equal(m.matmul(X), Yi)  # the default: int8
    assert np.array_equal(m.matmul(X, None, K.Arithmetic("int8")), Yi)
    assert np.array_equal(m.matmul(X, None, K.Arithmetic("float")), Yf) and not np.array_equal(Yi, Yf)


def test_setting_and_labels():
    from aios.errors import UsageError

    assert K.ARITHMETICS[0] == "int8" and set(K.ARITHMETICS) == {"int8", "float", "int16", "llamacpp"}
    with pytest.raises(UsageError):
        K.Arithmetic("int4")
    label = K.arithmetic_label("int8", {"Q8_0", "F32"})
    assert label.startswith("int8 (Q8_0 activations, ") and K.INT_DOT_NAMES[K.int_dot_features()] in label
    assert K.arithmetic_label("int8", {"F32", "BF16"}) == "float"  # nothing to quantize against
    assert K.arithmetic_label("int8", {"F32", "F16"}) == "fp16 activations (F16 weights, as ggml's vec_dot_f16)"
    assert K.arithmetic_label("int8", {"Q8_0", "F16"}).endswith("; F16 weights: fp16 activations)")
    assert K.arithmetic_label("int8", {"Q4_0", "Q3_K"}).startswith("int8 (Q8_0/Q8_K activations, ")
    assert K.arithmetic_label("float", {"Q8_0"}) == "float" and K.arithmetic_label("float", {"F16"}) == "float"
    assert K.arithmetic_label("int16", {"Q8_0"}).startswith("int16 (float")
    label = K.arithmetic_label("llamacpp", {"Q5_0", "Q5_K", "Q6_K", "Q4_1"})
    assert label.startswith("llamacpp (int8 summed in llama.cpp's order: Q5_0/Q5_K/Q6_K") and label.endswith(
        "; other types int8)")
    assert ("not this CPU's build" in label) == (K.int_dot_features() != "avx512vnni")


@pytest.mark.parametrize("n,k,T", [(1, 32, 1), (13, 4096, 1), (9, 8192, 2), (21, 8224, 1), (6, 40, 2)])
def test_f16_follows_the_setting(n, k, T):
    """F16 weights: under int8 (llama.cpp's arithmetic) x is rounded to fp16 first, as ggml's
    vec_dot_f16 does; one row at a time up to ONE_ROW_X_BYTES of x, the strided eight past it,
    the plain loop when k is not a multiple of 32. Under float, x stays float32: mm_f16 exactly."""
    W = RNG.standard_normal((n, k), dtype=np.float32).astype(np.float16)
    X = RNG.standard_normal((T, k), dtype=np.float32)
    Yi = np.full((T, n), np.nan, np.float32)
    K.mm_f16_arith(W.view(np.uint16), X, None, Yi, K.Arithmetic("int8"))
    ref = X.astype(np.float16).astype(np.float64) @ W.astype(np.float64).T
    bound = np.abs(X.astype(np.float16).astype(np.float64)) @ np.abs(W.astype(np.float64)).T
    assert np.all(np.abs(Yi - ref) <= 1e-6 * bound + 1e-7)
    Yf, Y = np.full((T, n), np.nan, np.float32), np.full((T, n), np.nan, np.float32)
    K.mm_f16_arith(W.view(np.uint16), X, None, Yf, K.Arithmetic("float"))
    K.mm_f16(W.view(np.uint16), X, None, Y)
    assert np.array_equal(Yf, Y)
    exact = X.astype(np.float64) @ W.astype(np.float64).T
    assert np.abs(Yi - exact).max() > np.abs(Yf - exact).max()  # the rounding of x really happened


def test_int_kernel_emits_integer_dot():
    """The compiled int8 kernel uses the integer dot instruction this CPU has (checked on the
    generated assembly of a fresh, uncached compilation)."""
    from numba import njit

    how = K.int_dot_features()
    want = {"avx512vnni": "vpdpbusd", "avxvnni": "vpdpbusd", "avx2": "vpmaddubsw"}.get(how)
    if want is None:
        pytest.skip(f"no x86 integer dot here ({how}): the portable IR runs")
    dot = K.dot4i_q8_0

    @njit(fastmath=True)
    def f(W, xq, xd, nb):
        return dot(W[0], W[1], W[2], W[3], W[4], W[5], W[6], W[7], xq, xd, xd, nb)

    f(np.zeros((8, 34 * 16), np.uint8), np.zeros(512, np.int8), np.zeros(16, np.float32), 16)
    asm = "\n".join(f.inspect_asm().values())
    assert want in asm, how
    assert "vpmullw" not in asm  # the widening-multiply fallback LLVM picks from plain IR


@pytest.mark.parametrize("outtype", ["q8_0", "q4_0"])
def test_whole_model_int8_vs_float(exported, outtype):
    from runtime.generate import generate
    from runtime.model import Model

    path, _ = exported("tiny-llama", outtype)
    ids = list(range(1, 25))
    out = {}
    for a in ("float", "int8"):
        m = Model(path, arithmetic=a)
        logits = m.forward(ids, all_logits=True)
        m.reset()
        toks, _ = generate(m, ids, 12)
        out[a] = logits, toks
    (lf, tf), (li, ti) = out["float"], out["int8"]
    assert ti == tf  # same greedy continuation
    err = np.abs(li - lf).max() / np.abs(lf).max()
    assert 0 < err <= 2e-2, err
    assert (li.argmax(axis=1) == lf.argmax(axis=1)).mean() >= 0.9
    # the float setting is the float kernel: every block matmul of the model bit for bit
    m = Model(path, arithmetic="float")
    mats = [t for t in m.reader.tensors if t.tensor_type.name == outtype.upper() and len(t.shape) == 2]
    from runtime.weights import from_gguf_tensor

    X = RNG.standard_normal((2, int(mats[0].shape[0])), dtype=np.float32)
    w = from_gguf_tensor(mats[0])
    Y = np.zeros((2, w.n_out), np.float32)
    K.mm_block(outtype, w.data, X, np.arange(w.n_out, dtype=np.int64), Y)
    assert np.array_equal(w.matmul(X, None, m.arith), Y)


def test_int8_arithmetic_takes_llama_cpps_gelu(exported):
    """Falcon (HF "gelu", erf): the float path keeps erf GELU; the int8 path, llama.cpp's
    arithmetic, takes ggml's fp16-table tanh GELU, and only where int8 kernels run (an F16 file
    keeps the checkpoint's own activation whatever the setting)."""
    from runtime.model import GGML_GELU, Model

    q8, _ = exported("tiny-falcon", "q8_0")
    f16, _ = exported("tiny-falcon", "f16")
    i8, flt = K.Arithmetic("int8"), K.Arithmetic("float")
    assert Model(q8)._activation(i8) == GGML_GELU and Model(f16)._activation(i8) == "gelu"
    assert Model(q8)._activation(flt) == "gelu"


def test_cli_arithmetic_option(exported):
    import json

    from click.testing import CliRunner

    from runtime.cli import main

    path, _ = exported("tiny-llama", "q8_0")
    for a in ("float", "int8"):
        res = CliRunner().invoke(main, ["generate", str(path), "-p", "The list type", "-n", "4", "--arithmetic", a])
        assert res.exit_code == 0, res.output
        assert f"arithmetic {a}" in res.stdout
    res = CliRunner().invoke(main, ["bench", str(path), "--no-project", "--prompt-tokens", "8", "-n", "3",
                                    "--arithmetic", "float", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout[res.stdout.index("{"):])
    assert data["settings"]["arithmetic"] == "float" and data["rows"][0]["arithmetic"] == "float"
    res = CliRunner().invoke(main, ["generate", str(path), "-p", "x", "--arithmetic", "int4"])
    assert res.exit_code == 2


@pytest.mark.parametrize("cpu,features,want", [
    ("haswell", "+avx,+avx2,+fma,+f16c,+sse4.2,+popcnt", "avx2"),
    # AVX-512 VNNI without VBMI: the quads' byte gathers by inserts, LLVM's own byte shuffles
    ("cascadelake", "+avx,+avx2,+fma,+f16c,+sse4.2,+popcnt,+avx512f,+avx512bw,+avx512vl,+avx512dq,+avx512cd,+avx512vnni",
     "avx512vnni"),
    ("alderlake", "+avx,+avx2,+fma,+f16c,+sse4.2,+popcnt,+avxvnni", "avxvnni"),
    pytest.param("sandybridge", "+avx,+f16c,+sse4.2,+popcnt", "generic", marks=pytest.mark.slow),  # 40 s
])
def test_other_cpus_integer_dot(tmp_path, cpu, features, want):
    """The instruction choices this CPU does not take (AVX2 pmaddubsw, AVX-VNNI, portable IR),
    compiled for those CPUs (NUMBA_CPU_NAME/NUMBA_CPU_FEATURES, their own cache) and run here:
    same results as the reference. Skipped where this CPU lacks the instructions."""
    int8_on_other_cpu(tmp_path, cpu, features, want, block=32, blocks=21,
                      quantize="quantize_activations", types="INT8_TYPES")
