"""aios-run on GGUF files llama.cpp wrote: every runtime architecture row, quantized by
llama.cpp's own quantizer (``llama_model_quantize``) from our f16 export, decodes the same greedy
tokens as llama.cpp on the same file (past Gemma's sliding window: 25 prompt + 16 new tokens,
window 8).

llama.cpp's CPU kernels round the activations to 8-bit blocks before Q8_0 dot products (about
1e-3 on these logits), so on a random tiny model two candidates can tie within that noise: the
texts may part only at such a near-tie (measured: Llama 3.1-RoPE model, step 10, margin 1.1e-3);
the f16 file, where both compute in floats, must match exactly."""

from __future__ import annotations

import ctypes
import shutil

import numpy as np
import pytest

from aios.models.aliases import FIXTURES_DIR
from convert.gguf import GGUFExportConfig, export_gguf
from runtime.generate import generate
from runtime.model import Model
from tests.conftest import LLAMA3_ROPE, build_hf_model

LLAMA_FTYPE_MOSTLY_Q8_0 = 7  # llama.h's llama_ftype
N_NEW = 16


def quantize(src, dst, ftype: int) -> None:
    import llama_cpp

    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype = ftype
    assert llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(p)) == 0


def llama_cpp_greedy(path, ids: list[int], n: int) -> list[int]:
    from llama_cpp import Llama

    llm = Llama(model_path=str(path), n_ctx=256, n_batch=256, logits_all=True, verbose=False,
                n_threads=2, type_k=0, type_v=0)
    try:
        out = []
        llm.eval(ids)
        for _ in range(n):
            t = int(np.argmax(llm.scores[llm.n_tokens - 1]))
            out.append(t)
            llm.eval([t])
        return out
    finally:
        llm.close()


@pytest.mark.parametrize("kind", ["qwen2", "qwen3", "gemma2", "gemma3", "llama3", "phi3"])
def test_greedy_equals_llama_cpp_on_its_q8_0(tmp_path, kind):
    src = build_hf_model(kind.replace("llama3", "llama"), tmp_path / f"tiny-{kind[:3]}", vocab_size=2048,
                         **(LLAMA3_ROPE if kind == "llama3" else {}))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(FIXTURES_DIR / "tiny-falcon" / f, src / f)
    f16, q8 = tmp_path / "m.f16.gguf", tmp_path / "m.q8_0.gguf"
    export_gguf(str(src), f16, GGUFExportConfig("f16"))
    quantize(f16, q8, LLAMA_FTYPE_MOSTLY_Q8_0)
    ids = list(range(5, 30))
    ours, _ = generate(Model(f16), ids, N_NEW)
    assert ours == llama_cpp_greedy(f16, ids, N_NEW)
    ours, _ = generate(Model(q8), ids, N_NEW)
    theirs = llama_cpp_greedy(q8, ids, N_NEW)
    if ours != theirs:
        k = next(i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b)
        logits = Model(q8).forward(ids + ours[:k], all_logits=True)[-1]
        assert logits[ours[k]] - logits[theirs[k]] < 5e-3, (k, ours, theirs)
