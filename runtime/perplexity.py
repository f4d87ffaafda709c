"""Held-out perplexity of a GGUF measured by running it in the runtime, in any FFN mode.

Protocol: the one of the fixtures' cards and the converters' reports
(``aios.evaluation``): the held-out split of ``pydoc_data.topics`` as one EOS-separated
token stream, cut into non-overlapping windows of ``window`` tokens; perplexity =
exp(mean NLL of tokens 1..n−1 of each window). Over the whole split and with window 128,
an f32 export of a bundled fixture reproduces its card's ``heldout_perplexity``.

``per_token=True`` feeds every window one token at a time through the KV cache, exactly as
decoding does. Exact modes give the same numbers either way; lossy modes must use it,
because a chunked forward lets ``predict`` compute the union of the rows any token in the
chunk needs, which hides the misses a real decode step suffers.
"""

from __future__ import annotations

import math

import numpy as np


def heldout_ids(tokenizer, n_tokens: int | None = None) -> list[int]:
    """The first ``n_tokens`` of the held-out stream (all of it when None)."""
    from aios.evaluation import pydoc_split

    ids = pydoc_split(tokenizer, "heldout").ids.tolist()
    return ids if n_tokens is None else ids[:n_tokens]


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    z = logits.astype(np.float64)
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def perplexity(model, ids: list[int], window: int = 128, per_token: bool = False) -> dict:
    """exp(mean NLL) of ``ids`` under ``model`` (a runtime.model.Model); the byte counter is paused,
    and the windows reuse the weights' unpacked form (``kernels.kept_unpacked``)."""
    from runtime.kernels import kept_unpacked
    from runtime.measure import stored_matrices

    enabled = model.counter.enabled
    model.counter.enabled = False
    nll, count = 0.0, 0
    # (a stand-in for Model without its matrices, e.g. a test's wrapper: sized by the budget alone)
    with kept_unpacked(matrices=stored_matrices(model) if hasattr(model, "layers") else None):
        nll, count = _windows(model, ids, window, per_token, enabled)
    return {"perplexity": math.exp(nll / max(1, count)), "tokens_scored": count, "window": window,
            "per_token": per_token}


def _windows(model, ids, window, per_token, enabled) -> tuple[float, int]:
    nll, count = 0.0, 0
    try:
        for w0 in range(0, len(ids) - 1, window):
            chunk = ids[w0 : w0 + window]
            if len(chunk) < 2:
                break
            model.reset()
            if per_token:
                logits = np.concatenate([model.forward([t]) for t in chunk[:-1]])
            else:
                logits = model.forward(chunk, all_logits=True)[:-1]
            logp = _log_softmax(logits)
            nll -= float(logp[np.arange(len(chunk) - 1), chunk[1:]].sum())
            count += len(chunk) - 1
    finally:
        model.reset()
        model.counter.enabled = enabled
    return nll, count
