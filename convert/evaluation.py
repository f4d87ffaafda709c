"""Held-out perplexity and exact-zero sparsity of a loaded model: the numbers converters report.

* Held-out perplexity is the protocol of the bundled fixtures (``aios.fixtures.train``):
  by default the held-out split of Python's ``pydoc_data.topics`` (the 8 held-out topics),
  tokenized with the model's own tokenizer into one stream, cut into non-overlapping
  128-token windows; ppl = exp(mean NLL of tokens 1..n-1 of each window). For the bundled
  fixtures this is exactly the ``heldout_perplexity`` of their ``aios_fixture.json`` cards.
  A user file (JSONL ``text`` / TXT) can replace the held-out texts. The token streams
  themselves (``pydoc_split``, ``file_tokens``, ``TokenSet``) are in :mod:`aios.evaluation`,
  shared with the runtime's GGUF perplexity.
* Sparsity is measured by the R1 checker's own code
  (:func:`aios.measure.ffn.measure_ffn_activity`) on the bundled calibration prompts
  with the checker's defaults, so a converter's report and ``aios-contract check`` agree.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from aios.data import load_texts
from aios.evaluation import TokenSet
from aios.fixtures import train as fixture_recipe
from aios.measure.ffn import FfnActivity, measure_ffn_activity
from aios.models import ModelHandle

R1_MAX_TOKENS = 128  # the checker's default --max-tokens


class _LogitsOnCpu(torch.nn.Module):
    """Lets the fixtures' CPU-tensor perplexity helper drive a model on another device."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.inner = model

    def forward(self, input_ids: torch.Tensor):
        device = next(self.inner.parameters()).device
        return SimpleNamespace(logits=self.inner(input_ids=input_ids.to(device)).logits.float().cpu())


def heldout_perplexity(model: torch.nn.Module, heldout: TokenSet) -> float:
    """Held-out perplexity by the fixtures' protocol (stride-128 windows, exp mean NLL); a model
    whose positions end sooner (GPT-2's learned table, ``n_positions`` < 128) gets windows of its
    own length, where 128-token windows used to crash in its position embedding."""
    seq_len = fixture_recipe.SEQ_LEN
    cfg = getattr(model, "config", None)
    for key in ("n_positions", "max_position_embeddings"):
        n = getattr(cfg, key, None)
        if isinstance(n, int) and n > 1:
            seq_len = min(seq_len, n)
            break
    if next(model.parameters()).device.type != "cpu":
        model = _LogitsOnCpu(model)
    return float(fixture_recipe.heldout_perplexity(model, heldout.ids, seq_len=seq_len))


def exact_zero_activity(handle: ModelHandle, model: torch.nn.Module, tokenizer,
                        texts: list[str] | None = None) -> FfnActivity:
    """R1 statistics by the checker's code (bundled calibration prompts by default), on the
    model's own device."""
    return measure_ffn_activity(handle, texts if texts is not None else load_texts(),
                                max_tokens=R1_MAX_TOKENS, model=model, tokenizer=tokenizer)
