"""The "llamacpp" arithmetic: every sum in llama.cpp's order (runtime.kernels.ggml_order, dispatch).

Two kinds of check: the one-token K-quant kernels against a numpy emulation of
ggml_vec_dot_q4_K_q8_K / q6_K_q8_K (quants decoded here, tied to gguf-py's dequantization), and
whole models against llama.cpp itself (its plain CPU buffers, F32 KV cache): a llama with d_model
256 that llama.cpp quantized to Q4_K_M and to Q5_K_M (Q4_K, Q5_K, Q6_K; the real Gemma 3 270M's
Q5_0/Q8_0 mix in tests/runtime/test_real_model.py), logits bit for bit at one-token and batch sizes.
"""

from __future__ import annotations

import platform
import shutil

import numpy as np
import pytest

from runtime import ggml_ops, kernels
from runtime.kernels.ggml_order import GGML_KQ_KIND, mm_kq_ggml

F32 = np.float32


def _fma(a, b, c):  # a·b + c rounded once (float64 holds a float32 product exactly)
    return (np.float64(a) * np.float64(b) + np.float64(c)).astype(F32)


def _hsum8(a):
    return F32(F32(F32(a[0] + a[4]) + F32(a[2] + a[6])) + F32(F32(a[1] + a[5]) + F32(a[3] + a[7])))


def _random_rows(qtype, n, k, rng):
    """n rows of k values as random ``qtype`` super-blocks (any bits are valid quants), the fp16
    scales set to small finite values."""
    import gguf

    bpb = gguf.GGML_QUANT_SIZES[qtype][1]
    W = rng.integers(0, 256, (n, k // 256, bpb), dtype=np.uint8)
    d_at = {gguf.GGMLQuantizationType.Q4_K: (0, 2), gguf.GGMLQuantizationType.Q5_K: (0, 2),
            gguf.GGMLQuantizationType.Q6_K: (bpb - 2,)}[qtype]
    for o in d_at:
        W[..., o:o + 2] = rng.uniform(1e-3, 2e-2, W.shape[:2]).astype(np.float16)[..., None].view(np.uint8)
    return W.reshape(n, -1)


def _quants(qtype, W, k):
    """(q (n, k) int, per-value scale, per-value min term, d, dmin) decoded here in numpy; checked
    against gguf-py's dequantization by the caller."""
    import gguf

    n = W.shape[0]
    B = W.reshape(n, k // 256, -1)
    if qtype in (gguf.GGMLQuantizationType.Q4_K, gguf.GGMLQuantizationType.Q5_K):
        q5 = qtype == gguf.GGMLQuantizationType.Q5_K
        d, dmin = (B[..., o:o + 2].copy().view(np.float16)[..., 0].astype(F32) for o in (0, 2))
        s = B[..., 4:16].astype(np.int32)
        sc = np.concatenate([s[..., 0:4] & 63, (s[..., 8:12] & 15) | ((s[..., 0:4] >> 6) << 4)], -1)
        mn = np.concatenate([s[..., 4:8] & 63, (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)], -1)
        qs = B[..., 48 if q5 else 16:].astype(np.int32).reshape(n, k // 256, 4, 32)
        q = np.stack([qs & 15, qs >> 4], 3).reshape(n, k // 256, 8, 32)  # sub-block 2j low nibbles, 2j + 1 high
        if q5:  # bit j of qh[l]: value l of sub-block j, its fifth bit
            qh = B[..., 16:48].astype(np.int32)
            q = q | (((qh[..., None, :] >> np.arange(8)[:, None]) & 1) << 4)
        return q.reshape(n, k // 256, 256), np.repeat(sc, 32, -1), np.repeat(mn, 32, -1), d, dmin
    ql, qh = B[..., :128].astype(np.int32), B[..., 128:192].astype(np.int32)
    sc = B[..., 192:208].view(np.int8).astype(np.int32)
    d = B[..., 208:210].copy().view(np.float16)[..., 0].astype(F32)
    parts = []
    for h in range(2):
        for part in range(4):
            lo = (ql[..., 64 * h + 32 * (part % 2): 64 * h + 32 * (part % 2) + 32] >> (4 * (part // 2))) & 15
            hi = (qh[..., 32 * h: 32 * h + 32] >> (2 * part)) & 3
            parts.append(lo | (hi << 4))
    return np.concatenate(parts, -1), np.repeat(sc, 16, -1), None, d, None


def _ggml_dot(qtype, q, sc, mn, d, dmin, xq, xd, xb):
    """One row · one token as ggml's AVX2 vec_dot sums it (lanes of 4 values of each 32-value chunk)."""
    import gguf

    acc, accm, summs = np.zeros(8, F32), np.zeros(4, F32), F32(0)
    for i in range(q.shape[0]):
        x = xq[256 * i: 256 * i + 256].astype(np.int64)
        terms = (sc[i] * q[i] * x).reshape(8, 8, 4).sum((0, 2))  # chunk, lane, 4 values
        dd = F32(xd[i] * d[i])
        if qtype == gguf.GGMLQuantizationType.Q6_K:
            bs = xb[16 * i: 16 * i + 16].astype(np.int64)
            terms = terms - 32 * (bs * sc[i][::16]).reshape(8, 2).sum(1)
        elif qtype == gguf.GGMLQuantizationType.Q5_K:  # one integer, one fma into a scalar
            s32 = xb[16 * i: 16 * i + 16].astype(np.int64).reshape(8, 2).sum(1)
            summs = _fma(F32(-xd[i] * dmin[i]), F32((mn[i][::32] * s32).sum()), summs)
        else:
            s32 = xb[16 * i: 16 * i + 16].astype(np.int64).reshape(8, 2).sum(1)
            prod = (mn[i][::32] * s32).reshape(4, 2).sum(1)
            accm = _fma(F32(-xd[i] * dmin[i]), prod.astype(F32), accm)
        acc = _fma(dd, terms.astype(F32), acc)
    out = _hsum8(acc)
    if qtype == gguf.GGMLQuantizationType.Q4_K:
        out = F32(out + F32(F32(accm[0] + accm[2]) + F32(accm[1] + accm[3])))
    if qtype == gguf.GGMLQuantizationType.Q5_K:
        out = F32(out + summs)
    return out


@pytest.mark.parametrize("name", ["Q4_K", "Q5_K", "Q6_K"])
def test_one_token_k_quant_kernels_sum_as_ggml_vec_dot(name):
    import gguf

    qtype = gguf.GGMLQuantizationType[name]
    rng = np.random.default_rng(7)
    n, k, T = 12, 512, 3
    W = _random_rows(qtype, n, k, rng)
    q, sc, mn, d, dmin = _quants(qtype, W, k)
    ref = gguf.quants.dequantize(W, qtype).reshape(n, k // 256, 256)
    if mn is None:  # Q6_K: d·sc·(q − 32)
        mine = d[..., None] * sc * (q - 32)
    else:
        mine = d[..., None] * sc * q - dmin[..., None] * mn
    np.testing.assert_allclose(mine, ref, rtol=1e-6, atol=1e-7)  # the decode here is gguf-py's
    X = rng.standard_normal((T, k)).astype(F32)
    xq, xd, xb = kernels.quantize_activations_k(X)
    Y = np.zeros((T, n), F32)
    mm_kq_ggml(W, xq, xd, xb, None, Y, GGML_KQ_KIND[name.lower()])
    want = np.array([[_ggml_dot(qtype, q[r], sc[r], None if mn is None else mn[r], d[r], None if dmin is None else dmin[r],
                                xq[t], xd[t], xb[t]) for r in range(n)] for t in range(T)])
    np.testing.assert_array_equal(Y, want)
    rows = np.array([5, 1, 9], np.int64)  # a row subset writes those columns only
    Y2 = np.full((T, n), -1.0, F32)
    mm_kq_ggml(W, xq, xd, xb, rows, Y2, GGML_KQ_KIND[name.lower()])
    np.testing.assert_array_equal(Y2[:, rows], want[:, rows])
    assert (np.delete(Y2, rows, 1) == -1).all()


def test_the_arithmetic_is_a_choice_and_says_what_it_mirrors():
    assert "llamacpp" in kernels.ARITHMETICS
    label = kernels.arithmetic_label("llamacpp", {"Q4_K", "Q6_K", "Q5_0", "Q4_1"})
    assert label.startswith("llamacpp") and "Q4_K" in label and "Q5_0" in label and "Q4_1" not in label.split(";")[0]


@pytest.fixture(scope="module", params=["Q4_K_M", "Q5_K_M"])
def q4_k_m_d256(tmp_path_factory, request):
    """A d_model-256 llama (random init) that llama.cpp itself quantized to Q4_K_M (Q4_K and
    Q6_K matrices) and to Q5_K_M (Q5_K and Q6_K)."""
    pytest.importorskip("llama_cpp")
    from aios.models.aliases import FIXTURES_DIR
    from convert.gguf import GGUFExportConfig, export_gguf
    from tests.conftest import build_hf_model
    from tests.runtime.test_llamacpp_presets import quantize

    root = tmp_path_factory.mktemp("ggml_order")
    src = build_hf_model("llama", root / "tiny-d256", hidden_size=256, intermediate_size=512,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=2048)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(FIXTURES_DIR / "tiny-llama" / f, src / f)
    f16, out = root / "m.f16.gguf", root / f"m.{request.param}.gguf"
    export_gguf(str(src), f16, GGUFExportConfig("f16"))
    quantize(f16, out, request.param)
    return out


def _needs_llamacpps_order():
    if platform.machine().lower() not in ("x86_64", "amd64") or not ggml_ops.avx512_order():
        pytest.skip("llama.cpp's sums are mirrored as its x86 AVX-512 build orders them")
    if "avx512vnni" != kernels.int_dot_features():
        pytest.skip("its tiled K-quant kernel (mirrored by the row tiles) needs AVX-512 VNNI")


@pytest.mark.parametrize("n", [5, 12, 24])  # one-token kernels, then llama.cpp's tiled batch (from 8)
def test_logits_equal_llama_cpps_bit_for_bit(q4_k_m_d256, n):
    from aios.reference import llamacpp
    from runtime.model import Model

    _needs_llamacpps_order()
    import gguf

    kinds = {t.tensor_type.name for t in gguf.GGUFReader(str(q4_k_m_d256)).tensors}
    assert {"Q4_K", "Q6_K"} <= kinds or {"Q5_K", "Q6_K"} <= kinds, kinds  # what the test is about
    ids = list(range(7, 7 + n))
    theirs = llamacpp.logits(q4_k_m_d256, ids, plain_only=True, n_ctx=64, n_batch=64, n_threads=2,
                             type_k=0, type_v=0).value
    ours = Model(q4_k_m_d256, n_ctx=64, arithmetic="llamacpp").forward(ids, all_logits=True)
    np.testing.assert_array_equal(ours, theirs)


def test_greedy_decode_equals_llama_cpps(q4_k_m_d256):
    """The prompt as a batch, then one token a step: the one-token kernels and attention too."""
    from aios.reference import llamacpp
    from runtime.generate import generate
    from runtime.model import Model

    _needs_llamacpps_order()
    ids = list(range(40, 52))
    theirs = llamacpp.greedy(q4_k_m_d256, ids, 12, plain_only=True, n_ctx=64, n_batch=64, n_threads=2,
                             type_k=0, type_v=0).value
    ours, _ = generate(Model(q4_k_m_d256, n_ctx=64, arithmetic="llamacpp"), ids, 12)
    assert list(ours) == theirs
