"""Causal attention of many queries at once (a prompt, a perplexity window) through BLAS.

``ops.attention`` and ``ggml_ops.attention`` take one (query, head) per work item and walk its
keys one by one: right for decode, where a step has one query and the keys stream from the
cache once. With T queries they read every key T times and never reuse a loaded row across
queries; on the real Gemma 3 270M a 512-token prompt spent 0.6 s of 1.7 in them (2-core Xeon,
2026-11-27). Here, per KV head and chunk of queries, the scores are one float32 GEMM
(Q·Kᵀ over all the keys the chunk sees), the masked softmax one compiled pass over them, and
the output one more GEMM (P·V). Both GEMMs run on numpy's BLAS.

The arithmetic is float32 throughout, the softmax's sum in float64: the float path's
``ops.attention`` sums q·k in float32 too and p·V in float64; ``ggml_ops.attention`` reproduces
llama.cpp's one-query kernel bit for bit, which a GEMM cannot (llama.cpp's own batched path
sums in other orders as well). ``attention_float`` / ``attention_ggml`` (what the model calls)
take this form where the caller's ``Arithmetic.use_gemm`` says (from GEMM_MIN_TOKENS queries,
unless its ``batched`` is off), and ``ops.attention`` / ``ggml_ops.attention`` below that.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from runtime import ggml_ops, ops
from runtime.ggml_ops import exp_shift16, v_expf
from runtime.kernels.arithmetic import Arithmetic

QUERY_CHUNK = 256  # queries per GEMM: the scores (chunk · heads per KV head × keys) stay bounded

# Packed sequences: several independent texts in one forward pass from an empty context (the
# checker's calibration texts, 75 tokens on average, ran as GEMMs of 75 rows; packed, as GEMMs
# of up to 512). With ``starts`` (Model.forward's argument), the chunk's token t belongs to the
# text that starts at the largest start ≤ t: its RoPE position counts from that start
# (``positions``) and its query sees only that text's keys (``attention_gemm``). Every token of
# every text is then computed as if its text ran alone, to float32 rounding
# (tests/runtime/test_attention_gemm.py).


def packed_starts(starts, T: int) -> np.ndarray:
    """``starts`` (ascending token offsets, the first 0, all inside a chunk of T tokens) as an
    int64 array; ValueError otherwise."""
    starts = np.asarray(starts, np.int64)
    if len(starts) == 0 or starts[0] != 0 or (np.diff(starts) <= 0).any() or starts[-1] >= T:
        raise ValueError("packed: starts must ascend from 0 inside the chunk")
    return starts


def positions(p0: int, T: int, starts: np.ndarray | None = None) -> np.ndarray:
    """The positions of T tokens after p0 cached ones: p0 .. p0+T−1, or, packed (``starts``),
    each token's offset within its own text (then p0 must be 0)."""
    if starts is None:
        return np.arange(p0, p0 + T)
    if p0 != 0:
        raise ValueError("packed texts need a fresh context")
    t = np.arange(T)
    return t - starts[np.searchsorted(starts, t, side="right") - 1]


@njit(parallel=True, fastmath=True, cache=True)
def _softmax_rows(S, p0, t0, j0, group, scale, window, softcap, cap_first, first_key):
    """In place: row r of S (query t0 + r // group at position p0 + t0 + r // group; column c is
    key j0 + c) becomes its softmax over the keys that query may see (causal, within ``window``
    when > 0, from ``first_key[t]`` on when that is not empty), 0 elsewhere. Scores are ×scale then capped as softcap·tanh(s/softcap) (the float
    path), or capped first and then ×scale (``cap_first``: llama.cpp's order). The exponentials
    are ggml's vectorized expf (``ggml_ops.exp_shift16``); fastmath lets the sums vectorize
    (float32 sums: 2× faster than float64 here, 10⁻⁷ relative)."""
    R, n = S.shape
    for r in prange(R):
        p = p0 + t0 + r // group
        a = max(j0, p + 1 - window) - j0 if window > 0 else 0
        if first_key.shape[0]:  # packed texts: none of the keys before the query's own text
            a = max(a, first_key[t0 + r // group] - j0)
        b = p + 1 - j0  # the visible columns a .. b-1
        if softcap > 0:
            for c in range(a, b):
                if cap_first:
                    S[r, c] = np.float32(math.tanh(S[r, c] / softcap)) * softcap * scale
                else:
                    S[r, c] = np.float32(softcap * math.tanh(S[r, c] * scale / softcap))
        else:
            for c in range(a, b):
                S[r, c] = S[r, c] * scale
        top = np.float32(-np.inf)
        for c in range(a, b):
            top = max(top, S[r, c])
        m = a + (b - a) // 16 * 16
        exp_shift16(S[r, a:b], top)  # 16 lanes at a time, then the tail one by one
        for c in range(m, b):
            S[r, c] = v_expf(S[r, c] - top)
        tot = np.float32(0.0)
        for c in range(a, b):
            tot += S[r, c]
        inv = np.float32(1.0) / tot
        for c in range(a):
            S[r, c] = 0.0
        for c in range(a, b):
            S[r, c] = S[r, c] * inv
        for c in range(b, n):
            S[r, c] = 0.0


def attention_gemm(q, K, V, p0: int, scale, window: int, softcap, cap_first: bool = False,
                   starts: np.ndarray | None = None) -> np.ndarray:
    """Causal attention of q (T, Hq, hd) at positions p0 .. p0+T−1 over the keys 0 .. p0+T−1 of
    K, V (Hkv, n, hd) (the models' cache layout; GQA by head groups): (T, Hq·hd) float32, the
    contract of ``ops.attention`` (``cap_first``: ``ggml_ops.attention``'s cap order; ``starts``:
    packed texts, each query sees its own text's keys only)."""
    T, Hq, hd = q.shape
    Hkv = K.shape[0]
    group = Hq // Hkv
    out = np.empty((T, Hq, hd), np.float32)
    first_key = np.zeros(0, np.int64)  # per query, the first key of its text (packed texts)
    if starts is not None:
        first_key = p0 + starts[np.searchsorted(starts, np.arange(T), side="right") - 1]
    for t0 in range(0, T, QUERY_CHUNK):
        t1 = min(T, t0 + QUERY_CHUNK)
        first = p0 + t0  # the first query's position: no key before its window is seen
        j0 = max(0, first + 1 - window) if window > 0 else 0
        m = p0 + t1  # keys j0 .. m-1
        for kv in range(Hkv):
            Q = np.ascontiguousarray(q[t0:t1, kv * group:(kv + 1) * group]).reshape((t1 - t0) * group, hd)
            S = Q @ K[kv, j0:m].T
            _softmax_rows(S, p0, t0, j0, group, np.float32(scale), window, np.float32(softcap or 0.0), cap_first,
                          first_key)
            out[t0:t1, kv * group:(kv + 1) * group] = (S @ V[kv, j0:m]).reshape(t1 - t0, group, hd)
    return out.reshape(T, Hq * hd)


def _last(q, p0, last: bool):
    """With ``last`` (a prompt's last block when only its last token's logits are asked): the
    last query alone (its K and V, and every other token's, are in the cache already)."""
    if last and q.shape[0] > 1:
        return q[-1:], p0 + q.shape[0] - 1
    return q, p0


def attention_float(q, K, V, p0, scale, window, softcap, arith: Arithmetic, last: bool = False, starts=None):
    """``ops.attention`` (the float path's) for any number of queries: where ``arith.use_gemm``
    says, the GEMM form, scores and weights in float32."""
    q, p0 = _last(q, p0, last)
    if arith.use_gemm(q.shape[0]):
        return attention_gemm(q, K, V, p0, scale, window, softcap or 0.0, starts=starts)
    return ops.attention(q, K, V, p0, scale, window, softcap)


def attention_ggml(q, K, V, p0, scale, window, softcap, arith: Arithmetic, last: bool = False, starts=None):
    """``ggml_ops.attention`` (llama.cpp's one-query rounding) for any number of queries: where
    ``arith.use_gemm`` says, the GEMM form in llama.cpp's cap order (float32 sums in BLAS order);
    never under the "llamacpp" arithmetic, whose sums are llama.cpp's batch ones (its batched
    q·k is vec_dot_f32 per pair, its p·V tinyBLAS, as the one-query kernel sums them)."""
    q, p0 = _last(q, p0, last)
    if arith.use_gemm(q.shape[0]) and arith.name != "llamacpp":
        return attention_gemm(q, K, V, p0, scale, window, softcap, cap_first=True, starts=starts)
    return ggml_ops.attention(q, K, V, p0, scale, window, softcap)
