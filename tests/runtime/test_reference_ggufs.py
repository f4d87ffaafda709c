"""aios-run and the checker on GGUFs llama.cpp's own converter made (``convert_hf_to_gguf.py``).

The files in ``data/reference/`` are tiny random-init models of each family converted by
llama.cpp, not by us (``data/build_reference_ggufs.py`` says how to rebuild them). The same HF
model is rebuilt here from its seed, and:

- aios-run on llama.cpp's file equals aios-run on our f16 export of the same model (≤ 1e-5 of the
  largest logit): the runtime reads llama.cpp's layout (its Q/K permutation, fused QKV, norms,
  RoPE factors) as it reads ours;
- both are within f16 rounding of transformers' logits (≤ 2 % of the largest logit);
- ``aios-contract check`` on llama.cpp's file measures R1 by running it, and agrees with the
  check of the HF folder (SiLU/GELU: no exact zeros in either), and R2/R4 read the same facts;
- Gemma 2's and Phi-3's files carry a SentencePiece vocabulary (``tokenizer.ggml.model = "llama"``):
  the tokenizer aios-run loads from them gives the ids of the model's transformers tokenizer (and of
  llama.cpp's, when llama-cpp-python is installed), chat tokens included, and decodes them back.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from aios.reference import llamacpp
from contract.check import check_model
from convert.gguf import GGUFExportConfig, export_gguf
from runtime.model import Model
from tests.runtime.data.build_reference_ggufs import MODELS, SPM_FAMILIES, build_source
from tests.runtime.test_model import _hf_logits

REFERENCE = Path(__file__).parent / "data" / "reference"
pytestmark = pytest.mark.usefixtures("one_thread")


def _r1_zeros(report) -> tuple[str, float, str]:
    r1 = next(r for r in report.requirements if r.id == "R1")
    zeros = next(m.value for m in r1.metrics if m.name == "mean_exact_zero_fraction")
    return r1.evidence.value, zeros, str(r1.details.get("engine", ""))


def test_every_reference_file_is_present():
    assert sorted(p.name for p in REFERENCE.glob("*.gguf")) == sorted(f"{n}.llamacpp.f16.gguf" for n in MODELS)


@pytest.mark.parametrize("name", list(MODELS))
def test_runtime_and_checker_on_llama_cpp_converted_file(tmp_path, name):
    ref = REFERENCE / f"{name}.llamacpp.f16.gguf"
    src = build_source(name, tmp_path / name)
    ours = tmp_path / "ours.f16.gguf"
    export_gguf(str(src), ours, GGUFExportConfig("f16"))
    ids, hf = _hf_logits(src)
    model = Model(ref, arithmetic="float")
    if model.hp.window:  # Gemma 2/3: the prompt runs past the window of the local layers
        assert len(ids) > model.hp.window and any(model.hp.swa_layers) and not all(model.hp.swa_layers)
    theirs = model.forward(ids, all_logits=True)
    mine = Model(ours, arithmetic="float").forward(ids, all_logits=True)
    scale = float(np.abs(hf).max())
    assert np.abs(theirs - mine).max() <= 1e-5 * scale
    assert np.abs(theirs - hf).max() <= 2e-2 * scale
    folder = check_model(str(src), samples=4, max_tokens=32)
    file = check_model(str(ref), samples=4, max_tokens=32)
    (ev_f, z_f, _), (ev_g, z_g, engine) = _r1_zeros(folder), _r1_zeros(file)
    assert ev_f == ev_g == "measured" and engine.startswith("aios-run")
    assert abs(z_f - z_g) <= 0.01
    for rid in ("R2", "R4"):  # same verdicts and figures (Mistral's folder adds its window as info)
        a, b = ({m.name: m.value for m in next(r for r in rep.requirements if r.id == rid).metrics}
                for rep in (folder, file))
        assert [r.status for r in folder.requirements if r.id == rid] == \
            [r.status for r in file.requirements if r.id == rid]
        assert {k: a[k] for k in b} == b


TEXTS = ["def add(a, b):\n    return a + b  # The list type supports slicing and item assignment.",
         "Hello world", "  two  spaces\n\nand a tab\tnaïve café ☃ 日本 😀", "x  y   z\n\n\n  w"]
CHATS = {"gemma2": ["<start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n", "<eos>x<end_of_turn> y"],
         # Phi-3's chat tokens (and </s>) eat the whitespace after them, <|endoftext|> does not
         "phi3": ["<|user|>\nHi<|end|>\n<|assistant|>\nHello<|end|><|endoftext|>", "<|system|>Be brief.<|end|>",
                  "a</s>\n b<|endoftext|> c"]}


@pytest.mark.parametrize("name", list(SPM_FAMILIES))
def test_sentencepiece_vocabulary_of_the_file_tokenizes_as_the_models_tokenizer(tmp_path, name):
    from transformers import AutoTokenizer

    from runtime.generate import load_tokenizer

    ref = REFERENCE / f"{name}.llamacpp.f16.gguf"
    hf = AutoTokenizer.from_pretrained(str(build_source(name, tmp_path / name)))
    tok = load_tokenizer(ref)
    texts = TEXTS + CHATS[name]
    theirs = llamacpp.tokenize(ref, texts, add_bos=True, special=True).value if llamacpp.available() else None
    for i, text in enumerate(texts):
        ids = tok(text)["input_ids"]
        assert ids == hf(text)["input_ids"], text
        assert ids[0] == hf.bos_token_id and len(ids) > 1
        if theirs is not None:
            assert ids == theirs[i], text
        assert tok.decode(ids) == hf.decode(ids)
        plain = tok(text, add_special_tokens=False)["input_ids"]
        if name == "gemma2" or text in TEXTS:  # Phi-3 writes a space after each chat token
            assert tok.decode(plain) == text
    for chat in CHATS[name]:  # the chat tokens stay whole: one id each
        pieces = [t for t in hf.all_special_tokens if t in chat]
        assert pieces and all(tok.convert_tokens_to_ids(t) in tok(chat)["input_ids"] for t in pieces)
