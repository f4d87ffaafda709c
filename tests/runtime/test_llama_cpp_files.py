"""aios-run on GGUF files llama.cpp wrote: every runtime architecture row, quantized by
llama.cpp's own quantizer (``llama_model_quantize``) from our f16 export, decodes the same greedy
tokens as llama.cpp on the same file (past Gemma's sliding window: 25 prompt + 16 new tokens,
window 8).

llama.cpp's CPU kernels round the activations to 8-bit blocks before Q8_0 dot products (about
1e-3 on these logits), so on a random tiny model two candidates can tie within that noise: the
texts may part only at such a near-tie (measured: Llama 3.1-RoPE model, step 10, margin 1.1e-3);
the f16 file, where both compute in floats, must match exactly."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from aios.models.aliases import FIXTURES_DIR
from aios.reference import llamacpp
from convert.gguf import GGUFExportConfig, export_gguf
from runtime.generate import generate
from runtime.model import Model
from tests.conftest import LLAMA3_ROPE, build_hf_model

LLAMA_FTYPE_MOSTLY_Q8_0 = 7  # llama.h's llama_ftype
N_NEW = 16


def quantize(src, dst, ftype: int) -> None:
    llamacpp.quantize(src, dst, ftype)


def llama_cpp_greedy(path, ids: list[int], n: int) -> list[int]:
    """llama.cpp's greedy tokens (in a child process: see aios.reference.llamacpp)."""
    return llamacpp.greedy(path, ids, n, n_ctx=256, n_batch=256, n_threads=2, type_k=0, type_v=0).value


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
    ours, _ = generate(Model(f16, arithmetic="float"), ids, N_NEW)
    assert ours == llama_cpp_greedy(f16, ids, N_NEW)
    ours, _ = generate(Model(q8, arithmetic="float"), ids, N_NEW)
    theirs = llama_cpp_greedy(q8, ids, N_NEW)
    if ours != theirs:
        k = next(i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b)
        logits = Model(q8, arithmetic="float").forward(ids + ours[:k], all_logits=True)[-1]
        assert logits[ours[k]] - logits[theirs[k]] < 5e-3, (k, ours, theirs)


LLAMA_FTYPE_MOSTLY_Q4_K_M = 15  # llama.h's llama_ftype


@pytest.mark.parametrize("kind", ["qwen2", "qwen3", "gemma2", "gemma3", "llama3", "phi3", "mistral"])
def test_greedy_equals_llama_cpp_on_its_q4_k_m_in_int8(tmp_path, kind):
    """The mix people deploy, at d_model 256 so llama.cpp writes real K-quants (Q4_K, Q6_K; Q5_0/Q8_0
    where a row is no multiple of 256), run in aios-run's default int8 arithmetic: the same greedy
    tokens as llama.cpp on the same file, up to a near-tie (both round activations to 8 bits, in
    different orders: candidates closer than 1 % of the largest logit may swap). Mistral's window is
    widened past the 41 tokens here: llama.cpp runs a Mistral GGUF as arch "llama", which attends in
    full (our window past the context is tested against transformers in test_model.py)."""

    extra = {"llama3": LLAMA3_ROPE, "mistral": {"sliding_window": 64}}.get(kind, {})
    src = build_hf_model(kind.replace("llama3", "llama"), tmp_path / f"tiny-{kind[:3]}", vocab_size=2048,
                         hidden_size=256, intermediate_size=512, **extra)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(FIXTURES_DIR / "tiny-falcon" / f, src / f)
    f16, q4 = tmp_path / "m.f16.gguf", tmp_path / "m.q4_k_m.gguf"
    export_gguf(str(src), f16, GGUFExportConfig("f16"))
    quantize(f16, q4, LLAMA_FTYPE_MOSTLY_Q4_K_M)
    import gguf

    kinds = {t.tensor_type.name for t in gguf.GGUFReader(str(q4)).tensors}
    assert {"Q4_K", "Q6_K"} <= kinds, kinds
    ids = list(range(5, 30))
    ours, _ = generate(Model(q4, arithmetic="int8"), ids, N_NEW)
    theirs = llama_cpp_greedy(q4, ids, N_NEW)
    if ours != theirs:
        k = next(i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b)
        logits = Model(q4, arithmetic="int8").forward(ids + ours[:k], all_logits=True)[-1]
        assert logits[ours[k]] - logits[theirs[k]] < 1e-2 * np.abs(logits).max(), (k, ours, theirs)
