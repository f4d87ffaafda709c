"""The tokenizer a GGUF stores, tokenizing as the model's own tokenizer and llama.cpp do.

transformers rebuilds it from the file's ``tokenizer.ggml.*`` keys (byte-level BPE, or a
SentencePiece vocabulary with its scores and token types). One property of Phi-3's tokenizer is
in no key: its chat tokens (``<|user|>``, ``<|assistant|>``, ``<|end|>``, ...) strip the
whitespace after them (``rstrip`` in Phi-3's ``tokenizer_config.json``), so ``"<|user|>\\nHi"``
is ``<|user|> ▁Hi``, not ``<|user|> ▁ \\n Hi``. llama.cpp restores it by name (``llama-vocab.cpp``:
every control token of a Phi-3 vocabulary but ``<unk>``, ``<s>`` and ``<|endoftext|>``, and
``</s>``); so do we, for a SentencePiece vocabulary of the phi3 architecture (Phi-3 and 3.5; Phi-4
rides on phi3 with a byte-level vocabulary, whose special tokens strip nothing).

A byte-level BPE vocabulary (``tokenizer.ggml.model = "gpt2"``) names its pre-tokenizer in
``tokenizer.ggml.pre``; transformers sets the split regex of the names llama.cpp knows, but not
the other property llama.cpp attaches to some names: ``ignore_merges`` (Llama 3's
``tokenizer.json`` has it too): a pre-tokenized word that is itself a token is that one token,
whatever its merges, applied in rank order, would make of it. Llama 3's vocabulary has words the
merges split otherwise, so without it ``" the"``-like words tokenize differently from llama.cpp
and the model's tokenizer. We set it for those names (``IGNORE_MERGES``).
"""

from __future__ import annotations

from pathlib import Path

PHI3_NO_RSTRIP = ("<unk>", "<s>", "<|endoftext|>")
SENTENCEPIECE = "llama"  # tokenizer.ggml.model of a SentencePiece vocabulary (llama.cpp's name)
CONTROL = 3  # gguf.TokenType.CONTROL
USER_DEFINED = 4  # gguf.TokenType.USER_DEFINED
BYTE_LEVEL = "gpt2"  # tokenizer.ggml.model of a byte-level BPE vocabulary (llama.cpp's name)
# tokenizer.ggml.pre names for which llama.cpp's llama_vocab::impl::load (src/llama-vocab.cpp,
# llama.cpp as vendored by llama-cpp-python 0.3.36) sets ignore_merges = true
IGNORE_MERGES = frozenset({
    "llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
    "jina-v5-nano", "minicpm5", "youtu", "glm4", "glm5", "tekken", "granite-embed-multi-97m"})


def load_gguf_tokenizer(path: str | Path):
    """The transformers tokenizer of the GGUF at ``path``."""
    from transformers import AutoTokenizer

    from aios.models.tensors import gguf_reader, transformers_reads_gguf_fast

    path = Path(path)
    reader = gguf_reader(path)
    with transformers_reads_gguf_fast():
        tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    _phi3_chat_tokens_rstrip(tok, path)
    _user_defined_tokens_whole(tok, reader)
    _ignore_merges(tok, reader)
    return tok


def _field(reader, key: str):
    f = reader.get_field(key)
    return None if f is None else f.contents()


def _phi3_chat_tokens_rstrip(tok, path: Path) -> None:
    from tokenizers import AddedToken

    from aios.models.architectures import ARCHITECTURES
    from aios.models.tensors import gguf_reader

    reader = gguf_reader(path)
    name = _field(reader, "general.architecture")
    rows = [a for a in ARCHITECTURES if a.gguf_arch.lower() == name]
    if not any(a.spm_control_tokens_rstrip for a in rows) or _field(reader, "tokenizer.ggml.model") != SENTENCEPIECE:
        return
    tokens = _field(reader, "tokenizer.ggml.tokens")
    types = _field(reader, "tokenizer.ggml.token_type")
    strip = [t for t, k in zip(tokens, types)
             if (k == CONTROL or t == "</s>") and t not in PHI3_NO_RSTRIP]
    if strip:
        added = [AddedToken(t, rstrip=True, normalized=False, special=True) for t in strip]
        tok.add_special_tokens({"additional_special_tokens": added}, replace_extra_special_tokens=False)


def _user_defined_tokens_whole(tok, reader) -> None:
    """Every user-defined token of a SentencePiece vocabulary is matched in the raw text before
    the model's merges, as llama.cpp's ``tokenizer_st_partition`` matches it. transformers' GGUF
    conversion leaves out the whitespace-only ones (Gemma 3's runs of 2-31 spaces or tabs), so a
    run of 33 spaces became merges 16 + 17 instead of llama.cpp's 31 + 2."""
    if _field(reader, "tokenizer.ggml.model") != SENTENCEPIECE:
        return
    tokens = _field(reader, "tokenizer.ggml.tokens")
    types = _field(reader, "tokenizer.ggml.token_type")
    have = {str(t) for t in tok.added_tokens_decoder.values()}
    vocab = tok.get_vocab()
    added = []
    for i, (t, k) in enumerate(zip(tokens, types)):
        if k != USER_DEFINED or t in have:
            continue
        from tokenizers import AddedToken

        # the converted vocabulary spells spaces as SentencePiece's "▁": such a token is matched
        # after the normalizer (which writes "▁" for " ") under its stored spelling, so it keeps its id
        piece = t.replace(" ", "\u2581")
        if vocab.get(t) == i:
            added.append(AddedToken(t, normalized=False, special=False))
        elif vocab.get(piece) == i:
            added.append(AddedToken(piece, normalized=True, special=False))
    if added:
        n = len(tok)
        tok.add_tokens(added)
        assert len(tok) == n, "a user-defined token must keep its vocabulary id"


def _ignore_merges(tok, reader) -> None:
    """Words that are tokens stay whole, as llama.cpp keeps them for this pre-tokenizer name."""
    if (_field(reader, "tokenizer.ggml.model") == BYTE_LEVEL
            and _field(reader, "tokenizer.ggml.pre") in IGNORE_MERGES):
        tok.backend_tokenizer.model.ignore_merges = True
