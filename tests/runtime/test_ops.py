"""runtime.ops against direct numpy formulas (float64), including GQA and a cached prefix."""

from __future__ import annotations

import math

import numpy as np
import pytest

from runtime import ops

RNG = np.random.default_rng(3)


def test_rms_norm() -> None:
    x = RNG.standard_normal((3, 96), dtype=np.float32) * 5
    w = RNG.standard_normal(96, dtype=np.float32)
    ref = x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-5) * w
    np.testing.assert_allclose(ops.rms_norm(x, w, 1e-5), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("bias", [True, False])
def test_layer_norm(bias: bool) -> None:
    x = RNG.standard_normal((2, 64), dtype=np.float32) + 3
    w, b = RNG.standard_normal(64, dtype=np.float32), RNG.standard_normal(64, dtype=np.float32)
    x64 = x.astype(np.float64)
    ref = (x64 - x64.mean(-1, keepdims=True)) / np.sqrt(x64.var(-1, keepdims=True) + 1e-5) * w + (b if bias else 0)
    got = ops.layer_norm(x, w, b if bias else np.zeros(0, np.float32), 1e-5)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("neox", [True, False])
def test_rope_rotates_the_documented_pairs(neox: bool) -> None:
    T, H, hd, rd = 3, 2, 16, 8  # partial rotary: dims rd..hd stay as they are
    x = RNG.standard_normal((T, H, hd), dtype=np.float32)
    pos = np.array([0.0, 5.0, 17.0])
    inv = 10000.0 ** (-np.arange(0, rd, 2, dtype=np.float64) / rd)
    ref = x.astype(np.float64).copy()
    for t in range(T):
        for i in range(rd // 2):
            a_i, b_i = (i, i + rd // 2) if neox else (2 * i, 2 * i + 1)
            c, s = math.cos(pos[t] * inv[i]), math.sin(pos[t] * inv[i])
            a, b = x[t, :, a_i].astype(np.float64), x[t, :, b_i].astype(np.float64)
            ref[t, :, a_i], ref[t, :, b_i] = a * c - b * s, b * c + a * s
    got = x.copy()
    ops.rope(got, pos, inv, neox)
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-6)
    assert (got[:, :, rd:] == x[:, :, rd:]).all()


@pytest.mark.parametrize("T,p0,Hq,Hkv", [(1, 0, 4, 4), (1, 9, 8, 2), (4, 0, 4, 1), (3, 5, 6, 3)])
@pytest.mark.parametrize("window,softcap", [(0, 0.0), (3, 0.0), (0, 2.0), (4, 1.5)])
def test_attention_causal_gqa(T: int, p0: int, Hq: int, Hkv: int, window: int, softcap: float) -> None:
    hd, n = 8, p0 + T
    scale = 1 / math.sqrt(hd) if softcap == 0 else 0.3
    q = RNG.standard_normal((T, Hq, hd), dtype=np.float32)
    K = RNG.standard_normal((n, Hkv, hd), dtype=np.float32)
    V = RNG.standard_normal((n, Hkv, hd), dtype=np.float32)
    ref = np.zeros((T, Hq * hd))
    for t in range(T):
        j0 = max(0, p0 + t + 1 - window) if window else 0  # sliding window: the last `window` keys
        for h in range(Hq):
            kv = h // (Hq // Hkv)
            s = K[j0 : p0 + t + 1, kv].astype(np.float64) @ q[t, h] * scale
            if softcap:
                s = softcap * np.tanh(s / softcap)
            w = np.exp(s - s.max())
            ref[t, h * hd : (h + 1) * hd] = (w / w.sum()) @ V[j0 : p0 + t + 1, kv]
    got = ops.attention(q, head_major(K), head_major(V), p0, scale, window, softcap)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def head_major(K: np.ndarray, spare: int = 3) -> np.ndarray:
    """(n, Hkv, hd) keys as the model's cache holds them: (Hkv, n + spare, hd), the spare
    positions NaN (a read past the last key would show)."""
    n, Hkv, hd = K.shape
    out = np.full((Hkv, n + spare, hd), np.nan, np.float32)
    out[:, :n] = K.transpose(1, 0, 2)
    return out


@pytest.mark.parametrize("hd", [64, 128, 80, 20])  # 16-lane steps, with and without a tail
def test_attention_long_context_matches_float64(hd: int) -> None:
    T, p0, Hq, Hkv = 1, 700, 12, 2  # three work items of four heads per KV head
    q = RNG.standard_normal((T, Hq, hd), dtype=np.float32)
    K = RNG.standard_normal((p0 + T, Hkv, hd), dtype=np.float32)
    V = RNG.standard_normal((p0 + T, Hkv, hd), dtype=np.float32)
    # k: KV head, g: query head within its group (head k·group + g), n: key, d: dimension
    qg = q[0].reshape(Hkv, Hq // Hkv, hd).astype(np.float64)
    s = np.einsum("kgd,nkd->kgn", qg, K.astype(np.float64)) / math.sqrt(hd)
    w = np.exp(s - s.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    ref = np.einsum("kgn,nkd->kgd", w, V.astype(np.float64)).reshape(1, Hq * hd)
    got = ops.attention(q, head_major(K), head_major(V), p0, 1 / math.sqrt(hd), 0, 0.0)
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-6)


def test_gelu_ggml_is_the_fp16_table_of_tanh_gelu() -> None:
    """Every fp16 input in (−10, 10): the fp16 rounding of ggml_gelu_f32 (tanh GELU in float32,
    as ggml writes it: 0.5·x·(1 + tanh(√(2/π)·x·(1 + 0.044715·x²))), with glibc's tanhf (called
    here through ctypes) and the fused multiply-add GCC makes of 1 + 0.044715·x·x (emulated in
    float64, exact but for a rare double rounding); within 1e-3 of float64 tanh GELU where
    1 + tanh does not cancel (x > −3); outside the range, ggml's branches. The table's agreement
    with llama.cpp's own GELU output is checked in tests/runtime/test_ggml_ops.py's dumps."""
    import ctypes

    libm = ctypes.CDLL("libm.so.6")
    libm.tanhf.restype, libm.tanhf.argtypes = ctypes.c_float, [ctypes.c_float]
    h = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16)
    h = h[np.isfinite(h) & (np.abs(h.astype(np.float32)) < 10)].astype(np.float32)
    c, a = np.float32(0.79788456080286535587989211986876), np.float32(0.044715)
    inner = ((a * h).astype(np.float64) * h + 1.0).astype(np.float32)  # fma(a·x, x, 1)
    t = np.array([libm.tanhf(float(v)) for v in (c * h * inner).astype(np.float32)], np.float32)
    ref = (np.float32(0.5) * h * (np.float32(1) + t)).astype(np.float32).astype(np.float16)
    got = ops.gelu_ggml(h)
    assert (got == ref.astype(np.float32)).mean() > 0.9999
    step = np.maximum(np.abs(np.spacing(ref)), np.abs(np.spacing(got.astype(np.float16)))).astype(np.float32)
    assert np.all(np.abs(got - ref.astype(np.float32)) <= step)
    x = h.astype(np.float64)
    exact = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    ok = x > -3
    assert np.all(np.abs(got[ok] - exact[ok]) <= 1e-3 * np.maximum(np.abs(exact[ok]), 1e-2))
    # off the grid: the input is rounded to fp16 first
    assert ops.gelu_ggml(np.array([1.0001], np.float32))[0] == ops.gelu_ggml(np.array([1.0], np.float32))[0]
    out = ops.gelu_ggml(np.array([-10.0, -1e6, 10.0, 12.5, 1e6], np.float32))
    assert out.tolist() == [0.0, 0.0, 10.0, 12.5, 1e6] and out.dtype == np.float32


def test_gelu_ggml_rounds_to_fp16_as_numpy() -> None:
    """The compiled look-up's fp16 index (LLVM fptrunc) is numpy's astype(float16), bit for bit,
    over every 4099th float32 bit pattern (NaN, inf, subnormal, the overflow at 65520 included)."""
    x = np.arange(0, 2**32, 4099, dtype=np.uint64).astype(np.uint32).view(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        y = ops._gelu_table()[x.astype(np.float16).view(np.uint16)]
        ref = np.where(x <= -10, np.float32(0), np.where(x >= 10, x, y)).astype(np.float32)
    got = ops.gelu_ggml(x)
    same = (got.view(np.uint32) == ref.view(np.uint32)) | (np.isnan(got) & np.isnan(ref))
    assert same.all()
    assert ops.gelu_ggml(x.reshape(-1, 7)[:5]).shape == (5, 7)  # any shape in, the same shape out


def test_gelu_table_is_stored_once_and_read_back(tmp_path, monkeypatch):
    from runtime import CHOSEN_ENV

    monkeypatch.setenv(CHOSEN_ENV, str(tmp_path))
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    built = ops._stored_gelu_table()
    stored = tmp_path / "gelu_f16_table.f32"
    assert stored.stat().st_size == 65536 * 4
    np.testing.assert_array_equal(np.fromfile(stored, np.float32), built)
    marker = built.copy()
    marker[0] = 123.0  # read back, not rebuilt
    marker.tofile(stored)
    assert ops._stored_gelu_table()[0] == 123.0
    stored.write_bytes(b"short")  # a partial file: rebuilt and rewritten
    np.testing.assert_array_equal(ops._stored_gelu_table(), built)
    assert stored.stat().st_size == 65536 * 4
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "users"))  # the user's own folder: not stored
    stored.unlink()
    np.testing.assert_array_equal(ops._stored_gelu_table(), built)
    assert not stored.exists()


def test_silu_on_all_threads_is_silu_to_the_bit():
    """A prompt's SiLU runs in parallel chunks (``ops.silu_chunks``, from activations.PARALLEL_VALUES
    values on); decode_block's blocks call ``ops.silu``: the same bits, ragged last chunk included."""
    from runtime import activations

    x = (np.random.default_rng(5).standard_normal(3 * ops.GELU_CHUNK + 17) * 6).astype(np.float32)
    np.testing.assert_array_equal(ops.silu_chunks(x), ops.silu(x))
    big = np.resize(x, (activations.PARALLEL_VALUES // 64 + 1, 64))
    np.testing.assert_array_equal(activations.activation("silu", big, None), ops.silu(big.reshape(-1)).reshape(big.shape))
