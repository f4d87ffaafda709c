"""aios.models.spm_tokenizer: llama.cpp's SentencePiece tokenizer read straight from a GGUF.

Held to llama.cpp's ids (llama-cpp-python, on the same file) and to transformers' tokenizer of the
same file (ids and decoded text), on llama.cpp's own conversions of tiny Gemma 2 and Phi-3 models
and on the real Gemma 3 270M; and, on hand-made vocabularies, to the rules of llama-vocab.cpp."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

from aios.errors import InvalidModelError
from aios.models.gguf_tokenizer import load_gguf_tokenizer
from aios.models.spm_tokenizer import SpmTokenizer, load_spm_tokenizer
from aios.reference import llamacpp
from tests.aios.models.test_gguf_tokenizer import CHAT, MIXED

REFERENCE = Path(__file__).resolve().parents[2] / "runtime" / "data" / "reference"
CHATS = {"gemma2": [CHAT, "<eos>x<end_of_turn> y", "<bos>hi"],
         "phi3": ["<|user|>\nHi<|end|>\n<|assistant|>\nHello<|end|><|endoftext|>", "<|system|>Be brief.<|end|>",
                  "a</s>\n b<|endoftext|> c"]}


def _texts(n_topics: int = 4) -> list[str]:
    import pydoc_data.topics

    return list(pydoc_data.topics.topics.values())[:n_topics] + MIXED + ["", " ", "  x", "x "]


def _same_as_transformers(tok, ref, texts) -> None:
    for text in texts:
        for kw in ({}, {"add_special_tokens": False}, {"split_special_tokens": True}):
            assert tok(text, **kw)["input_ids"] == ref(text, **kw)["input_ids"], (text[:60], kw)
        ids = ref(text)["input_ids"]
        for skip in (False, True):
            assert tok.decode(ids, skip_special_tokens=skip) == ref.decode(ids, skip_special_tokens=skip), text[:60]
    rng = random.Random(0)
    for _ in range(200):  # any ids: byte tokens, control, unused and user-defined ones among them
        ids = [rng.randrange(len(tok)) for _ in range(rng.randrange(1, 10))]
        for skip in (False, True):
            assert tok.decode(ids, skip_special_tokens=skip) == ref.decode(ids, skip_special_tokens=skip), ids
    for name in ("bos_token_id", "eos_token_id", "unk_token_id", "pad_token_id", "bos_token", "eos_token",
                 "chat_template"):
        assert getattr(tok, name) == getattr(ref, name), name
    assert len(tok) == len(ref)


@pytest.mark.parametrize("family", ["gemma2", "phi3"])
def test_llama_cpps_spm_files_tokenize_as_llama_cpp_and_transformers(family, tmp_path, monkeypatch):
    monkeypatch.setenv("AIOS_CACHE", str(tmp_path))
    path = REFERENCE / f"{family}.llamacpp.f16.gguf"
    tok = load_spm_tokenizer(path)
    assert isinstance(tok, SpmTokenizer)
    texts = _texts() + CHATS[family]
    _same_as_transformers(tok, load_gguf_tokenizer(path), texts)
    if llamacpp.available():
        for special in (False, True):
            theirs = llamacpp.tokenize(path, texts, add_bos=True, special=special).value
            assert [tok(t, split_special_tokens=not special)["input_ids"] for t in texts] == theirs


@pytest.mark.real_model
def test_real_gemma_tokenizes_as_llama_cpp_and_decodes_as_transformers(real_gemma):
    """> 20 kB of held-out prose and mixed text: llama.cpp's ids, with and without special tokens."""
    tok = load_spm_tokenizer(real_gemma)
    texts = _texts(12) + [CHAT]
    assert sum(len(t.encode()) for t in texts) > 20_000
    if llamacpp.available():
        for special in (False, True):
            theirs = llamacpp.tokenize(real_gemma, texts, add_bos=True, special=special).value
            assert [tok(t, split_special_tokens=not special)["input_ids"] for t in texts] == theirs
    _same_as_transformers(tok, load_gguf_tokenizer(real_gemma), _texts(2) + [CHAT])


def _vocab_file(path: Path, tokens, scores, types, name: str = "t", **keys) -> Path:
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(name)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    for key, value in keys.items():
        getattr(w, f"add_{key}")(value)
    w.add_tensor("w", np.ones((2, 32), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


BYTES = [f"<0x{b:02X}>" for b in range(256)]


def _tiny(tmp_path, extra, name="t", **keys) -> SpmTokenizer:
    """<unk> <s> </s>, the 256 byte tokens, then ``extra`` (token, score, type)."""
    tokens = ["<unk>", "<s>", "</s>"] + BYTES + [t for t, _, _ in extra]
    scores = [0.0] * (3 + 256) + [s for _, s, _ in extra]
    types = [2, 3, 3] + [6] * 256 + [k for _, _, k in extra]
    return load_spm_tokenizer(_vocab_file(tmp_path / f"{name}.gguf", tokens, scores, types, name=name, **keys))


def test_the_pair_with_the_highest_score_merges_first_and_ties_go_left(tmp_path):
    base = 259
    tok = _tiny(tmp_path, [("▁", 0.0, 1), ("a", 0.0, 1), ("b", 0.0, 1), ("ab", -1.0, 1), ("ba", -2.0, 1),
                           ("aba", -3.0, 1), ("▁a", -5.0, 1)])
    ba, aba = base + 4, base + 5
    # "▁aba": ab (-1) beats ba (-2) and ▁a (-5); then ▁ + ab has no token, ab + a... "aba" is not a
    # pair of current symbols until ab exists: ab|a -> aba (-3)
    assert tok("aba", add_special_tokens=False)["input_ids"] == [base, aba]
    assert tok("ba", add_special_tokens=False)["input_ids"] == [base, ba]
    # equal scores: the leftmost pair first
    tie = _tiny(tmp_path, [("▁", 0.0, 1), ("x", 0.0, 1), ("xx", -1.0, 1)], name="tie")
    assert tie("xxx", add_special_tokens=False)["input_ids"] == [base, base + 2, base + 1]


def test_unknown_characters_become_byte_tokens_and_bos_leads(tmp_path):
    tok = _tiny(tmp_path, [("▁", 0.0, 1), ("h", 0.0, 1)])
    ids = tok("hé")["input_ids"]
    assert ids == [1, 259, 260, 3 + 0xC3, 3 + 0xA9]  # BOS, ▁ (space prefix), h, é as its two bytes
    assert tok.decode(ids, skip_special_tokens=True) == "hé"
    assert tok("")["input_ids"] == [1] and tok("", add_special_tokens=False)["input_ids"] == []


def test_a_vocabulary_without_a_byte_token_says_so(tmp_path):
    tokens, scores, types = ["<unk>", "<s>", "</s>", "▁", "h"], [0.0] * 5, [2, 3, 3, 1, 1]
    tok = load_spm_tokenizer(_vocab_file(tmp_path / "nobytes.gguf", tokens, scores, types))
    with pytest.raises(InvalidModelError, match="no token for byte 0xC3"):
        tok("hé")


def test_special_tokens_split_the_text_and_user_defined_ones_always_match(tmp_path):
    tok = _tiny(tmp_path, [("▁", 0.0, 1), ("x", 0.0, 1), ("<ctl>", 0.0, 3), ("  ", 0.0, 4)],
                add_space_prefix=False)
    ctl, spaces, x, sp = 261, 262, 260, 259
    assert tok("x<ctl>x", add_special_tokens=False)["input_ids"] == [x, ctl, x]
    # not parsing special tokens: the control token is text, the user-defined one still whole
    plain = tok("x<ctl>  x", add_special_tokens=False, split_special_tokens=True)["input_ids"]
    assert ctl not in plain and spaces in plain and plain[-1] == x
    assert tok("x  x", add_special_tokens=False)["input_ids"] == [x, spaces, x]
    assert tok("x x", add_special_tokens=False)["input_ids"] == [x, sp, x]


def test_phi3_control_tokens_strip_the_whitespace_after_them(tmp_path):
    extra = [("▁", 0.0, 1), ("x", 0.0, 1), ("<|end|>", 0.0, 3)]
    phi = _tiny(tmp_path, extra, name="Phi-3 mini")
    other = _tiny(tmp_path, extra, name="other")
    end = 261
    assert phi("<|end|>\n x", add_special_tokens=False)["input_ids"] == [end, 259, 260]
    assert other("<|end|>\n x", add_special_tokens=False)["input_ids"][:2] == [end, 259]
    assert len(other("<|end|>\n x", add_special_tokens=False)["input_ids"]) > 3  # the newline kept


def test_a_byte_level_vocabulary_is_not_taken(tmp_path):
    path = REFERENCE / "qwen2.llamacpp.f16.gguf"
    assert load_spm_tokenizer(path) is None


def test_the_runtime_loads_an_spm_vocabulary_without_transformers(tmp_path):
    path = REFERENCE / "gemma2.llamacpp.f16.gguf"
    code = ("import sys; from runtime.generate import load_tokenizer; from pathlib import Path; "
            "t = load_tokenizer(Path(sys.argv[1])); print(type(t).__name__, 'transformers' in sys.modules, "
            "t('Hi there')['input_ids'])")
    root = Path(__file__).resolve().parents[3]
    out = subprocess.run([sys.executable, "-c", code, str(path)], check=False, cwd=root, capture_output=True, text=True,
                         env={**__import__("os").environ, "AIOS_CACHE": str(tmp_path)})
    assert out.returncode == 0, out.stderr[-2000:]
    name, imported, ids = out.stdout.split(" ", 2)
    assert (name, imported) == ("SpmTokenizer", "False")
    assert eval(ids) == load_spm_tokenizer(path)("Hi there")["input_ids"]


TURNS = [[{"role": "user", "content": "Hi there"}],
         [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
          {"role": "assistant", "content": "4"}, {"role": "user", "content": "And 3+3?"}]]
TEMPLATE = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('no system') }}"
            "{% endif %}<t>{{ m['role'] }}\n{{ m['content'] | trim }}</t>\n{% endfor %}"
            "{% if add_generation_prompt %}<t>model\n{% endif %}{{ eos_token | tojson }}")


def test_a_chat_renders_as_transformers_renders_it_without_its_tokenizer(tmp_path):
    """``generate --chat``'s call (one conversation to text) on the file's own template: the same
    text as transformers' tokenizer of the file, template errors as its errors, and the
    transformers tokenizer never built; any other call is handed to it."""
    tok = _tiny(tmp_path, [("▁a", -1.0, 1)], chat_template=TEMPLATE, bos_token_id=1, eos_token_id=2)
    ref = load_gguf_tokenizer(tok._path)
    for gen in (False, True):
        got = tok.apply_chat_template(TURNS[0], add_generation_prompt=gen, tokenize=False)
        assert got == ref.apply_chat_template(TURNS[0], add_generation_prompt=gen, tokenize=False)
        assert got.startswith("<s><t>user\nHi there</t>\n") and got.endswith('"</s>"')
    with pytest.raises(Exception, match="no system"):
        tok.apply_chat_template(TURNS[1], tokenize=False)
    other = "{% for m in messages %}[{{ m['content'] }}]{% endfor %}"
    assert tok.apply_chat_template(TURNS[1], chat_template=other, tokenize=False) == "[Be brief.][2+2?][4][And 3+3?]"
    assert tok._full is None
    assert tok.apply_chat_template(TURNS[0], chat_template=other) == ref.apply_chat_template(TURNS[0], chat_template=other)


@pytest.mark.real_model
def test_the_real_gemmas_chat_renders_as_transformers(real_gemma):
    """GGUF-my-repo's file carries no tokenizer.chat_template (--chat needs --chat-template there):
    a Gemma-style template given as ``chat_template``, with the file's own <bos>."""
    gemma = ("{{ bos_token }}{% for m in messages %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' "
             "else m['role'] }}\n{{ m['content'] | trim }}<end_of_turn>\n{% endfor %}"
             "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")
    tok = load_spm_tokenizer(real_gemma)
    ref = load_gguf_tokenizer(real_gemma)
    assert tok.chat_template is None is ref.chat_template
    for turns in TURNS:
        for gen in (False, True):
            got = tok.apply_chat_template(turns, chat_template=gemma, add_generation_prompt=gen, tokenize=False)
            assert got == ref.apply_chat_template(turns, chat_template=gemma, add_generation_prompt=gen,
                                                  tokenize=False)
            assert got.startswith("<bos><start_of_turn>")
    assert tok._full is None
