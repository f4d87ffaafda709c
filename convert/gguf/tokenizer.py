"""Tokenizer metadata for GGUF: the ``tokenizer.ggml.*`` keys llama.cpp needs to load a model.

Read from the HF folder's ``tokenizer.json`` (never from pickled or remote code):

- byte-level BPE (GPT-2, Falcon, Llama-3, Qwen2 style) -> ``tokenizer.ggml.model = "gpt2"``
  with the vocabulary, the merges and a pre-tokenizer name llama.cpp knows;
- BPE with byte fallback and ``▁`` word marks (Llama-2 / Mistral SentencePiece exported to
  ``tokenizer.json``) -> ``tokenizer.ggml.model = "llama"`` with tokens, scores and types.

Special-token ids, merges and ``add_bos``/``add_eos`` come from gguf-py's ``SpecialVocab``;
whether HF adds BOS/EOS is then checked by encoding a string with the real tokenizer, so
llama.cpp tokenizes exactly as transformers does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aios.errors import InvalidModelError

# Pre-tokenizer regexes of known byte-level BPE tokenizers -> llama.cpp's pre-tokenizer name.
# (llama.cpp detects these by hashing a tokenization; we match the declared regex instead.)
KNOWN_SPLIT_REGEXES: dict[str, str] = {
    # Llama-3
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+": "llama-bpe",
    # Qwen2
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+": "qwen2",
    # GPT-2 written out explicitly
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+": "gpt-2",
}  # fmt: skip


@dataclass
class TokenizerMeta:
    """Everything written under ``tokenizer.ggml.*`` plus notes for the user."""

    model: str  # "gpt2" | "llama"
    pre: str | None  # llama.cpp pre-tokenizer name (BPE only)
    tokens: list[str]
    token_types: list[int]  # gguf.TokenType values
    scores: list[float] | None = None  # SentencePiece-style only
    add_space_prefix: bool | None = None
    special: Any = None  # gguf.SpecialVocab
    notes: list[str] = field(default_factory=list)

    def add_to(self, writer) -> None:
        writer.add_tokenizer_model(self.model)
        if self.pre is not None:
            writer.add_tokenizer_pre(self.pre)
        writer.add_token_list(self.tokens)
        writer.add_token_types(self.token_types)
        if self.scores is not None:
            writer.add_token_scores(self.scores)
        if self.add_space_prefix is not None:
            writer.add_add_space_prefix(self.add_space_prefix)
        if self.special is not None:
            self.special.add_to_gguf(writer, quiet=True)


def read_tokenizer(folder: Path, vocab_size: int | None) -> TokenizerMeta | None:
    """Tokenizer metadata for the HF folder, or None when it has no ``tokenizer.json``."""
    path = folder / "tokenizer.json"
    if not path.is_file():
        return None
    try:
        spec = json.loads(path.read_text(encoding="utf-8"))
        model = spec["model"]
        vocab: dict[str, int] = model["vocab"]
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
        raise InvalidModelError(f"{path} is not a readable tokenizer.json ({e}).") from e
    if model.get("type") != "BPE":
        raise InvalidModelError(
            f"{path} holds a {model.get('type')} tokenizer; GGUF export supports BPE tokenizers "
            "(byte-level or SentencePiece-style with byte fallback)."
        )
    added = {t["id"]: t for t in spec.get("added_tokens", [])}
    n = max(vocab_size or 0, max(vocab.values(), default=-1) + 1, max(added, default=-1) + 1)
    by_id: dict[int, str] = {i: t for t, i in vocab.items()}
    by_id.update({i: t["content"] for i, t in added.items()})
    byte_fallback = bool(model.get("byte_fallback"))
    meta = _spm_meta(by_id, added, n, spec) if byte_fallback else _bpe_meta(by_id, added, n, spec)
    import gguf

    meta.special = gguf.SpecialVocab(folder, load_merges=not byte_fallback, n_vocab=n)
    _check_add_special(path, meta)
    return meta


def _token_type(i: int, added: dict[int, dict]) -> int:
    import gguf

    if i in added:
        control = added[i].get("special") or _looks_special(added[i]["content"])
        return gguf.TokenType.CONTROL if control else gguf.TokenType.USER_DEFINED
    return gguf.TokenType.NORMAL


def _looks_special(text: str) -> bool:
    """An added token llama.cpp types CONTROL though its tokenizer says not special (Qwen2.5's
    ``<|fim_prefix|>``...; Gemma's ``<mask>``): the test of ``does_token_look_special`` in
    llama.cpp's ``convert_hf_to_gguf.py``. Written USER_DEFINED, llama.cpp's loader retypes the
    ``<|...|>`` ones with a warning that the model is probably broken."""
    return (text in ("<pad>", "<mask>", "<2mass>", "[@BOS@]")
            or (text.startswith("<|") and text.endswith("|>"))
            or (text.startswith("<\uff5c") and text.endswith("\uff5c>"))  # deepseek-coder's fullwidth bars
            or (text.startswith("<unused") and text.endswith(">")))


def _bpe_meta(by_id: dict[int, str], added: dict[int, dict], n: int, spec: dict) -> TokenizerMeta:
    import gguf

    tokens, types = [], []
    for i in range(n):
        if i in by_id:
            tokens.append(by_id[i])
            types.append(_token_type(i, added))
        else:  # ids the config reserves beyond the tokenizer (padded vocab)
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
    pre, note = _pre_tokenizer_name(spec.get("pre_tokenizer"))
    return TokenizerMeta("gpt2", pre, tokens, types, notes=[note] if note else [])


def _pre_tokenizer_name(pre: dict | None) -> tuple[str, str | None]:
    """llama.cpp's name for the declared pre-tokenizer, and a note when it is a guess."""
    steps = pre.get("pretokenizers", [pre]) if isinstance(pre, dict) else []
    if len(steps) == 1 and steps[0].get("type") == "ByteLevel" and steps[0].get("use_regex", True):
        return "gpt-2", None  # ByteLevel's built-in regex is GPT-2's
    for step in steps:
        if step.get("type") == "Split":
            regex = (step.get("pattern") or {}).get("Regex")
            if regex in KNOWN_SPLIT_REGEXES:
                return KNOWN_SPLIT_REGEXES[regex], None
    return "default", (
        "tokenizer pre-tokenizer not recognised; wrote pre-tokenizer 'default' "
        "(llama.cpp may split text differently from transformers)"
    )


def _spm_meta(by_id: dict[int, str], added: dict[int, dict], n: int, spec: dict) -> TokenizerMeta:
    """SentencePiece-style BPE for llama.cpp's "llama" tokenizer.

    llama.cpp merges the adjacent pair whose concatenation has the highest score; HF BPE
    applies the lowest-ranked merge. So a token made by merge rank r scores -r, and tokens no
    merge makes (single characters, bytes, specials) score below every merge.
    """
    import gguf

    model = spec["model"]
    vocab: dict[str, int] = model["vocab"]
    scores = [-1e9] * n
    for r, m in enumerate(model.get("merges", [])):
        a, b = m.split(" ", 1) if isinstance(m, str) else m
        i = vocab.get(a + b)
        if i is not None and scores[i] == -1e9:
            scores[i] = -float(r)
    unk = model.get("unk_token")
    tokens, types = [], []
    for i in range(n):
        tok = by_id.get(i)
        if tok is None:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
        elif tok == unk:
            tokens.append(tok)
            types.append(gguf.TokenType.UNKNOWN)
        elif len(tok) == 6 and tok.startswith("<0x") and tok.endswith(">"):
            tokens.append(tok)
            types.append(gguf.TokenType.BYTE)
        else:
            tokens.append(tok)
            types.append(_token_type(i, added))
    return TokenizerMeta("llama", None, tokens, types, scores=scores,
                         add_space_prefix=_prepends_space(spec))


def _prepends_space(spec: dict) -> bool:
    """Whether the tokenizer puts "▁" before the text (Prepend normalizer or Metaspace)."""
    norm = spec.get("normalizer") or {}
    steps = norm.get("normalizers", [norm])
    if any(s.get("type") == "Prepend" and s.get("prepend") == "\u2581" for s in steps):
        return True
    pre = spec.get("pre_tokenizer") or {}
    return any(p.get("type") == "Metaspace" and p.get("prepend_scheme", "always") != "never"
               for p in pre.get("pretokenizers", [pre]))


def _check_add_special(path: Path, meta: TokenizerMeta) -> None:
    """Set add_bos/add_eos to what the HF tokenizer really does on a plain string."""
    from tokenizers import Tokenizer

    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises a bare Exception on bad files
        raise InvalidModelError(f"{path} cannot be loaded by `tokenizers` ({e}).") from e
    plain = tok.encode("Hello world", add_special_tokens=False).ids
    full = tok.encode("Hello world", add_special_tokens=True).ids
    sv = meta.special
    add_bos = len(full) > len(plain) and full[0] != plain[0]
    add_eos = len(full) > len(plain) and full[-1] != plain[-1]
    sv.add_special_token["bos"], sv.add_special_token["eos"] = add_bos, add_eos
    if add_bos:
        sv.special_token_ids.setdefault("bos", full[0])
    if add_eos:
        sv.special_token_ids.setdefault("eos", full[-1])
