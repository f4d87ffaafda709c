"""runtime.ggml_ops: the int8 arithmetic's norms, RoPE, attention and SiLU, rounded as llama.cpp's.

Two kinds of check: each function stays within float32 rounding of runtime.ops (the float path's
versions, accumulated in float64), and on files llama.cpp itself quantized, the layer-0 tensors
llama.cpp computes (read through its eval callback) equal ours bit for bit.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from aios.reference import llamacpp
from runtime import ggml_expf, ggml_ops, kernels, ops
from tests.runtime.test_ops import head_major

RNG = np.random.default_rng(0)


def test_v_expf_is_exp_within_float32_rounding():
    x = np.linspace(-87, 88, 20001).astype(np.float32)
    got = np.array([ggml_ops.expf_lane(v) for v in x[::7]], np.float64)
    ref = np.exp(x[::7].astype(np.float64))
    assert np.max(np.abs(got - ref) / ref) < 3e-7
    assert ggml_ops.expf_lane(np.float32(0)) == 1.0
    assert ggml_ops.expf_lane(np.float32(-np.inf)) == 0.0  # a masked score
    assert ggml_ops.expf_lane(np.float32(-200)) == 0.0 and ggml_ops.expf_lane(np.float32(200)) == np.inf


def test_norms_agree_with_the_float_path():
    x = RNG.standard_normal((5, 200)).astype(np.float32) * 3 + 1
    w = RNG.standard_normal(200).astype(np.float32)
    b = RNG.standard_normal(200).astype(np.float32)
    eps = 1e-5
    for got, ref in ((ggml_ops.layer_norm(x, w, b, np.float32(eps)), ops.layer_norm(x, w, b, eps)),
                     (ggml_ops.layer_norm(x, w, b[:0], np.float32(eps)), ops.layer_norm(x, w, b[:0], eps)),
                     (ggml_ops.rms_norm(x, w, np.float32(eps)), ops.rms_norm(x, w, eps))):
        np.testing.assert_allclose(got, ref, rtol=0, atol=2e-6 * np.abs(ref).max())


def test_rope_theta_scale_is_the_c_librarys_powf():
    """ggml computes powf(base, -2.0f/n_dims); numpy's float32 power is an ulp off for base 10000
    at 64 dims (glibc: 0.7498942), which RoPE multiplies along the head: logits of a head-size-64
    llama parted from llama.cpp's from 13 tokens on (tests/runtime/test_ggml_order.py)."""
    import ctypes
    import ctypes.util

    libm = ctypes.util.find_library("m")
    if libm is None:
        pytest.skip("no C math library to compare with")
    powf = ctypes.CDLL(libm).powf
    powf.restype, powf.argtypes = ctypes.c_float, [ctypes.c_float, ctypes.c_float]
    for base, dims in ((10000.0, 64), (10000.0, 128), (1e6, 256), (500000.0, 128), (10000.0, 96)):
        want = np.float32(powf(base, float(np.float32(-2.0) / np.float32(dims))))
        assert ggml_ops.theta_scale(base, dims) == want, (base, dims)


@pytest.mark.parametrize("neox", [False, True])
def test_rope_agrees_with_the_float_path(neox):
    T, H, hd, dims, base = 40, 3, 64, 32, 10000.0  # partial rotary: 32 of 64 dims
    x = RNG.standard_normal((T, H, hd)).astype(np.float32)
    ff = np.linspace(1, 8, dims // 2).astype(np.float32)  # Llama 3.1-style frequency divisors
    pos = np.arange(100, 100 + T)
    got, ref = x.copy(), x.copy()
    ggml_ops.rope(got, pos, ggml_ops.theta_scale(base, dims), ff, neox)
    inv = base ** (-np.arange(0, dims, 2, dtype=np.float64) / dims) / ff
    ops.rope(ref, pos.astype(np.float64), inv, neox)
    np.testing.assert_array_equal(got[..., dims:], x[..., dims:])  # the rest passes through
    # float32 θ stepped 16 times and taken at position ~140: a few ulp of the angle
    np.testing.assert_allclose(got, ref, rtol=0, atol=5e-4)


@pytest.mark.parametrize("window", [0, 5])
def test_attention_agrees_with_the_float_path(window):
    T, p0, Hq, Hkv, hd = 7, 30, 4, 2, 96  # hd 96: one 64-value FMA step plus a 32-value tail
    n = p0 + T
    q = RNG.standard_normal((T, Hq, hd)).astype(np.float32)
    K = RNG.standard_normal((n, Hkv, hd)).astype(np.float32)
    V = RNG.standard_normal((n, Hkv, hd)).astype(np.float32)
    scale = 1 / math.sqrt(hd)
    K, V = head_major(K), head_major(V)
    got = ggml_ops.attention(q, K, V, p0, np.float32(scale), window, np.float32(0))
    ref = ops.attention(q, K, V, p0, scale, window, 0.0)
    np.testing.assert_allclose(got, ref, rtol=0, atol=2e-6)


def test_silu_mul_agrees_with_silu():
    x = RNG.standard_normal((3, 37)).astype(np.float32) * 6  # 32 on ggml_v_expf, 5 on expf
    g = RNG.standard_normal((3, 37)).astype(np.float32)
    ref = x.astype(np.float64) / (1 + np.exp(-x.astype(np.float64))) * g
    np.testing.assert_allclose(ggml_ops.silu_mul(x, g), ref, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("scale", [1, 30, 300])
def test_silu_mul_vector_lanes_equal_the_scalar_lane(scale):
    # the 16-lane IR (_swiglu16) against ``v_expf`` one lane at a time, bit for bit, over
    # ordinary, underflowing (n < −192), overflowing and special inputs
    x = RNG.standard_normal((2, 4096)).astype(np.float32) * scale
    x[0, :10] = [np.inf, -np.inf, np.nan, 0.0, -0.0, 1e30, -1e30, 88.7, -103.9, -150.0]
    g = RNG.standard_normal((2, 4096)).astype(np.float32)
    got, ref = ggml_ops.silu_mul(x, g), ggml_expf._silu_mul_lanes(x, g)
    same = (got.view(np.uint32) == ref.view(np.uint32)) | (np.isnan(got) & np.isnan(ref))
    assert same.all(), np.flatnonzero(~same)[:10]


# --- against llama.cpp's own intermediate tensors ------------------------------------------
def _layer0(path, ids) -> dict:
    """Our int8 path's layer-0 tensors, named as llama.cpp's graph names them."""
    from runtime.model import Model

    # the one-token kernels, token by token: the form that rounds as llama.cpp, bit for bit
    m = Model(path, arithmetic=kernels.Arithmetic("int8", batched=False))
    assert m._ggml(m.arith)
    mine = {}
    norm, attention = m._norm, ggml_ops.attention

    def first_norm(x, w, b, a):
        y = norm(x, w, b, a)
        mine.setdefault("attn_norm-0", y)
        return y

    def attn(q, K, V, *a):
        out = attention(q, K, V, *a)
        T = q.shape[0]  # one chunk from position 0: the cache's first T positions, position-major
        K, V = K[:, :T].transpose(1, 0, 2), V[:, :T].transpose(1, 0, 2)
        for k, v in (("Qcur-0", q), ("Kcur-0", K), ("Vcur-0", V), ("kqv_out-0", out)):
            mine.setdefault(k, np.array(v))
        return out

    mm = m._mm

    def first_down(lin, X, layer, a, rows=None, bias=None):
        y = mm(lin, X, layer, a, rows, bias)
        if lin.name == "blk.0.ffn_down.weight":
            mine.setdefault("ffn_out-0", y)
        return y

    m._norm, m._mm = first_norm, first_down
    try:
        ggml_ops.attention = attn
        m.forward(ids, all_logits=True)
    finally:
        ggml_ops.attention = attention
    return mine


def _assert_layer0_equal(path, ids, names=("attn_norm-0", "Qcur-0", "Kcur-0", "Vcur-0", "kqv_out-0")):
    pytest.importorskip("llama_cpp")
    if not ggml_ops.avx512_order():
        pytest.skip("llama.cpp on this CPU sums in AVX2's 8-lane order, not the AVX-512 one mirrored")
    # in a child process (aios.reference.llamacpp): on an AMX Xeon its default buffers crash, and
    # its plain CPU buffers run the AVX-512 kernels this path mirrors
    theirs = llamacpp.graph_tensors(path, ids, set(names), n_threads=2, type_k=0, type_v=0).value
    assert set(theirs) == set(names)
    mine = _layer0(path, ids)
    for name in names:
        np.testing.assert_array_equal(mine[name].reshape(len(ids), -1), theirs[name].reshape(len(ids), -1),
                                      err_msg=name)


def _q8_0(src, tmp_path, preset="Q8_0"):
    from convert.gguf import GGUFExportConfig, export_gguf
    from tests.runtime.test_llamacpp_presets import quantize

    f16, q8 = tmp_path / "m.f16.gguf", tmp_path / f"m.{preset}.gguf"
    export_gguf(str(src), f16, GGUFExportConfig("f16"))
    quantize(f16, q8, preset)
    return q8


@pytest.mark.parametrize("fixture", ["tiny-falcon", "tiny-llama"])
def test_layer0_equals_llama_cpp_bit_for_bit(fixture, tmp_path):
    pytest.importorskip("llama_cpp")
    from aios.models.aliases import FIXTURES_DIR
    from runtime.generate import load_tokenizer
    from runtime.perplexity import heldout_ids

    q8 = _q8_0(FIXTURES_DIR / fixture, tmp_path)
    # ffn_out: the FFN's activation (Falcon: ggml's GELU table) and a 512-value Q8_0 down
    # projection, whose blocks ggml sums one after another into the same 8 lanes
    _assert_layer0_equal(q8, heldout_ids(load_tokenizer(q8, FIXTURES_DIR / fixture), 64),
                         ("attn_norm-0", "Qcur-0", "Kcur-0", "Vcur-0", "kqv_out-0", "ffn_out-0"))


_NOT_BLOCKWISE = pytest.mark.xfail(strict=True, reason="not in kernels.BLOCKWISE: its quad kernel adds the offset "
                                   "as a float term per block, ~1e-6 from llama.cpp (kept for speed)")


@pytest.mark.parametrize("preset", [pytest.param(p, marks=() if p.lower() in kernels.BLOCKWISE else _NOT_BLOCKWISE)
                                    for p in ("Q5_0", "Q4_0", "Q8_0")])
@pytest.mark.parametrize("n", [1, 24])
def test_layer0_32_value_types_equal_llama_cpp_bit_for_bit(preset, n, tmp_path, monkeypatch):
    """The offset types (Q5_0, as every Q4_K_M file holds; Q4_0) and Q8_0 on a d_model-256 llama
    that llama.cpp quantized: its layer-0 matrices (V, up, gate, down, each on llama.cpp's own
    input) equal llama.cpp's bit for bit, one token (its vec_dot_*_q8_0) and a batch (llamafile's
    tinyBLAS_Q0_AVX): both sum each block's signed Σ q_w·q_x in 8 int32 lanes, one fma per block
    (kernels.BLOCKWISE). On llama.cpp's plain CPU buffers (the crash injection forces them): where
    its default buffers do not crash, Q4_0 runs its repacked layout (ggml_gemv_q4_0_8x8 ...),
    which sums otherwise; Q5_0 has none."""
    pytest.importorskip("llama_cpp")
    import platform
    import shutil

    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("llama.cpp's ARM dot products sum in another order")
    monkeypatch.setenv("AIOS_LLAMACPP_CRASH", "default")
    import gguf

    from aios.models.aliases import FIXTURES_DIR
    from tests.conftest import build_hf_model

    src = build_hf_model("llama", tmp_path / "tiny-d256", hidden_size=256, intermediate_size=512,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=2048)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(FIXTURES_DIR / "tiny-llama" / f, src / f)
    path = _q8_0(src, tmp_path, preset)
    kinds = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors if t.name.startswith("blk.0.")}
    for name in ("attn_v", "ffn_up", "ffn_gate", "ffn_down"):
        assert kinds[f"blk.0.{name}.weight"] == preset, kinds  # what the test is about
    ids = list(range(5, 5 + n))
    # each matrix on llama.cpp's own input: V on attn_norm, up and gate on ffn_norm, down on the
    # SwiGLU (q and k are read only after RoPE)
    from runtime.model import Model

    names = {"attn_norm-0", "Vcur-0", "ffn_norm-0", "ffn_up-0", "ffn_gate-0", "ffn_swiglu-0", "ffn_out-0"}
    theirs = {k: v.reshape(n, -1) for k, v in
              llamacpp.graph_tensors(path, ids, names, n_threads=2, type_k=0, type_v=0).value.items()}
    # the one-token kernels over the batch (n 24 would take the GEMM form, which rounds otherwise)
    m = Model(path, n_ctx=64, arithmetic=kernels.Arithmetic("int8", batched=False))
    for name, x, y in (("attn_v", "attn_norm-0", "Vcur-0"), ("ffn_up", "ffn_norm-0", "ffn_up-0"),
                       ("ffn_gate", "ffn_norm-0", "ffn_gate-0"), ("ffn_down", "ffn_swiglu-0", "ffn_out-0")):
        got = m._mm(m.layers[0][f"{name}.weight"], np.ascontiguousarray(theirs[x], np.float32), 0, m.arith)
        np.testing.assert_array_equal(got, theirs[y], err_msg=name)


@pytest.mark.parametrize("kind", ["llama3", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "phi3", "falcon-new-decoder", "gpt2"])
def test_layer0_equals_llama_cpp_on_other_families(kind, tmp_path):
    """Random-init tiny models of the other runtime rows (Llama 3.1 RoPE factors, sliding
    window, q/k biases, q/k norms, Gemma's scaled embeddings and norms, Gemma 2's attention
    softcap, q scaled before q·k, fused QKV, Falcon-40B's GQA with its second norm, GPT-2's
    learned positions and biased LayerNorm)."""
    pytest.importorskip("llama_cpp")
    import shutil

    from aios.models.aliases import FIXTURES_DIR
    from tests.conftest import LLAMA3_ROPE, build_hf_model

    # Mistral's window (64) is longer than the 48 tokens: llama.cpp runs a "llama" file with full
    # attention, transformers and aios-run apply the window, so past it the two differ by design
    extra = {"llama3": LLAMA3_ROPE, "mistral": {"sliding_window": 64}}.get(kind, {})
    # named tiny-xyz as in test_llama_cpp_files: a general.name containing "phi3" makes
    # llama.cpp's vocabulary loader look up Phi-3's special tokens, which this tokenizer lacks
    src = build_hf_model(kind.replace("llama3", "llama"), tmp_path / f"tiny-{kind[:3]}", vocab_size=2048, **extra)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(FIXTURES_DIR / "tiny-falcon" / f, src / f)
    q8 = _q8_0(src, tmp_path)
    names = ["attn_norm-0", "Qcur-0", "Kcur-0", "Vcur-0", "kqv_out-0"]
    if kind.startswith("gemma"):  # its graph names q before the scaling, the scaled q not at all
        names.remove("Qcur-0")
    _assert_layer0_equal(q8, list(range(5, 53)), names)
