"""The K-quant row tiles (runtime.kernels.kq_row_tiles): Q4_K, Q5_K and Q6_K, 16 rows in a vector's
lanes, summed in llama.cpp's batch order (ggml-cpu/tiled's VNNI microkernel). Here against a
numpy emulation of that kernel over quants this file decodes itself (checked against gguf-py's
dequantization); tests/runtime/test_real_model.py holds them to llama.cpp's own tensors."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from runtime import kernels as K
from runtime.kernels import dispatch, kq_row_tiles, kq_tiles
from runtime.kernels import kept as kept_mod
from runtime.kernels.quantize import quantize_activations_k
from tests.runtime.quant_blocks import random_blocks

RNG = np.random.default_rng(31)
f32 = np.float32


def _scale_min(sc: np.ndarray):  # ggml's get_scale_min_k4 over (..., 12) bytes -> (..., 8) each
    sc = sc.astype(np.int64)
    s = np.concatenate([sc[..., 0:4] & 63, (sc[..., 8:12] & 15) | ((sc[..., 0:4] >> 6) << 4)], -1)
    m = np.concatenate([sc[..., 4:8] & 63, (sc[..., 8:12] >> 4) | ((sc[..., 4:8] >> 6) << 4)], -1)
    return s, m


def _quants(fmt: str, W: np.ndarray):
    """(q unsigned (n, nsb, 256), per-sub-block scales, minimums (zeros for Q6_K), d, dmin) of the
    file blocks W, decoded here from ggml's layouts."""
    bpb = kq_row_tiles.KQ_BYTES[fmt]
    blk = W.reshape(W.shape[0], -1, bpb)
    if fmt == "q6_k":
        ql, qh = blk[..., :128].astype(np.int64), blk[..., 128:192].astype(np.int64)
        sc = blk[..., 192:208].view(np.int8).astype(np.int64)
        d = blk[..., 208:210].copy().view(np.float16)[..., 0].astype(f32)
        q = np.empty(blk.shape[:2] + (256,), np.int64)
        for h in range(2):
            L, H = ql[..., 64 * h: 64 * h + 64], qh[..., 32 * h: 32 * h + 32]
            for part in range(4):
                lo = (L[..., 32 * (part % 2): 32 * (part % 2) + 32] >> (4 * (part // 2))) & 15
                q[..., 128 * h + 32 * part: 128 * h + 32 * part + 32] = lo | (((H >> (2 * part)) & 3) << 4)
        return q, sc, np.zeros_like(sc), d, np.zeros_like(d)
    d = blk[..., 0:2].copy().view(np.float16)[..., 0].astype(f32)
    dmin = blk[..., 2:4].copy().view(np.float16)[..., 0].astype(f32)
    s, m = _scale_min(blk[..., 4:16])
    qs = blk[..., (48 if fmt == "q5_k" else 16):].astype(np.int64)
    q = np.empty(blk.shape[:2] + (256,), np.int64)
    for jj in range(4):
        q[..., 64 * jj: 64 * jj + 32] = qs[..., 32 * jj: 32 * jj + 32] & 15
        q[..., 64 * jj + 32: 64 * jj + 64] = qs[..., 32 * jj: 32 * jj + 32] >> 4
    if fmt == "q5_k":
        qh = blk[..., 16:48].astype(np.int64)
        for j in range(8):
            q[..., 32 * j: 32 * j + 32] |= ((qh >> j) & 1) << 4
    return q, s, m, d, dmin


def _as_llama_cpp(fmt: str, W: np.ndarray, X: np.ndarray) -> np.ndarray:
    """X times W as ggml-cpu/tiled's VNNI microkernel sums it: per super-block the int32 sums
    s1 = Σ sc·(raw − bias·bsum), s2 = Σ m·bsum; r = fnmadd(dmin, s2, s1·d); y = fma(r, d_x, y).
    float64 holds each product of two float32 exactly, so one rounding to float32 after the
    addition is the fused operation's."""
    q, sc, m, d, dmin = _quants(fmt, W)
    n, nsb, _ = q.shape
    ns = sc.shape[-1]
    xq, xd, _ = quantize_activations_k(np.ascontiguousarray(X, f32))
    T = X.shape[0]
    xq = xq.reshape(T, nsb, ns, 256 // ns).astype(np.int64)
    bias = 32 if fmt == "q6_k" else 0
    y = np.zeros((T, n), f32)
    for b in range(nsb):
        bs = xq[:, b].sum(-1)  # (T, ns)
        raw = np.einsum("nsv,tsv->tns", q[:, b].reshape(n, ns, -1), xq[:, b])
        s1 = ((raw - bias * bs[:, None, :]) * sc[None, :, b]).sum(-1)
        s2 = (m[None, :, b] * bs[:, None, :]).sum(-1)
        r = (s1.astype(f32) * d[None, :, b]).astype(f32)
        r = (r.astype(np.float64) - dmin[None, :, b].astype(np.float64) * s2.astype(f32)).astype(f32)
        y = (r.astype(np.float64) * xd[:, b, None].astype(np.float64) + y).astype(f32)
    return y


@pytest.mark.parametrize("fmt", kq_row_tiles.KQ_ROW_TYPES)
def test_the_quants_decoded_here_are_gguf_pys(fmt):
    W = random_blocks(fmt, 5, 2, RNG)
    q, sc, m, d, dmin = _quants(fmt, W)
    per = 256 // sc.shape[-1]
    scale = np.repeat(d[..., None] * sc, per, -1)
    offset = np.repeat(dmin[..., None] * m, per, -1)
    mine = (scale * (q - (32 if fmt == "q6_k" else 0)) - offset).reshape(5, -1)
    ref = gguf.dequantize(W, gguf.GGMLQuantizationType[fmt.upper()]).reshape(5, -1)
    np.testing.assert_allclose(mine, ref, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("fmt", kq_row_tiles.KQ_ROW_TYPES)
@pytest.mark.parametrize("kept", [False, True])
def test_int8_sums_are_llama_cpps_batch_sums_bit_for_bit(fmt, kept):
    """37 rows (a group of 5), 3 super-blocks, 13 tokens (a ragged tile); per call and kept."""
    W = random_blocks(fmt, 37, 3, RNG)
    X = RNG.standard_normal((13, 768)).astype(f32)
    X[:, ::9] *= 30
    xq, xd, _ = quantize_activations_k(X)
    Y = np.full((13, 37), np.nan, f32)
    kq_row_tiles.mm_kq_rows(fmt, W, kq_row_tiles.arranged_kq(fmt, xq, xd), Y,
                            kq_row_tiles.group_kq_rows(fmt, W) if kept else None)
    np.testing.assert_array_equal(Y, _as_llama_cpp(fmt, W, X))


@pytest.mark.parametrize("fmt", kq_row_tiles.KQ_ROW_TYPES)
def test_the_runtime_takes_them_kept_or_not_in_int8_and_int16(fmt, no_amx, monkeypatch):
    """Many-token int8 and int16 matmuls of the K-quants run here: int8 llama.cpp's sums, int16
    (two planes) the float product within 1e-4 of its scale where int8 is > 30x off; inside
    ``kept_unpacked`` the groups are built once and reused, same products, freed on exit."""
    W = random_blocks(fmt, 41, 2, RNG)
    X = RNG.standard_normal((K.GEMM_MIN_TOKENS + 3, 512)).astype(f32)
    X[:, ::7] *= 20
    seen = []
    monkeypatch.setattr(dispatch, "mm_kq_rows", lambda f, W, xs, Y, kept: seen.append((xs[2] is not xs[0], kept is not None))
                        or kq_row_tiles.mm_kq_rows(f, W, xs, Y, kept))
    Wf = K.decode_rows_at(fmt, W, np.arange(41)).astype(np.float64)
    exact, scale = X.astype(np.float64) @ Wf.T, np.abs(X).astype(np.float64) @ np.abs(Wf).T
    fresh = {}
    for arith in ("int8", "int16"):
        fresh[arith] = np.full(exact.shape, np.nan, f32)
        K.mm_block_arith(fmt, W, X, None, fresh[arith], K.Arithmetic(arith))
    if not kq_tiles.tiled(fmt):
        pytest.skip(f"{fmt} keeps the float32 GEMM on this CPU")
    np.testing.assert_array_equal(fresh["int8"], _as_llama_cpp(fmt, W, X))
    err8, err16 = (float((np.abs(fresh[a] - exact) / scale).max()) for a in ("int8", "int16"))
    assert err16 < 1e-4 and err8 > 30 * err16, (err8, err16)
    builds = []
    monkeypatch.setattr(kept_mod, "group_kq_rows", lambda *a: builds.append(1) or kq_row_tiles.group_kq_rows(*a))
    assert kept_mod.kept_layout(fmt, 512) == "rows"
    with K.kept_unpacked(matrices=[(fmt, 41, 512)]) as store:
        for arith in ("int8", "int8", "int16"):
            Y = np.empty_like(fresh[arith])
            K.mm_block_arith(fmt, W, X, None, Y, K.Arithmetic(arith).keeping(store))
            np.testing.assert_array_equal(Y, fresh[arith])
        assert builds == [1] and store.nbytes == kept_mod.unpacked_bytes(fmt, 41, 512, "rows")
    assert seen == [(False, False), (True, False), (False, True), (False, True), (True, True)]
    assert store.mats == {}


@pytest.mark.parametrize("fmt", ["q6_k", "q8_0"])
def test_the_output_head_takes_one_plane_under_int16(fmt, no_amx):
    """``Arithmetic.for_head()``: under int16 the head's many-token matmul is int8's (one plane);
    elsewhere, two planes; under int8 and float, nothing changes."""
    nb = 2 if fmt == "q6_k" else 16
    W = random_blocks(fmt, 24, nb, RNG)
    X = RNG.standard_normal((K.GEMM_MIN_TOKENS + 1, 256 * nb if fmt == "q6_k" else 32 * nb)).astype(f32)
    ys = {}
    for arith in ("int8", "int16", "float"):
        for head in (False, True):
            Y = np.full((X.shape[0], 24), np.nan, f32)
            a = K.Arithmetic(arith)
            K.mm_block_arith(fmt, W, X, None, Y, a.for_head() if head else a)
            ys[arith, head] = Y
    if not kq_tiles.tiled(fmt):
        pytest.skip(f"{fmt} keeps the float32 GEMM on this CPU")
    np.testing.assert_array_equal(ys["int16", True], ys["int8", False])
    assert not np.array_equal(ys["int16", False], ys["int8", False])
    for arith in ("int8", "float"):
        np.testing.assert_array_equal(ys[arith, True], ys[arith, False])
