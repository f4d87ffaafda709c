"""The tokenizer a GGUF stores, tokenizing as the model's own tokenizer and llama.cpp do.

transformers rebuilds it from the file's ``tokenizer.ggml.*`` keys (byte-level BPE, or a
SentencePiece vocabulary with its scores and token types). One property of Phi-3's tokenizer is
in no key: its chat tokens (``<|user|>``, ``<|assistant|>``, ``<|end|>``, ...) strip the
whitespace after them (``rstrip`` in Phi-3's ``tokenizer_config.json``), so ``"<|user|>\\nHi"``
is ``<|user|> ▁Hi``, not ``<|user|> ▁ \\n Hi``. llama.cpp restores it by name (``llama-vocab.cpp``:
every control token of a Phi-3 vocabulary but ``<unk>``, ``<s>`` and ``<|endoftext|>``, and
``</s>``); so do we, for a SentencePiece vocabulary of the phi3 architecture (Phi-3 and 3.5; Phi-4
rides on phi3 with a byte-level vocabulary, whose special tokens strip nothing).
"""

from __future__ import annotations

from pathlib import Path

PHI3_NO_RSTRIP = ("<unk>", "<s>", "<|endoftext|>")
SENTENCEPIECE = "llama"  # tokenizer.ggml.model of a SentencePiece vocabulary (llama.cpp's name)
CONTROL = 3  # gguf.TokenType.CONTROL


def load_gguf_tokenizer(path: str | Path):
    """The transformers tokenizer of the GGUF at ``path``."""
    from transformers import AutoTokenizer

    from aios.models.tensors import transformers_reads_gguf_fast

    path = Path(path)
    with transformers_reads_gguf_fast():
        tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    _phi3_chat_tokens_rstrip(tok, path)
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
