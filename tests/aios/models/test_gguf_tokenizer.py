"""Byte-level BPE vocabularies of Llama 3 and Qwen2 in a GGUF tokenize as the model's tokenizer and llama.cpp.

A GGUF of these families stores ``tokenizer.ggml.model = "gpt2"`` and names its pre-tokenizer
(``tokenizer.ggml.pre``: ``"llama-bpe"``, ``"qwen2"``); the regex itself is in no key: llama.cpp
looks it up by that name (``llama-vocab.cpp``), and so must the tokenizer aios-run loads from the
file (``aios.models.gguf_tokenizer``). Llama 3's regex splits digits in runs of up to three,
Qwen2's one by one, so a file read with the wrong one (or GPT-2's default) tokenizes numbers,
contractions and runs of whitespace differently from the model's own tokenizer.

The tokenizers here are built offline in a second with ``tokenizers``, shaped as the released
``tokenizer.json`` files are (Split with the family's exact regex then ByteLevel without its own
regex, ByteLevel decoder; Llama 3: ``ignore_merges``, BOS added by a template; Qwen2: NFC
normalizer, no BOS), trained on ``pydoc_data.topics``, with the family's special tokens after the
trained vocabulary (Llama 3's ``<|begin_of_text|>`` ... ``<|eot_id|>``; Qwen2.5's ``<|endoftext|>``,
``<|im_start|>``, ``<|im_end|>`` and its non-special ``<tool_call>`` / FIM tokens). Each is put
on a tiny random model of its architecture and exported by ``aios-convert gguf``; the tokenizer
loaded from the GGUF must give the ids of the HF folder's tokenizer and of llama.cpp on the same
file (when llama-cpp-python is installed), and decode them back to the text.

The finished tokenizer is cached (``$AIOS_CACHE/tokenizers``, here always under ``tmp_path``): a
second load reads no GGUF and builds nothing, and gives the same object as the first (class,
backend JSON, special tokens and their rstrip, ids); a touched file, a damaged or hostile entry
and an unwritable cache all end in a correct tokenizer, rebuilt, never in an error.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path

import pytest

from aios.models import gguf_tokenizer
from aios.models.gguf_tokenizer import load_gguf_tokenizer
from aios.reference import llamacpp
from convert.gguf import GGUFExportConfig, export_gguf
from tests.conftest import build_hf_model

pytestmark = pytest.mark.usefixtures("one_thread")

# The Split regexes of the released tokenizer.json files (Meta-Llama-3-8B, Qwen2-7B).
LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
               r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                  "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|reserved_special_token_2|>",
                  "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"]
# Qwen2.5's added tokens: (content, special) in id order
QWEN2_ADDED = [("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
               ("<tool_call>", False), ("</tool_call>", False), ("<|fim_prefix|>", False),
               ("<|fim_middle|>", False), ("<|fim_suffix|>", False)]
LLAMA3_TEMPLATE = ("{{ bos_token }}{% for m in messages %}{{ '<|start_header_id|>' + m['role'] + "
                   "'<|end_header_id|>\n\n' + m['content'] | trim + '<|eot_id|>' }}{% endfor %}"
                   "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
QWEN2_TEMPLATE = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>' + '\n' }}"
                  "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
# family -> (tests.conftest model kind, llama.cpp pre-tokenizer name, trained vocabulary size)
FAMILIES = {"llama3": ("llama", "llama-bpe", 1000), "qwen2": ("qwen2", "qwen2", 1000)}

TEXTS = [
    "Hello world",
    "The list type supports slicing and item assignment.",
    "don't 12345 x+=1; I'M SURE we'll see 3.14159 and 1000000 or 42nd",
    "def add(a, b):\n    return a + b  # they've said it's fine\n",
    "x  y   z\n\n\n  w \t\ttab\r\nend   ",
    "  leading spaces and trailing newline\n",
    "naïve café ☃ 日本語のテキスト 😀 Ωμέγα ١٢٣ 12😀34",
    "'s 'S 'tis O'Neil's 'VE",
    "Hello , world . Isn 't it ? the theme of the other",
]
CHATS = {
    "llama3": ["<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi there, don't 123!<|eot_id|>"
               "<|start_header_id|>assistant<|end_header_id|>\n\n",
               "a<|eot_id|> b<|end_of_text|>\n<|python_tag|>x=1<|eom_id|>"],
    "qwen2": ["<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi 2024!<|im_end|>\n"
              "<|im_start|>assistant\n",
              "x<|endoftext|> <tool_call>\n{\"a\": 1}\n</tool_call><|fim_prefix|>def f():<|fim_suffix|>"],
}


def build_tokenizer(family: str, folder: Path, regex: str | None = None) -> None:
    """A byte-level BPE tokenizer shaped as ``family``'s (regex: override its Split regex)."""
    from pydoc_data.topics import topics
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    llama3 = family == "llama3"
    tok = Tokenizer(models.BPE(ignore_merges=llama3))
    if not llama3:
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(regex or (LLAMA3_REGEX if llama3 else QWEN2_REGEX)), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    lines = [line for key in sorted(topics) for line in topics[key].splitlines() if line.strip()]
    trainer = trainers.BpeTrainer(vocab_size=FAMILIES[family][2], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(lines, trainer)
    if llama3:
        tok = _merges_do_not_rebuild_the(tok)
        tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in LLAMA3_SPECIAL])
        bos = LLAMA3_SPECIAL[0]
        tok.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 {bos}:1 $B:1",
                                          special_tokens=[(bos, tok.token_to_id(bos))])])
        hf = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=bos, eos_token="<|eot_id|>",
                                     chat_template=LLAMA3_TEMPLATE, clean_up_tokenization_spaces=False)
    else:
        for content, special in QWEN2_ADDED:  # in id order, each special or not as in Qwen2.5
            (tok.add_special_tokens if special else tok.add_tokens)(
                [AddedToken(content, normalized=False, special=special)])
        hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                     additional_special_tokens=["<|im_start|>", "<|im_end|>"],
                                     chat_template=QWEN2_TEMPLATE, clean_up_tokenization_spaces=False)
    hf.save_pretrained(str(folder))


def _merges_do_not_rebuild_the(tok):
    """``tok`` with its merge ``t h`` first: applied in rank order, the merges split " the" as
    ``Ġ th e`` though ``Ġthe`` is a token. Llama 3's vocabulary (tiktoken ranks) has such words,
    hence ``ignore_merges`` in its tokenizer.json and in llama.cpp for "llama-bpe": a word that is
    a token is that token, whatever the merges would make of it."""
    from tokenizers import Tokenizer

    spec = json.loads(tok.to_str())
    merges = spec["model"]["merges"]
    merges.insert(0, merges.pop(merges.index(["t", "h"])))
    spec["model"]["ignore_merges"] = False
    assert len(Tokenizer.from_str(json.dumps(spec)).encode(" the").ids) == 3
    spec["model"]["ignore_merges"] = True
    tok = Tokenizer.from_str(json.dumps(spec))
    assert len(tok.encode(" the").ids) == 1
    return tok


def build_gguf(family: str, folder: Path, regex: str | None = None) -> Path:
    """A tiny random model of ``family`` with its tokenizer, exported by aios-convert gguf to f16."""
    build_tokenizer(family, folder, regex)
    n = len(json.loads((folder / "tokenizer.json").read_text())["model"]["vocab"]) + 16
    # Qwen2 pads its embedding past the tokenizer (151936 rows for 151665 tokens): the file's extra
    # ids are [PAD..] tokens of type UNUSED. Llama 3's is exactly its tokenizer.
    build_hf_model(FAMILIES[family][0], folder, vocab_size=n if family == "llama3" else n + 48)
    # in a folder of its own: transformers would read a tokenizer.json next to it
    out = folder.parent / f"{folder.name}.gguf" / f"{family}.f16.gguf"
    out.parent.mkdir()
    export_gguf(str(folder), out, GGUFExportConfig("f16"))
    return out


@pytest.fixture(autouse=True)
def tokenizer_cache(monkeypatch, tmp_path):
    """Every load in this module caches under tmp_path (a subprocess inherits it), never in ~/.cache/aios."""
    monkeypatch.setenv("AIOS_CACHE", str(tmp_path / "aios-cache"))
    return tmp_path / "aios-cache" / "tokenizers"


@pytest.fixture(scope="module", params=list(FAMILIES))
def family_gguf(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    return request.param, folder, build_gguf(request.param, folder)


def test_the_file_names_the_familys_pre_tokenizer_and_types_its_special_tokens_control(family_gguf):
    from aios.models.tensors import gguf_reader

    family, folder, path = family_gguf
    reader = gguf_reader(path)
    field = lambda key: reader.get_field(key).contents()  # noqa: E731
    assert field("tokenizer.ggml.model") == "gpt2"
    assert field("tokenizer.ggml.pre") == FAMILIES[family][1]
    tokens, types = field("tokenizer.ggml.tokens"), field("tokenizer.ggml.token_type")
    # CONTROL (3): the special tokens, and as llama.cpp's converter types them, the <|...|> ones
    # Qwen2.5 calls not special (its FIM tokens); <tool_call> stays USER_DEFINED (4)
    added = [(t, True) for t in LLAMA3_SPECIAL] if family == "llama3" else QWEN2_ADDED
    assert [types[tokens.index(t)] for t, _ in added] == [3 if s or t.startswith("<|") else 4 for t, s in added]
    if family == "llama3":
        assert tokens[field("tokenizer.ggml.bos_token_id")] == "<|begin_of_text|>"
        assert tokens[field("tokenizer.ggml.eos_token_id")] == "<|eot_id|>"
    else:
        assert reader.get_field("tokenizer.ggml.bos_token_id") is None or not field("tokenizer.ggml.add_bos_token")
        assert tokens[field("tokenizer.ggml.eos_token_id")] == "<|im_end|>"


def test_byte_level_vocabulary_of_the_file_tokenizes_as_the_models_tokenizer_and_llama_cpp(family_gguf):
    from transformers import AutoTokenizer

    family, folder, path = family_gguf
    hf = AutoTokenizer.from_pretrained(str(folder))
    tok = load_gguf_tokenizer(path)
    texts = TEXTS + CHATS[family]
    ours = [tok(text, add_special_tokens=False)["input_ids"] for text in texts]
    if llamacpp.available():  # llama.cpp reads the same vocabulary from the file
        theirs = llamacpp.tokenize(path, texts, add_bos=False, special=True).value
        back = llamacpp.detokenize(path, ours, special=True).value
    for i, (text, ids) in enumerate(zip(texts, ours, strict=True)):
        assert ids == hf(text, add_special_tokens=False)["input_ids"], text
        if llamacpp.available():
            assert ids == theirs[i], text
            assert back[i] == text.encode()
        assert tok.decode(ids) == text
        # with the special tokens the model adds: BOS for Llama 3, nothing for Qwen2
        full = tok(text)["input_ids"]
        assert full == hf(text)["input_ids"], text
        assert full == ([hf.bos_token_id] if family == "llama3" else []) + ids
    assert any(len(tok(t, add_special_tokens=False)["input_ids"]) < len(t.encode()) for t in TEXTS)  # merges used
    for chat in CHATS[family]:  # the chat tokens stay whole: one id each
        pieces = [t for t in hf.all_special_tokens if t in chat]
        assert pieces and all(tok.convert_tokens_to_ids(t) in tok(chat)["input_ids"] for t in pieces)
    messages = [{"role": "user", "content": "Hi 123"}, {"role": "assistant", "content": "don't"}]
    assert tok.apply_chat_template(messages, tokenize=False) == hf.apply_chat_template(messages, tokenize=False)


@pytest.mark.parametrize("family_gguf", ["llama3"], indirect=True)  # one process start (~4 s) is enough
def test_a_process_that_has_opened_no_gguf_loads_the_tokenizer(family_gguf):
    """load_gguf_tokenizer as the first GGUF read of a process (it raised TypeError there)."""
    import subprocess
    import sys

    family, folder, path = family_gguf
    code = ("import sys; from aios.models.gguf_tokenizer import load_gguf_tokenizer; "
            "print(load_gguf_tokenizer(sys.argv[1])(sys.argv[2], add_special_tokens=False)['input_ids'])")
    root = Path(__file__).resolve().parents[3]
    out = subprocess.run([sys.executable, "-c", code, str(path), "don't 12345"], cwd=root, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() and json.loads(out.stdout) == load_gguf_tokenizer(path)(
        "don't 12345", add_special_tokens=False)["input_ids"]


# mixed text beside the held-out prose: code, whitespace runs, scripts, emoji, chat markup
MIXED = ["def f(x):\n\treturn  x**2  # 平方\n\n\n    if x:\n\t\t\tpass\n", "Größe 日本語 naïve  two  spaces\nnew line",
         "Привет, мир! مرحبا بالعالم 🌍🚀 ελληνικά हिन्दी", "a" + " " * 33 + "b" + "\t" * 40 + "c" + "\n" * 35,
         "    leading and trailing   ", "a\u00a0b\u200bc\r\n", "<table><caption>x</caption></table>", "x" * 300]
CHAT = "<start_of_turn>user\nHi  there<end_of_turn>\n<start_of_turn>model\n"


@pytest.mark.real_model
def test_real_gemma_vocabulary_tokenizes_as_llama_cpp(real_gemma):
    """The real Gemma 3 270M's 262,144-token SentencePiece vocabulary, read from the GGUF, gives
    llama.cpp's ids on > 20 kB of held-out prose and mixed text, with and without special tokens
    (its 165 user-defined tokens, whitespace runs among them, matched whole as llama.cpp does)."""
    import pydoc_data.topics

    topics = list(pydoc_data.topics.topics.values())
    texts = topics[:12] + MIXED
    assert sum(len(t.encode()) for t in texts) > 20_000
    tok = load_gguf_tokenizer(real_gemma)
    with pytest.MonkeyPatch.context() as mp:  # and as the cache gives it back, reading no GGUF
        _refuse_builds(mp)
        cached = load_gguf_tokenizer(real_gemma)
    for special in (False, True):
        batch = texts + [CHAT] if special else texts
        theirs = llamacpp.tokenize(real_gemma, batch, add_bos=True, special=special).value
        for text, ids in zip(batch, theirs, strict=True):
            assert tok(text, split_special_tokens=not special)["input_ids"] == ids, text[:80]
            assert cached(text, split_special_tokens=not special)["input_ids"] == ids, text[:80]


# --- the cache ------------------------------------------------------------------------------
# llama.cpp's own conversions of tiny Gemma 2 and Phi-3 models: SentencePiece vocabularies, Phi-3's
# with its chat tokens' rstrip (tests/runtime/test_reference_ggufs.py)
REFERENCE = Path(__file__).resolve().parents[2] / "runtime" / "data" / "reference"
SPM_TEXTS = {"gemma2": ["<start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n", "<eos>x<end_of_turn> y"],
             "phi3": ["<|user|>\nHi<|end|>\n<|assistant|>\nHello<|end|><|endoftext|>", "<|system|>Be brief.<|end|>",
                      "a</s>\n b<|endoftext|> c"]}


def _refuse_builds(monkeypatch) -> None:
    """From here on, any GGUF parse or transformers GGUF conversion raises."""
    import gguf.gguf_reader
    from transformers import AutoTokenizer

    from aios.models import tensors

    def refuse(*args, **kwargs):
        raise AssertionError("the tokenizer was built from the GGUF, not read from the cache")

    monkeypatch.setattr(tensors, "gguf_reader", refuse)
    monkeypatch.setattr(gguf.gguf_reader.GGUFReader, "__init__", refuse)
    monkeypatch.setattr(AutoTokenizer, "from_pretrained", refuse)


def _count_builds(monkeypatch) -> list:
    builds = []
    build = gguf_tokenizer._build

    def counted(path):
        builds.append(path)
        return build(path)

    monkeypatch.setattr(gguf_tokenizer, "_build", counted)
    return builds


def _assert_same_tokenizer(warm, cold, texts) -> None:
    assert type(warm) is type(cold)
    assert warm.backend_tokenizer.to_str() == cold.backend_tokenizer.to_str()  # ignore_merges, added tokens
    assert warm.backend_tokenizer.encode_special_tokens == cold.backend_tokenizer.encode_special_tokens
    assert {i: repr(t) for i, t in warm.added_tokens_decoder.items()} == {
        i: repr(t) for i, t in cold.added_tokens_decoder.items()}  # rstrip, normalized, special
    for name in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id", "all_special_tokens",
                 "all_special_ids", "chat_template", "padding_side", "model_max_length", "name_or_path"):
        assert getattr(warm, name) == getattr(cold, name), name
    assert len(warm) == len(cold) and warm.get_vocab() == cold.get_vocab()
    for text in texts:
        for kw in ({}, {"add_special_tokens": False}, {"split_special_tokens": True}):
            assert warm(text, **kw)["input_ids"] == cold(text, **kw)["input_ids"], (text, kw)
        ids = cold(text)["input_ids"]
        assert warm.decode(ids) == cold.decode(ids) and warm.convert_ids_to_tokens(ids) == cold.convert_ids_to_tokens(ids)
    if cold.pad_token is not None:  # a batch pads on the same side with the same id
        batch = warm(texts, padding=True)
        assert batch["input_ids"] == cold(texts, padding=True)["input_ids"] and batch["attention_mask"]
    if cold.chat_template:
        messages = [{"role": "user", "content": "Hi 123"}, {"role": "assistant", "content": "don't"}]
        assert warm.apply_chat_template(messages, tokenize=False) == cold.apply_chat_template(messages, tokenize=False)


def _cached_load(path: Path, texts, monkeypatch, tokenizer_cache):
    """Load twice: the first builds and writes one entry, the second builds nothing and equals it."""
    builds = _count_builds(monkeypatch)
    cold = load_gguf_tokenizer(path)
    assert len(builds) == 1 and len(list(tokenizer_cache.glob("*.pkl"))) == 1
    with pytest.MonkeyPatch.context() as mp:
        _refuse_builds(mp)
        warm = load_gguf_tokenizer(path)
    assert len(builds) == 1
    _assert_same_tokenizer(warm, cold, texts)
    return warm, cold


def test_the_second_load_comes_from_the_cache_and_tokenizes_the_same(family_gguf, monkeypatch, tokenizer_cache):
    family, _, path = family_gguf
    warm, cold = _cached_load(path, TEXTS + CHATS[family] + MIXED, monkeypatch, tokenizer_cache)
    assert warm.backend_tokenizer.model.ignore_merges == (family == "llama3")  # the fix-up survives
    saved = tokenizer_cache.parent / "saved"  # the cached object saves as the built one does
    warm.save_pretrained(str(saved))
    assert json.loads((saved / "tokenizer.json").read_text()) == json.loads(cold.backend_tokenizer.to_str())


@pytest.mark.parametrize("name", list(SPM_TEXTS))
def test_a_sentencepiece_vocabulary_comes_back_from_the_cache_with_its_chat_tokens(name, monkeypatch, tokenizer_cache):
    path = REFERENCE / f"{name}.llamacpp.f16.gguf"
    warm, _ = _cached_load(path, TEXTS + SPM_TEXTS[name] + MIXED, monkeypatch, tokenizer_cache)
    rstrip = sorted(str(t) for t in warm.added_tokens_decoder.values() if t.rstrip)
    if name == "phi3":  # Phi-3's chat tokens eat the newline after them, from the cache too
        assert "<|user|>" in rstrip and "<|endoftext|>" not in rstrip
        assert warm("<|user|>\nHi", add_special_tokens=False)["input_ids"] == warm(
            "<|user|>Hi", add_special_tokens=False)["input_ids"]
    else:
        assert not rstrip


def test_a_touched_file_is_read_again_and_replaces_its_entry(tmp_path, monkeypatch, tokenizer_cache):
    path = tmp_path / "phi3.gguf"
    shutil.copyfile(REFERENCE / "phi3.llamacpp.f16.gguf", path)
    builds = _count_builds(monkeypatch)
    load_gguf_tokenizer(path)
    (before,) = tokenizer_cache.glob("*.pkl")
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    tok = load_gguf_tokenizer(path)
    assert len(builds) == 2
    (after,) = tokenizer_cache.glob("*.pkl")  # the stale entry is gone
    assert after != before
    load_gguf_tokenizer(path)
    assert len(builds) == 2
    assert tok("<|user|>\nHi")["input_ids"] == load_gguf_tokenizer(REFERENCE / "phi3.llamacpp.f16.gguf")(
        "<|user|>\nHi")["input_ids"]


class _Payload:
    """Unpickling this runs ``exec`` (what an edited cache entry could try)."""

    def __init__(self, marker) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('pwned')",))


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty", "hostile", "other record"])
def test_a_damaged_cache_entry_is_rebuilt_without_an_error(damage, tmp_path, monkeypatch, tokenizer_cache):
    path = REFERENCE / "gemma2.llamacpp.f16.gguf"
    builds = _count_builds(monkeypatch)
    text = SPM_TEXTS["gemma2"][0] + TEXTS[2]
    want = load_gguf_tokenizer(path)(text)["input_ids"]
    (entry,) = tokenizer_cache.glob("*.pkl")
    data = entry.read_bytes()
    marker = tmp_path / "pwned"
    if damage == "truncated":
        entry.write_bytes(data[: len(data) // 2])
    elif damage == "garbage":
        entry.write_bytes(os.urandom(4096))
    elif damage == "empty":
        entry.write_bytes(b"")
    elif damage == "hostile":
        entry.write_bytes(pickle.dumps({"record": _Payload(marker)}))
    else:  # a well-formed entry of another file under this name
        other = pickle.loads(data)
        other["record"]["source"]["size"] += 1
        entry.write_bytes(pickle.dumps(other))
    assert load_gguf_tokenizer(path)(text)["input_ids"] == want
    assert len(builds) == 2 and not marker.exists()
    with pytest.MonkeyPatch.context() as mp:  # the rebuilt entry is whole again
        _refuse_builds(mp)
        assert load_gguf_tokenizer(path)(text)["input_ids"] == want


def test_a_cache_that_cannot_be_written_costs_only_time(tmp_path, monkeypatch):
    (tmp_path / "not-a-folder").write_text("")
    monkeypatch.setenv("AIOS_CACHE", str(tmp_path / "not-a-folder"))
    builds = _count_builds(monkeypatch)
    path = REFERENCE / "phi3.llamacpp.f16.gguf"
    assert load_gguf_tokenizer(path)("<|user|>\nHi")["input_ids"] == load_gguf_tokenizer(path)("<|user|>\nHi")["input_ids"]
    assert len(builds) == 2


def test_the_cache_lives_under_aios_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("AIOS_CACHE", str(tmp_path))
    assert gguf_tokenizer.cache_dir() == tmp_path / "tokenizers"
    monkeypatch.delenv("AIOS_CACHE")
    assert gguf_tokenizer.cache_dir() == Path.home() / ".cache" / "aios" / "tokenizers"
