"""Measure a GGUF by running it: held-out perplexity and decode MB/token.

The measurement ``aios-convert svd-residual`` reports (``--eval-tokens``) and the frontier
benchmarks plot. It loads a :class:`runtime.model.Model`, so it sits above the model; the
extension formats (``runtime.lowrank``, ``runtime.alias``) sit below it and never import it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from runtime.generate import load_tokenizer
from runtime.model import Model
from runtime.perplexity import perplexity

EVAL_SETS = ("pydoc", "heldout")


def _texts(name: str) -> list[str]:
    if name == "pydoc":  # the fixtures' held-out split (in-domain for the bundled models)
        from aios.fixtures.train import split_texts

        return split_texts("heldout")
    from aios.data import load_heldout

    return load_heldout()


def _perplexity(model, tok, texts: list[str], eval_tokens: int, window: int) -> tuple[float, int]:
    ids: list[int] = []
    for text in texts:
        if tok.eos_token_id is not None:
            ids.append(tok.eos_token_id)
        ids += tok(text, add_special_tokens=False, verbose=False)["input_ids"]
        if len(ids) >= eval_tokens:
            break
    res = perplexity(model, ids[:eval_tokens], window=window)
    return res["perplexity"], res["tokens_scored"]


def evaluate_gguf(path: str | Path, eval_tokens: int = 1024, window: int = 128, decode_tokens: int = 8,
                  sets: tuple[str, ...] = EVAL_SETS) -> dict:
    """Run ``path`` in the runtime: perplexity and decode MB/token (all measured).

    Perplexity follows the fixtures' protocol: one EOS-separated token stream of the texts,
    non-overlapping windows of ``window`` tokens, exp(mean NLL of tokens 1..n-1 of each
    window), over the first ``eval_tokens`` tokens. Text sets: ``heldout`` = the bundled
    held-out passages (``aios.data.load_heldout``: prose in many languages, far from what the
    tiny fixtures saw), ``pydoc`` = the fixtures' own held-out split of Python's documentation
    (in-domain; the fixture cards' perplexity). MB/token: bytes the byte counter adds per
    decoded token after a 32-token prefill, by term and, for weights, per tensor.
    """
    path = Path(path)
    tok = load_tokenizer(path)
    model = Model(path, n_ctx=max(window, 32 + decode_tokens + 1))
    out: dict = {"eval_tokens": eval_tokens, "window": window}
    for name in sets:
        ppl, n = _perplexity(model, tok, _texts(name), eval_tokens, window)
        out[f"{name}_perplexity"], out[f"{name}_tokens_scored"] = ppl, n
    model.reset()
    prompt = tok(_texts("heldout")[0], add_special_tokens=False, verbose=False)["input_ids"][:32]
    logits = model.forward(prompt)
    model.counter.reset()
    for _ in range(decode_tokens):
        logits = model.forward([int(np.argmax(logits[-1]))])
    per_tok = {k: v / decode_tokens for k, v in model.counter.snapshot().items()}
    per_tensor = {k: v / decode_tokens for k, v in model.counter.per_tensor.items()}
    out.update({
        "mb_per_token": {k: v / 1e6 for k, v in per_tok.items()},
        "mb_per_token_total": sum(per_tok.values()) / 1e6,
        "weights_mb_per_token": per_tok["weights"] / 1e6,
        "block_weights_mb_per_token": sum(v for k, v in per_tensor.items() if k.startswith("blk.")) / 1e6,
        "weights_bytes_per_tensor": per_tensor,
        "weight_bytes_loaded": model.weight_bytes,
    })
    return out
