"""aios-run on the second real model: Qwen2.5-Coder-1.5B-Instruct Q4_K_M (Qwen's own GGUF: 28 layers,
d 1536, 12 query / 2 KV heads, q/k/v biases, SwiGLU 8960, a 151,936-token head stored apart from
the embedding; Q4_K and Q6_K), fetched once into the cache (aios/models/real.py; ``real_qwen`` skips when it cannot be)."""

from __future__ import annotations

import numpy as np
import pytest

from runtime.model import Model

pytestmark = [pytest.mark.real_model, pytest.mark.usefixtures("one_thread")]

CODE = 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n    if n < 2:'


def test_the_real_qwen_reads_as_qwen2(real_qwen):
    m = Model(real_qwen, n_ctx=64, arithmetic="int8")
    hp = m.hp
    assert (hp.graph.name, hp.n_layers, hp.d_model, hp.n_heads, hp.n_kv, hp.head_dim, hp.d_ffn) == (
        "qwen2", 28, 1536, 12, 2, 128, 8960)
    # the checkpoint ties its head, the file stores it apart: Q6_K output, Q4_K embedding
    assert (m.output.kind, m.tok_embd.kind, m.output.n_out) == ("Q6_K", "Q4_K", 151936)
    assert {L["attn_q.weight"].kind for L in m.layers} <= {"Q4_K", "Q6_K", "Q5_0", "Q8_0"}
    assert all("attn_q.bias" in L and "attn_k.bias" in L and "attn_v.bias" in L for L in m.layers)


def test_int8_logits_follow_llama_cpps_on_code(real_qwen):
    """Every position of a code prompt against llama.cpp (its default buffers; plain where they
    crash): measured on an AVX2 AMD EPYC, 2026-11-29, the int8 arithmetic's largest error is 3.0 %
    of the position's largest logit (Qwen's outlier activations meet 8-bit rounding in both, in
    different orders) and 19 of 20 top-1 tokens agree."""
    from aios.reference import llamacpp
    from runtime.generate import load_tokenizer

    pytest.importorskip("llama_cpp")
    ids = load_tokenizer(real_qwen)(CODE)["input_ids"]
    theirs = llamacpp.logits(real_qwen, ids, n_ctx=64, n_batch=64, n_threads=2, type_k=0, type_v=0).value
    ours = Model(real_qwen, n_ctx=64, arithmetic="int8").forward(ids, all_logits=True)
    err = np.abs(ours - theirs).max(-1) / np.abs(theirs).max(-1)
    assert err.max() <= 0.06, err.max()
    assert (ours.argmax(-1) == theirs.argmax(-1)).mean() >= 0.9
