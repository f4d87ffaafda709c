"""aios-run on a real released model: Gemma 3 270M Q4_K_M (llama.cpp's GGUF-my-repo), fetched once
into the cache (aios/models/real.py; the ``real_gemma`` fixture skips when it cannot be).

The file is what llama.cpp's converter writes for Gemma 3: no ``rope.freq_base_swa``, no
sliding-window pattern, no attention scale; its loader fills them with its Gemma 3 defaults
(local RoPE base 10000, every 6th layer global, q·k scaled by 1/sqrt(head_dim)), and so must we.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from runtime.model import Model

pytestmark = [pytest.mark.real_model, pytest.mark.usefixtures("one_thread")]


def test_the_real_file_reads_with_llama_cpps_gemma3_defaults(real_gemma):
    hp = Model(real_gemma, n_ctx=64).hp
    assert (hp.n_layers, hp.d_model, hp.n_heads, hp.n_kv, hp.head_dim) == (18, 640, 4, 1, 256)
    assert hp.window == 512 and hp.swa_layers == (True,) * 5 + (False,) + (True,) * 5 + (False,) + (True,) * 5 + (False,)
    assert (hp.rope_base, hp.rope_base_swa, hp.rope_scale, hp.rope_scale_swa) == (1e6, 1e4, 1.0, 1.0)
    assert hp.attn_scale == pytest.approx(1 / math.sqrt(256)) and hp.final_softcap == 0.0 == hp.attn_softcap


@pytest.mark.slow  # transformers' GGUF loader dequantizes the file in ~120 s
def test_float_path_equals_transformers_dequantization_on_held_out_text(real_gemma, arithmetic):
    """aios-run's float path vs transformers' dequantization of the same file, over 640 held-out
    positions (past the 512-token window): within 1e-4 of the largest logit."""
    import torch
    from transformers import AutoModelForCausalLM

    from runtime.generate import load_tokenizer
    from runtime.perplexity import heldout_ids

    arithmetic("float")
    tok = load_tokenizer(real_gemma)
    ids = [tok.bos_token_id] + heldout_ids(tok, 639)
    assert len(ids) == 640
    ours = Model(real_gemma, n_ctx=len(ids)).forward(ids, all_logits=True)
    hf = AutoModelForCausalLM.from_pretrained(str(real_gemma.parent), gguf_file=real_gemma.name,
                                              dtype=torch.float32).eval()
    with torch.inference_mode():
        ref = hf(torch.tensor([ids])).logits[0].float().numpy()
    err = np.abs(ours - ref).max(-1) / np.abs(ref).max()
    assert err.max() <= 1e-4, (err.max(), int(err.argmax()))
    assert (ours.argmax(-1) == ref.argmax(-1)).mean() >= 0.99
