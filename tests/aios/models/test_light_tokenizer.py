"""The light GGUF tokenizer (aios.models.light_tokenizer) is the transformers one, without transformers.

``aios-run generate`` loads the GGUF's tokenizer from the cache ``aios.models.gguf_tokenizer``
writes; the light load reads that entry with ``tokenizers`` alone. On llama.cpp's conversions of
tiny models (SentencePiece vocabularies: Gemma 2, Phi-3 with its rstrip chat tokens; byte-level
BPE: Falcon, Llama 3, Qwen2, ...) it must give the transformers tokenizer's ids (with and without
the model's special tokens, special tokens written as text, unicode, whitespace runs, the empty
string) and text (with and without the special tokens; with transformers' clean-up of spaces when
a tokenizer asks for it), read no GGUF and import no transformers; a GGUF not yet cached builds
and caches as before, and what it does not mirror (chat templates to ids, batches) is transformers'.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from aios.models import gguf_tokenizer
from aios.models.gguf_tokenizer import load_gguf_tokenizer
from aios.models.light_tokenizer import LIGHT_CLASSES, LightTokenizer, load_gguf_tokenizer_light

ROOT = Path(__file__).resolve().parents[3]
REFERENCE = ROOT / "tests" / "runtime" / "data" / "reference"
SENTENCEPIECE = ["gemma2", "phi3"]
BYTE_LEVEL = ["falcon", "llama3", "qwen2", "gemma3", "mistral"]
TEXTS = [
    "",
    "Hello world",
    "The list type supports slicing and item assignment.",
    "don't 12345 x+=1; I'M SURE we'll see 3.14159 and 1000000 or 42nd",
    "def add(a, b):\n    return a + b  # they've said it's fine\n",
    "x  y   z\n\n\n  w \t\ttab\r\nend   ",
    "a" + " " * 33 + "b" + "\t" * 40 + "c" + "\n" * 35,
    "   ",
    "naïve café ☃ 日本語のテキスト 😀 Ωμέγα ١٢٣ 12😀34 a\u00a0b\u200bc",
    "Hello , world . Isn 't it ? the theme of the other",
    # special tokens written as text (each vocabulary has some of them)
    "<bos><start_of_turn>user\nHi  there<end_of_turn>\n<start_of_turn>model\n<eos>",
    "<|user|>\nHi<|end|>\n<|assistant|>\nHello<|end|><|endoftext|>",
    "a</s>\n b<|endoftext|> c<s> <unk><pad>",
]
TEMPLATE = ("{{ bos_token }}{% for m in messages %}<turn>{{ m['role'] }}\n{{ m['content'] | trim }}</turn>\n"
            "{% endfor %}{% if add_generation_prompt %}<turn>model\n{% endif %}")


@pytest.fixture
def tokenizer_cache(monkeypatch, tmp_path):
    """Loads cache under tmp_path (a subprocess inherits it), never in ~/.cache/aios."""
    monkeypatch.setenv("AIOS_CACHE", str(tmp_path / "aios-cache"))
    return tmp_path / "aios-cache" / "tokenizers"


def _no_builds(monkeypatch) -> None:
    def refuse(path):
        raise AssertionError("the tokenizer was built from the GGUF, not read from the cache")

    monkeypatch.setattr(gguf_tokenizer, "_build", refuse)


def _assert_same(light, full, texts) -> None:
    """``light`` answers what the runtime asks of a tokenizer exactly as ``full`` does."""
    for name in ("bos_token", "eos_token", "pad_token", "unk_token", "sep_token", "cls_token", "mask_token",
                 "bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id", "all_special_tokens",
                 "all_special_ids", "special_tokens_map", "extra_special_tokens", "extra_special_tokens_ids",
                 "chat_template", "add_bos_token", "add_eos_token", "vocab_size", "clean_up_tokenization_spaces",
                 "padding_side", "model_max_length", "name_or_path"):
        assert getattr(light, name) == getattr(full, name), name
    assert len(light) == len(full) and light.get_vocab() == full.get_vocab()
    vocab = full.get_vocab()
    probe = ["<end_of_turn>", "<|eot_id|>", "<|end|>", "</s>", "no such token", *list(vocab)[:50]]
    assert light.convert_tokens_to_ids(probe) == full.convert_tokens_to_ids(probe)
    for text in texts:
        for kw in ({}, {"add_special_tokens": False}, {"split_special_tokens": True},
                   {"add_special_tokens": False, "verbose": False}):
            got, want = light(text, **kw), full(text, **kw)
            assert got["input_ids"] == want["input_ids"], (text, kw)
            assert got["attention_mask"] == want["attention_mask"], (text, kw)
            assert light.encode(text, **kw) == full.encode(text, **kw), (text, kw)
        for ids in (full(text)["input_ids"], full(text, add_special_tokens=False)["input_ids"],
                    full(text, split_special_tokens=True)["input_ids"]):
            for skip in (False, True):
                assert light.decode(ids, skip_special_tokens=skip) == full.decode(ids, skip_special_tokens=skip), (text, skip)
                assert light.convert_ids_to_tokens(ids, skip_special_tokens=skip) == full.convert_ids_to_tokens(
                    ids, skip_special_tokens=skip)
            assert light.decode(np.array(ids, dtype=np.int64)) == full.decode(np.array(ids, dtype=np.int64))
            if ids:
                assert light.decode(ids[0]) == full.decode(ids[0])
                assert light.convert_ids_to_tokens(ids[0]) == full.convert_ids_to_tokens(ids[0])
    ids = [full(t)["input_ids"] for t in texts[1:4]]
    assert light.decode(ids) == full.decode(ids) and light.batch_decode(ids) == full.batch_decode(ids)


@pytest.mark.parametrize("name", SENTENCEPIECE + BYTE_LEVEL)
def test_a_cached_tokenizer_loads_light_and_tokenizes_as_the_transformers_one(name, monkeypatch, tokenizer_cache):
    path = REFERENCE / f"{name}.llamacpp.f16.gguf"
    full = load_gguf_tokenizer(path)  # builds and caches
    with pytest.MonkeyPatch.context() as mp:
        _no_builds(mp)
        light = load_gguf_tokenizer_light(path)
    assert isinstance(light, LightTokenizer) and light._full is None  # read from the entry alone
    _assert_same(light, full, TEXTS)
    if name == "phi3":  # the rstrip of Phi-3's chat tokens comes back with the backend
        assert light("<|user|>\nHi")["input_ids"] == light("<|user|>Hi")["input_ids"]


@pytest.mark.parametrize("name", ["phi3", "llama3"])
def test_an_uncached_gguf_builds_caches_and_gives_the_light_view(name, monkeypatch, tokenizer_cache):
    path = REFERENCE / f"{name}.llamacpp.f16.gguf"
    cold = load_gguf_tokenizer_light(path)
    assert isinstance(cold, LightTokenizer) and cold._full is not None
    assert len(list(tokenizer_cache.glob("*.pkl"))) == 1
    with pytest.MonkeyPatch.context() as mp:
        _no_builds(mp)
        warm = load_gguf_tokenizer_light(path)
        full = load_gguf_tokenizer(path)
    assert warm._full is None
    _assert_same(cold, full, TEXTS)
    _assert_same(warm, full, TEXTS)


@pytest.mark.parametrize("damage", ["truncated", "other class"])
def test_an_entry_the_light_load_cannot_read_goes_the_full_way(damage, monkeypatch, tokenizer_cache):
    import pickle

    path = REFERENCE / "gemma2.llamacpp.f16.gguf"
    want = load_gguf_tokenizer(path)(TEXTS[10])["input_ids"]
    (entry,) = tokenizer_cache.glob("*.pkl")
    data = entry.read_bytes()
    if damage == "truncated":  # rebuilt and replaced, as the full load does
        entry.write_bytes(data[: len(data) // 2])
        tok = load_gguf_tokenizer_light(path)
        assert isinstance(tok, LightTokenizer)
    else:  # a class not known to encode and decode as TokenizersBackend: the transformers object
        other = pickle.loads(data)
        other["class"] = ("transformers.models.t5.tokenization_t5", "T5Tokenizer")
        entry.write_bytes(pickle.dumps(other))
        tok = load_gguf_tokenizer_light(path)
        assert not isinstance(tok, LightTokenizer)
    assert tok(TEXTS[10])["input_ids"] == want


@pytest.mark.parametrize("name", ["gemma2", "qwen2"])
def test_what_is_not_mirrored_is_the_transformers_tokenizers(name, tokenizer_cache):
    """A chat rendered to text is transformers' renderer's text without its tokenizer (aios-run
    generate --chat); batches are the transformers tokenizer's."""
    path = REFERENCE / f"{name}.llamacpp.f16.gguf"
    full = load_gguf_tokenizer(path)
    light = load_gguf_tokenizer_light(path)
    messages = [{"role": "user", "content": "  Hi 123 "}, {"role": "assistant", "content": "x"},
                {"role": "user", "content": "y"}]
    kw = {"chat_template": TEMPLATE, "add_generation_prompt": True, "tokenize": False}
    assert light.apply_chat_template(messages, **kw) == full.apply_chat_template(messages, **kw)
    assert light.__dict__.get("_full") is None
    assert light(TEXTS[1:4], padding=True)["input_ids"] == full(TEXTS[1:4], padding=True)["input_ids"]
    assert light.added_tokens_decoder.keys() == full.added_tokens_decoder.keys()


def test_decode_cleans_up_spaces_as_transformers_does():
    """clean_up_tokenization_spaces (off in every GGUF tokenizer transformers builds today):
    applied to a WordLevel model, ignored for BPE unless the tokenizer insists."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<unk>", "<s>", "Hello", ",", "world", ".", "Isn", "'t", "it", "?", "'s", "n't", "'", "do"]
    text = "Hello , world . Isn 't it ? do n't ' it 's"
    for model in (models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"),
                  models.BPE({w: i for i, w in enumerate(words)}, [], unk_token="<unk>")):
        backend = Tokenizer(model)
        backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        backend.decoder = decoders.WordPiece() if isinstance(model, models.WordLevel) else None
        for force in (False, True):
            full = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", bos_token="<s>",
                                           clean_up_tokenization_spaces=True,
                                           clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output=force)
            state = {k: v for k, v in vars(full).items() if k != "_tokenizer"}
            light = LightTokenizer(Tokenizer.from_str(full.backend_tokenizer.to_str()), state, Path("x.gguf"))
            ids = full(text)["input_ids"]
            assert light(text)["input_ids"] == ids
            for kw in ({}, {"clean_up_tokenization_spaces": False}, {"skip_special_tokens": True}):
                assert light.decode(ids, **kw) == full.decode(ids, **kw), (type(model).__name__, force, kw)
    assert full.decode(ids) != full.decode(ids, clean_up_tokenization_spaces=False)  # the clean-up ran


def test_the_light_classes_encode_and_decode_as_tokenizers_backend():
    """A LightTokenizer stands in for these classes because they take their encode / decode /
    vocabulary / special-token methods from TokenizersBackend (and its base) unchanged."""
    import importlib

    from transformers import PreTrainedTokenizerBase
    from transformers.tokenization_utils_tokenizers import TokenizersBackend

    mirrored = ("__call__", "_encode_plus", "encode", "decode", "_decode", "batch_decode", "convert_ids_to_tokens",
                "convert_tokens_to_ids", "_convert_token_to_id_with_added_voc", "get_vocab", "__len__",
                "clean_up_tokenization", "set_truncation_and_padding", "_convert_encoding", "__getattr__",
                "all_special_tokens", "all_special_ids", "special_tokens_map", "vocab_size", "add_bos_token")
    for module, qualname in LIGHT_CLASSES:
        cls = getattr(importlib.import_module(module), qualname)
        assert issubclass(cls, TokenizersBackend)
        for attr in mirrored:
            owner = next(c for c in cls.__mro__ if attr in vars(c))
            assert owner in (TokenizersBackend, PreTrainedTokenizerBase), (qualname, attr, owner)


def test_a_cached_load_imports_no_transformers(tokenizer_cache):
    path = REFERENCE / "phi3.llamacpp.f16.gguf"
    full = load_gguf_tokenizer(path)
    text = "<|user|>\nHi 123 naïve<|end|>"
    code = ("import json, sys; from aios.models.light_tokenizer import load_gguf_tokenizer_light; "
            "from pathlib import Path; tok = load_gguf_tokenizer_light(Path(sys.argv[1])); ids = tok(sys.argv[2])['input_ids']; "
            "print(json.dumps([type(tok).__name__, ids, tok.decode(ids, skip_special_tokens=True), tok.eos_token_id, "
            "'transformers' in sys.modules, 'torch' in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code, str(path), text], check=False, cwd=ROOT, capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    name, ids, back, eos, transformers, torch = json.loads(out.stdout.splitlines()[-1])
    assert name == "LightTokenizer" and not transformers and not torch
    want = full(text)["input_ids"]
    assert ids == want and back == full.decode(want, skip_special_tokens=True) and eos == full.eos_token_id


@pytest.mark.real_model
def test_real_gemma_light_tokenizer_is_the_transformers_one(real_gemma):
    """The real Gemma 3 270M's 262,144-token vocabulary (its entry in the user's cache)."""
    full = load_gguf_tokenizer(real_gemma)
    light = load_gguf_tokenizer_light(real_gemma)
    assert isinstance(light, LightTokenizer)
    texts = TEXTS + ["The capital of France is", "Привет, мир! مرحبا 🌍 <table><caption>x</caption></table>"]
    for text in texts:
        for kw in ({}, {"add_special_tokens": False}):
            ids = full(text, **kw)["input_ids"]
            assert light(text, **kw)["input_ids"] == ids, (text, kw)
            for skip in (False, True):
                assert light.decode(ids, skip_special_tokens=skip) == full.decode(ids, skip_special_tokens=skip)
    for name in ("bos_token_id", "eos_token_id", "pad_token_id", "all_special_ids", "chat_template"):
        assert getattr(light, name) == getattr(full, name), name
    assert light.get_vocab() == full.get_vocab()
