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
from numba import njit, prange

from runtime.ggml_ops import exp_shift16


def heldout_ids(tokenizer, n_tokens: int | None = None) -> list[int]:
    """The first ``n_tokens`` of the held-out stream (all of it when None)."""
    from aios.evaluation import pydoc_split

    ids = pydoc_split(tokenizer, "heldout").ids.tolist()
    return ids if n_tokens is None else ids[:n_tokens]


NLL_CHUNK = 4096  # logits exponentiated at a time, in a per-row scratch that stays in L1


@njit(parallel=True, fastmath=True, cache=True)
def target_nll(logits, targets):
    """Σ_t −log softmax(logits[t])[targets[t]] over the rows of logits (T, V) float32 (left as
    they are): each row's exp(x − max) in float32 (ggml_v_expf's polynomial, 16 lanes at a time,
    on copies of NLL_CHUNK logits: numba's scalar expf took 0.1 s of a window of 127 × 262,144
    logits), summed in float64 (1e-8 from an all-float64 sum on 262,144 logits; a numpy float64
    log-softmax of the whole matrix took 0.4 s a window)."""
    T, V = logits.shape
    out = np.empty(T, np.float64)
    for t in prange(T):
        row = logits[t]
        m = row[0]
        for j in range(1, V):
            m = max(m, row[j])
        e = np.empty(NLL_CHUNK, np.float32)
        s = 0.0
        for c in range(0, V, NLL_CHUNK):
            n = min(NLL_CHUNK, V - c)
            e[:n] = row[c:c + n]
            exp_shift16(e[:n], m)
            for j in range(n // 16 * 16):
                s += e[j]
            for j in range(n // 16 * 16, n):
                s += math.exp(e[j] - m)
        out[t] = np.float64(m) + math.log(s) - np.float64(row[targets[t]])
    return out.sum()


PERPLEXITY_ARITHMETIC = "int16"  # float results (runtime.kernels.Arithmetic), the integer tiles' speed


def perplexity(model, ids: list[int], window: int = 128, per_token: bool = False,
               arithmetic: str | None = PERPLEXITY_ARITHMETIC) -> dict:
    """exp(mean NLL) of ``ids`` under ``model`` (a runtime.model.Model); the byte counter is paused,
    and the windows reuse the weights' unpacked form (``kernels.kept_unpacked``).

    ``arithmetic``: the block kernels' arithmetic for the run ("int16" by default: the float
    path's results, within 0.03 % of its perplexity on the real Gemma 3 270M, where llama.cpp's
    int8 rounding of the activations moves it by ~1.8 %; the AMX tiles run it where the CPU has
    them, the float path elsewhere); None: the model's own (``model.arith``). Passed to each
    forward pass; the model's own arithmetic is left as it is."""
    from dataclasses import replace

    from runtime.kernels import kept_unpacked
    from runtime.measure import stored_matrices

    own = model.arith
    arith = own if arithmetic is None else replace(own, name=arithmetic)
    enabled = model.counter.enabled
    model.counter.enabled = False
    # (a stand-in for Model without its matrices, e.g. a test's wrapper: sized by the budget alone)
    with kept_unpacked(matrices=stored_matrices(model) if hasattr(model, "layers") else None) as kept:
        nll, count = _windows(model, ids, window, per_token, enabled, arith.keeping(kept))
    return {"perplexity": math.exp(nll / max(1, count)), "tokens_scored": count, "window": window,
            "per_token": per_token, "arithmetic": arith.name}


def _windows(model, ids, window, per_token, enabled, arith) -> tuple[float, int]:
    nll, count = 0.0, 0
    try:
        for w0 in range(0, len(ids) - 1, window):
            chunk = ids[w0 : w0 + window]
            if len(chunk) < 2:
                break
            model.reset()
            if per_token:
                logits = np.concatenate([model.forward([t], arith=arith) for t in chunk[:-1]])
            else:
                logits = model.forward(chunk, all_logits=True, arith=arith)[:-1]
            nll += float(target_nll(np.ascontiguousarray(logits, np.float32), np.asarray(chunk[1:], np.int64)))
            count += len(chunk) - 1
    finally:
        model.reset()
        model.counter.enabled = enabled
    return nll, count
