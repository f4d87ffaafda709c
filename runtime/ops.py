"""The forward pass's small operations (norms, RoPE, attention) as numba kernels.

They touch kilobytes per token, but as numpy expressions they cost ~20 small array
operations per layer and ~3 ms per decoded token (measured: 7 % of a 1 GB f32 decode step,
25 % of a Q8_0 one), time in which no weight is read. Sums are accumulated in float64.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from numba import njit, prange

from runtime.ggml_ops import exp_shift16, f16_bits, fma32
from runtime.kernels import axpy_f64_at, dot_f32_at


@njit(cache=True)
def rms_norm(x, w, eps):  # x (T, d) f32, w (d,) f32 -> (T, d) f32
    T, d = x.shape
    out = np.empty((T, d), np.float32)
    for t in range(T):
        ss = 0.0
        for j in range(d):
            ss += np.float64(x[t, j]) * x[t, j]
        r = 1.0 / math.sqrt(ss / d + eps)
        for j in range(d):
            out[t, j] = x[t, j] * r * w[j]
    return out


@njit(cache=True)
def layer_norm(x, w, b, eps):  # b may be an empty array (no bias)
    T, d = x.shape
    out = np.empty((T, d), np.float32)
    for t in range(T):
        mu = 0.0
        for j in range(d):
            mu += x[t, j]
        mu /= d
        var = 0.0
        for j in range(d):
            var += (x[t, j] - mu) ** 2
        r = 1.0 / math.sqrt(var / d + eps)
        for j in range(d):
            y = (x[t, j] - mu) * r * w[j]
            out[t, j] = y + b[j] if b.shape[0] else y
    return out


@njit(cache=True)
def rope(x, positions, inv_freq, neox):  # x (T, H, hd) f32, rotated in place on the first 2·len(inv_freq) dims
    T, H, _ = x.shape
    half = inv_freq.shape[0]
    for t in range(T):
        for i in range(half):
            ang = positions[t] * inv_freq[i]
            c, s = math.cos(ang), math.sin(ang)
            for h in range(H):
                # NeoX (falcon) pairs (i, i + half); llama.cpp "normal" pairs (2i, 2i + 1)
                ia, ib = (i, i + half) if neox else (2 * i, 2 * i + 1)
                a, b = np.float64(x[t, h, ia]), np.float64(x[t, h, ib])
                x[t, h, ia] = a * c - b * s
                x[t, h, ib] = b * c + a * s


HEADS_PER_ITEM = 4  # query heads of one KV head that share a pass over its keys


@njit(parallel=True, fastmath=True, cache=True)
def attention(q, K, V, p0, scale, window, softcap):
    """Causal attention of q (T, Hq, hd) over the keys 0 .. p0 + T − 1 of K, V (Hkv, n, hd),
    n ≥ p0 + T, each KV head's keys contiguous (the model's cache layout; GQA by head groups).

    ``scale`` multiplies q·k; ``window`` > 0 limits each query to the last ``window`` keys
    (itself included: sliding-window layers); ``softcap`` > 0 caps scores as
    softcap·tanh(s/softcap) before the softmax (Gemma 2).

    Work items are (query position, KV head, up to HEADS_PER_ITEM of its query heads): each
    key row is read once for those heads while it is in L1, and a KV head's rows follow one
    another in memory, so the hardware prefetcher streams them (with position-major rows,
    4 KiB apart at 8 KV heads × 128, each row was a fresh miss: 3× slower at 2048 keys).
    q·k sums in float32 lanes; the softmax and p·V sum in float64."""
    T, Hq, hd = q.shape
    Hkv, cap = K.shape[0], K.shape[1]
    group = Hq // Hkv
    nsub = (group + HEADS_PER_ITEM - 1) // HEADS_PER_ITEM
    qf = np.ascontiguousarray(q).reshape(-1)
    Kf, Vf = K.reshape(-1), V.reshape(-1)
    out = np.empty((T, Hq * hd), np.float32)
    for item in prange(T * Hkv * nsub):
        t = item // (Hkv * nsub)
        kv = (item // nsub) % Hkv
        h0 = kv * group + (item % nsub) * HEADS_PER_ITEM
        gs = min(HEADS_PER_ITEM, kv * group + group - h0)
        m = p0 + t + 1  # keys 0 .. p0 + t
        j0 = max(0, m - window) if window > 0 else 0
        n = m - j0
        s = np.empty((gs, n), np.float64)
        for j in range(n):
            ko = (kv * cap + j0 + j) * hd
            for g in range(gs):
                sj = dot_f32_at(qf, (t * Hq + h0 + g) * hd, Kf, ko, hd) * scale
                if softcap > 0.0:
                    sj = softcap * math.tanh(sj / softcap)
                s[g, j] = sj
        tot = np.zeros(gs, np.float64)  # each head's softmax denominator, applied once at the end
        for g in range(gs):
            top = -np.inf
            for j in range(n):
                top = max(top, s[g, j])
            for j in range(n):
                e = math.exp(s[g, j] - top)
                s[g, j] = e
                tot[g] += e
        o = np.zeros(gs * hd, np.float64)
        for j in range(n):
            vo = (kv * cap + j0 + j) * hd
            for g in range(gs):
                axpy_f64_at(o, g * hd, s[g, j], Vf, vo, hd)
        for g in range(gs):
            for d in range(hd):
                out[t, (h0 + g) * hd + d] = o[g * hd + d] / tot[g]
    return out



# --- llama.cpp's GELU (the int8 arithmetic's activation) ---------------------------------------
# ggml computes GELU on the CPU as the tanh approximation looked up in a table with one fp16
# result per fp16 input (ggml_vec_gelu_f32 with GGML_GELU_FP16: x ≤ −10 → 0, x ≥ 10 → x, else
# table[fp16(x)]), for HF "gelu" (erf) checkpoints such as Falcon too. The int8 path reproduces
# llama.cpp's arithmetic, so it uses the same table, built as ggml builds it: ggml_gelu_f32 in
# float32 with glibc's tanhf (numba's math.tanh on a float32 calls it; numpy's own float32 tanh
# differs by an ulp often enough to move 235 of the table's fp16 entries) and GCC's fused
# multiply-add. numpy does the fp16
# rounding (numba has no float16), which is round-to-nearest-even like the F16C conversion.
_GELU_TABLE: list[np.ndarray] = []
_SQRT_2_OVER_PI = np.float32(0.79788456080286535587989211986876)
_GELU_COEF_A = np.float32(0.044715)


@njit(cache=True)
def _gelu_f32(h):  # ggml_gelu_f32 on every element, float32 throughout
    out = np.empty_like(h)
    for i in range(h.shape[0]):
        x = h[i]
        # GCC contracts 1.0f + GELU_COEF_A*x*x into one fused multiply-add (it moves one entry
        # of the table, at x = −1.999, found against llama.cpp's GELU output)
        inner = fma32(_GELU_COEF_A * x, x, np.float32(1.0))
        out[i] = np.float32(0.5) * x * (np.float32(1.0) + math.tanh(_SQRT_2_OVER_PI * x * inner))
    return out


def _gelu_table() -> np.ndarray:
    if not _GELU_TABLE:
        _GELU_TABLE.append(_stored_gelu_table())
    return _GELU_TABLE[0]


def _stored_gelu_table() -> np.ndarray:
    """The table from the kernels' cache folder (named by these sources' hash: runtime.
    numba_cache_dir), built and stored there on first use: loading ``_gelu_f32``'s compiled code
    to rebuild it took 0.3 s of every warm start."""
    import os

    from runtime import CHOSEN_ENV

    folder = os.environ.get(CHOSEN_ENV)
    path = None if not folder or folder != os.environ.get("NUMBA_CACHE_DIR") else Path(folder, "gelu_f16_table.f32")
    if path is not None and path.is_file() and path.stat().st_size == 65536 * 4:
        return np.fromfile(path, np.float32)
    h = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        table = _gelu_f32(h).astype(np.float16).astype(np.float32)
    if path is not None:
        from aios.io import write_atomic

        try:
            write_atomic(path, table.tobytes())
        except OSError:  # a read-only cache: built each time, as before
            pass
    return table


def gelu_table() -> np.ndarray:
    """ggml's GELU table: the fp16-rounded GELU of every fp16 value, indexed by its bits."""
    return _gelu_table()


def gelu_ggml(x: np.ndarray) -> np.ndarray:
    """GELU as llama.cpp's CPU backend computes it (tanh form, fp16 table), float32 out; a many-
    token block of rows on all threads (``gelu_lookup_rows``)."""
    x = np.ascontiguousarray(x, np.float32)
    if x.ndim == 2 and x.size >= 1 << 16:
        return gelu_lookup_rows(x, _gelu_table())
    return gelu_lookup(x.reshape(-1), _gelu_table()).reshape(x.shape)


@njit(parallel=True, cache=True)
def gelu_lookup_rows(x, table):
    """``gelu_lookup`` of each row of x (T, n), rows spread over the threads (a 512-token prompt
    of the real Gemma: 2.8 ms per layer on one thread)."""
    out = np.empty_like(x)
    for t in prange(x.shape[0]):
        for i in range(x.shape[1]):
            v = x[t, i]
            out[t, i] = np.float32(0.0) if v <= -10 else (v if v >= 10 else table[f16_bits(v)])
    return out


@njit(cache=True)
def gelu_lookup(x, table):
    """ggml_vec_gelu_f32 (GGML_GELU_FP16): 0 at x ≤ −10, x at x ≥ 10, else the table at x's fp16
    bits (|x| ≥ 65520 rounds to ±inf there, as in ggml). One compiled loop: as numpy (fp16
    cast, gather, two selects) it took 0.27 ms per Falcon-7B FFN row of 18176."""
    out = np.empty_like(x)
    for i in range(x.shape[0]):
        v = x[i]
        out[i] = np.float32(0.0) if v <= -10 else (v if v >= 10 else table[f16_bits(v)])
    return out


GELU_CHUNK = 4096  # values per parallel chunk of ``gelu_tanh`` and ``silu_chunks``


# --- the float path's FFN activations, compiled: one call instead of 3-4 numpy temporaries (cold
# after each weight matrix streams through the caches), and callable from decode_block's blocks,
# which must compute them to the bit as the step by step path does
@njit(cache=True)
def silu(x):  # x (n,) float32: x / (1 + exp(-x)), in float32
    out = np.empty_like(x)
    one = np.float32(1.0)
    for i in range(x.shape[0]):
        out[i] = x[i] / (one + math.exp(-x[i]))
    return out


@njit(parallel=True, cache=True)
def silu_chunks(x):  # ``silu`` to the bit, chunks of GELU_CHUNK values on all threads (large inputs)
    n = x.shape[0]
    out = np.empty_like(x)
    one = np.float32(1.0)
    for c in prange((n + GELU_CHUNK - 1) // GELU_CHUNK):
        for i in range(c * GELU_CHUNK, min(n, (c + 1) * GELU_CHUNK)):
            out[i] = x[i] / (one + math.exp(-x[i]))
    return out


_SQRT2 = np.float32(math.sqrt(2.0))


@njit(cache=True)
def gelu_erf(x):  # x (n,) float32: exact (erf) GELU, HF "gelu", in float32
    out = np.empty_like(x)
    half, one = np.float32(0.5), np.float32(1.0)
    for i in range(x.shape[0]):
        out[i] = half * x[i] * (one + math.erf(x[i] / _SQRT2))
    return out


_C_TANH = np.float32(math.sqrt(2 / math.pi))



@njit(parallel=True, cache=True)
def gelu_tanh(x):  # x (n,) float32: tanh-approximated GELU (HF gelu_new / gelu_pytorch_tanh), in float32
    """0.5·x·(1 + tanh(y)), y = √(2/π)·(x + 0.044715·x³), computed as x / (1 + exp(−2y)) (the
    same function, no cancellation for either sign) with ggml_v_expf's polynomial 16 lanes at a
    time (``exp_shift16``): numba's scalar tanhf took 6 ms of a (127 × 2048) call."""
    n = x.shape[0]
    out = np.empty_like(x)
    a, m2c, one = np.float32(0.044715), np.float32(-2.0) * _C_TANH, np.float32(1.0)
    for c in prange((n + GELU_CHUNK - 1) // GELU_CHUNK):
        lo = c * GELU_CHUNK
        hi = min(n, lo + GELU_CHUNK)
        for i in range(lo, hi):
            v = x[i]
            out[i] = m2c * (v + a * (v * v * v))
        e = out[lo:hi]
        exp_shift16(e, np.float32(0.0))
        for i in range(lo + (hi - lo) // 16 * 16, hi):
            out[i] = math.exp(out[i])
        for i in range(lo, hi):
            out[i] = x[i] / (one + out[i])
    return out
