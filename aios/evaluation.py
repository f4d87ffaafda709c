"""The token streams every held-out measurement uses, shared by the converters and the runtime.

Held-out perplexity follows the protocol of the bundled fixtures (``aios.fixtures.train``): by
default the held-out split of Python's ``pydoc_data.topics`` (the 8 held-out topics), tokenized
with the model's own tokenizer into one EOS-separated stream. The converters score torch
models on it (``convert.evaluation``), the runtime scores GGUFs on it (``runtime.perplexity``),
so both report the same numbers for the same weights. A user file (JSONL ``text`` / TXT) can
replace the texts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from aios.data import load_texts, texts_sha256
from aios.fixtures import train as fixture_recipe


def text_stream(tokenizer, texts: list[str]) -> torch.Tensor:
    """One token stream: each text preceded by the EOS token (when the tokenizer has one)."""
    ids: list[int] = []
    for text in texts:
        if tokenizer.eos_token_id is not None:
            ids.append(tokenizer.eos_token_id)
        ids.extend(tokenizer(text, add_special_tokens=False)["input_ids"])
    return torch.tensor(ids, dtype=torch.long)


@dataclass(frozen=True)
class TokenSet:
    """A token stream plus where it came from (for provenance)."""

    ids: torch.Tensor  # (N,) long
    source: str
    sha256: str  # of the texts, see aios.data.texts_sha256

    def describe(self) -> dict:
        return {"source": self.source, "texts_sha256": self.sha256, "tokens": int(len(self.ids))}


def pydoc_split(tokenizer, split: str) -> TokenSet:
    """The fixtures' train or held-out split of ``pydoc_data.topics`` (see aios.fixtures.train)."""
    texts = fixture_recipe.split_texts(split)
    source = f"pydoc_data.topics ({split} split of aios.fixtures.train)"
    if tokenizer.eos_token_id is None or not hasattr(tokenizer, "backend_tokenizer"):
        return TokenSet(text_stream(tokenizer, texts), source, texts_sha256(texts))
    # A fast tokenizer called with truncation=True (as the R1 measurement does) leaves its
    # backend truncating; stream_ids encodes with the backend, so reset that state first.
    tokenizer.backend_tokenizer.no_truncation()
    tokenizer.backend_tokenizer.no_padding()
    return TokenSet(fixture_recipe.stream_ids(tokenizer, split), source, texts_sha256(texts))


def file_tokens(tokenizer, path: str | Path) -> TokenSet:
    """Texts of a user JSONL/TXT file as one stream (raises a one-line AiosError if unusable)."""
    texts = load_texts(path)
    return TokenSet(text_stream(tokenizer, texts), str(path), texts_sha256(texts))
