"""Many-query attention through BLAS (runtime.attention_gemm) against the one-query kernels."""

from __future__ import annotations

import math

import numpy as np
import pytest

from runtime import attention_gemm, ggml_ops, kernels, ops
from tests.runtime.test_ops import head_major

RNG = np.random.default_rng(3)


def _inputs(T, p0, Hq, Hkv, hd):
    n = p0 + T
    q = RNG.standard_normal((T, Hq, hd)).astype(np.float32)
    K = head_major(RNG.standard_normal((n + 5, Hkv, hd)).astype(np.float32))  # a cache longer than used
    V = head_major(RNG.standard_normal((n + 5, Hkv, hd)).astype(np.float32))
    return q, K, V


@pytest.mark.parametrize("window", [0, 7])
@pytest.mark.parametrize("softcap", [0.0, 5.0])
@pytest.mark.parametrize("p0", [0, 13])
def test_gemm_attention_equals_the_float_path(window, softcap, p0):
    q, K, V = _inputs(40, p0, 6, 2, 48)  # GQA: 3 query heads per KV head
    scale = 1 / math.sqrt(48)
    got = attention_gemm.attention_gemm(q, K, V, p0, scale, window, softcap)
    ref = ops.attention(q, K, V, p0, scale, window, softcap)
    np.testing.assert_allclose(got, ref, rtol=0, atol=2e-5)


@pytest.mark.parametrize("softcap", [0.0, 5.0])
def test_gemm_attention_caps_in_llama_cpp_order(softcap):
    q, K, V = _inputs(20, 3, 4, 1, 32)
    got = attention_gemm.attention_gemm(q, K, V, 3, 0.2, 0, softcap, cap_first=True)
    ref = ggml_ops.attention(q, K, V, 3, np.float32(0.2), 0, np.float32(softcap))
    np.testing.assert_allclose(got, ref, rtol=0, atol=2e-5)


def test_query_chunks_equal_one_chunk(monkeypatch):
    q, K, V = _inputs(50, 4, 4, 2, 16)
    whole = attention_gemm.attention_gemm(q, K, V, 4, 0.25, 9, 0.0)
    monkeypatch.setattr(attention_gemm, "QUERY_CHUNK", 16)  # 16 + 16 + 16 + 2 queries
    np.testing.assert_allclose(attention_gemm.attention_gemm(q, K, V, 4, 0.25, 9, 0.0), whole, rtol=0, atol=1e-6)


def test_batch_entry_points_pick_by_query_count():
    q, K, V = _inputs(kernels.GEMM_MIN_TOKENS - 1, 0, 2, 1, 16)
    # below the threshold: the one-query kernels themselves, bit for bit
    a = kernels.Arithmetic("int8")
    assert (attention_gemm.attention_float(q, K, V, 0, 0.25, 0, 0.0, a).tobytes()
            == ops.attention(q, K, V, 0, 0.25, 0, 0.0).tobytes())
    assert (attention_gemm.attention_ggml(q, K, V, 0, np.float32(0.25), 0, np.float32(0), a).tobytes()
            == ggml_ops.attention(q, K, V, 0, np.float32(0.25), 0, np.float32(0)).tobytes())


# --- packed texts: several texts in one forward pass, each as if alone -----------------------
@pytest.mark.parametrize("fixture", ["tiny-llama", "tiny-falcon"])
def test_packed_texts_equal_each_text_alone(exported, fixture):
    from runtime.model import Model

    path, _ = exported(fixture, "q8_0")
    rng = np.random.default_rng(0)
    texts = [list(rng.integers(3, 200, n)) for n in (40, 57, 33)]
    m = Model(path, n_ctx=256, arithmetic="float")
    seen: list[np.ndarray] = []
    m.ffn_act_hook = lambda layer, a: seen.append(np.array(a))
    alone = []
    for ids in texts:
        seen.clear()
        m.reset()
        last = m.forward(ids)
        alone.append((np.concatenate(seen, 1), last))
    seen.clear()
    m.reset()
    last = m.forward([t for ids in texts for t in ids], starts=np.cumsum([0, 40, 57]))
    packed = np.concatenate(seen, 1)  # (tokens, layers · d_ffn)
    ref = np.concatenate([a for a, _ in alone])
    np.testing.assert_allclose(packed, ref, rtol=0, atol=1e-4 * np.abs(ref).max())
    np.testing.assert_allclose(last, alone[-1][1], rtol=0, atol=1e-4 * np.abs(last).max())
    assert attention_gemm.positions(3, 4).tolist() == [3, 4, 5, 6]  # unpacked: positions count on
    m.reset()
    with pytest.raises(ValueError):  # the one-token kernels know no texts
        m.forward(list(range(3, 3 + kernels.GEMM_MIN_TOKENS - 1)), starts=[0, 10])
    with pytest.raises(ValueError):
        m.forward(list(range(3, 67)), starts=[0, 40], arith=kernels.Arithmetic("float", batched=False))


def test_packed_refuses_what_it_cannot_run():
    with pytest.raises(ValueError):
        attention_gemm.packed_starts([5, 9], 64)
    with pytest.raises(ValueError):
        attention_gemm.packed_starts([0, 70], 64)  # a start outside the chunk
    starts = attention_gemm.packed_starts([0, 40], 64)
    assert attention_gemm.positions(0, 64, starts).tolist() == list(range(40)) + list(range(24))
    with pytest.raises(ValueError):
        attention_gemm.positions(7, 64, starts)  # not a fresh context


def test_pack_texts_groups_up_to_the_limit():
    from runtime.measure import pack_texts

    assert pack_texts([100, 300, 200, 50, 600, 10], limit=512) == [[0, 1], [2, 3], [4], [5]]
    assert pack_texts([10, 10], limit=512) == [[0], [1]]  # 20 tokens: below the GEMM form, one by one


@pytest.mark.parametrize("fixture", ["tiny-llama", "tiny-falcon"])
@pytest.mark.parametrize("n", [5, 40])  # the one-query kernels and the GEMM form
def test_last_block_computes_only_the_last_token_when_only_its_logits_are_asked(exported, fixture, n):
    from runtime.model import Model

    path, _ = exported(fixture, "q8_0")
    ids = list(np.random.default_rng(1).integers(3, 200, n))
    m = Model(path, n_ctx=128, arithmetic="int8")
    full = m.forward(ids, all_logits=True)[-1]
    m.reset()
    last = m.forward(ids)[-1]  # the last block on one row
    np.testing.assert_allclose(last, full, rtol=0, atol=1e-4 * np.abs(full).max())
    # the cache holds every token's K and V: the next step is the same either way
    nxt = m.forward([7])[-1]
    m.reset()
    m.forward(ids, all_logits=True)
    np.testing.assert_allclose(nxt, m.forward([7])[-1], rtol=0, atol=1e-6 * np.abs(nxt).max())
