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


def heldout_perplexity(model: torch.nn.Module, heldout: TokenSet, prefix: list[int] | None = None) -> float:
    """Held-out perplexity by the fixtures' protocol (stride-128 windows, exp mean NLL); a model
    whose positions end sooner (GPT-2's learned table, ``n_positions`` < 128) gets windows of its
    own length, where 128-token windows used to crash in its position embedding.

    ``prefix`` (``convert.sparsify.bos_prefix``): put before every window and not scored; each window then
    holds 128 - len(prefix) text tokens, all scored. A model trained with a BOS (Gemma) scores
    ~13× worse without one, and a fine-tune on BOS-less windows would learn that instead of
    the task: with an empty prefix this is exactly the fixtures' protocol."""
    seq_len = fixture_recipe.SEQ_LEN
    cfg = getattr(model, "config", None)
    for key in ("n_positions", "max_position_embeddings"):
        n = getattr(cfg, key, None)
        if isinstance(n, int) and n > 1:
            seq_len = min(seq_len, n)
            break
    if next(model.parameters()).device.type != "cpu":
        model = _LogitsOnCpu(model)
    if not prefix:
        return float(fixture_recipe.heldout_perplexity(model, heldout.ids, seq_len=seq_len))
    return _prefixed_perplexity(model, heldout.ids, prefix, seq_len)


@torch.no_grad()
def _prefixed_perplexity(model, ids, prefix: list[int], seq_len: int, batch_size: int = 16) -> float:
    import math

    body = seq_len - len(prefix)
    ids = torch.as_tensor(ids, dtype=torch.long)
    chunks = [ids[i:i + body] for i in range(0, len(ids) - 1, body)]
    chunks = [c for c in chunks if len(c) > 0]
    head = torch.tensor(prefix, dtype=torch.long)
    was_training = model.training
    model.eval()
    nll, count = 0.0, 0
    for length in sorted({len(c) for c in chunks}, reverse=True):
        same = [torch.cat([head, c]) for c in chunks if len(c) == length]
        for i in range(0, len(same), batch_size):
            x = torch.stack(same[i:i + batch_size])
            logits = model(input_ids=x).logits[:, len(prefix) - 1:-1].float()
            logp = torch.log_softmax(logits, dim=-1).gather(-1, x[:, len(prefix):, None])
            nll -= logp.double().sum().item()
            count += x[:, len(prefix):].numel()
    model.train(was_training)
    return math.exp(nll / count)


class PrefixedWindows:
    """A training-window source whose windows start with ``prefix`` (the model's BOS): the first
    len(prefix) tokens of each window are replaced, so windows keep their length and, with an
    empty prefix, are exactly the source's."""

    def __init__(self, source, prefix: list[int]) -> None:
        self.source, self.prefix = source, torch.tensor(prefix, dtype=torch.long)

    def next_batch(self, n: int) -> torch.Tensor:
        batch = self.source.next_batch(n)
        if len(self.prefix):
            batch = batch.clone()
            batch[:, :len(self.prefix)] = self.prefix
        return batch

    def state_dict(self):
        return self.source.state_dict()

    def load_state_dict(self, state) -> None:
        self.source.load_state_dict(state)

    def describe(self):
        d = self.source.describe()
        return {**d, "window_prefix": self.prefix.tolist()} if len(self.prefix) else d


def exact_zero_activity(handle: ModelHandle, model: torch.nn.Module, tokenizer,
                        texts: list[str] | None = None) -> FfnActivity:
    """R1 statistics by the checker's code (bundled calibration prompts by default), on the
    model's own device."""
    return measure_ffn_activity(handle, texts if texts is not None else load_texts(),
                                max_tokens=R1_MAX_TOKENS, model=model, tokenizer=tokenizer)
