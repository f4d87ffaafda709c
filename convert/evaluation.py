"""Held-out perplexity and exact-zero sparsity of a loaded model: the numbers converters report.

* Held-out perplexity is the protocol of the bundled fixtures (``aios.fixtures.train``):
  by default the held-out split of Python's ``pydoc_data.topics`` (the 8 held-out topics),
  tokenized with the model's own tokenizer into one stream, cut into non-overlapping
  128-token windows; ppl = exp(mean NLL of tokens 1..n-1 of each window). For the bundled
  fixtures this is exactly the ``heldout_perplexity`` of their ``aios_fixture.json`` cards.
  A user file (JSONL ``text`` / TXT) can replace the held-out texts.
* Sparsity is measured by the R1 checker's own code
  (:func:`contract.measure.ffn.measure_ffn_activity`) on the bundled calibration prompts
  with the checker's defaults, so a converter's report and ``aios-contract check`` agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import torch

from aios.data import load_texts, texts_sha256
from aios.fixtures import train as fixture_recipe
from aios.models import ModelHandle
from contract.measure.ffn import FfnActivity, measure_ffn_activity

R1_MAX_TOKENS = 128  # the checker's default --max-tokens


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


class _LogitsOnCpu(torch.nn.Module):
    """Lets the fixtures' CPU-tensor perplexity helper drive a model on another device."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.inner = model

    def forward(self, input_ids: torch.Tensor):
        device = next(self.inner.parameters()).device
        return SimpleNamespace(logits=self.inner(input_ids=input_ids.to(device)).logits.float().cpu())


def heldout_perplexity(model: torch.nn.Module, heldout: TokenSet) -> float:
    """Held-out perplexity by the fixtures' protocol (stride-128 windows, exp mean NLL)."""
    if next(model.parameters()).device.type != "cpu":
        model = _LogitsOnCpu(model)
    return float(fixture_recipe.heldout_perplexity(model, heldout.ids))


def exact_zero_activity(handle: ModelHandle, model: torch.nn.Module, tokenizer,
                        texts: list[str] | None = None) -> FfnActivity:
    """R1 statistics by the checker's code (bundled calibration prompts by default).

    The model must be on the CPU (the checker's code feeds CPU tensors).
    """
    return measure_ffn_activity(handle, texts if texts is not None else load_texts(),
                                max_tokens=R1_MAX_TOKENS, model=model, tokenizer=tokenizer)
