"""Fitting the FFN activation predictor (``aios-run fit-predictor``) by running the GGUF.

Fitting loads a :class:`runtime.model.Model` and its tokenizer, so it sits above the model;
:mod:`runtime.predictor` (the predictor itself, its per-layer fit and its file format) sits
below it, because the model loads a predictor for ``--mode predict``.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import numpy as np

from aios.data import load_texts
from aios.errors import UsageError
from runtime.generate import load_tokenizer
from runtime.model import RELU_FAMILY, Model
from runtime.predictor import (
    PREDICTOR_FORMAT,
    Predictor,
    PredictorConfig,
    collect_ffn_inputs,
    evaluate,
    file_fingerprint,
    fit_layer,
)


def fit(model_path: str | Path, cfg: PredictorConfig = PredictorConfig(), texts: list[str] | None = None,
        tokenizer_dir: str | Path | None = None, progress=None) -> Predictor:
    """Fit a predictor for every FFN layer of a ReLU-family GGUF from calibration text."""
    if cfg.rank < 1:
        raise UsageError("--rank must be at least 1.")
    if not 0 < cfg.target_fnr < 0.5:
        raise UsageError("--target-fnr must be between 0 and 0.5 (exclusive).")
    path = Path(model_path)
    model = Model(path, mode="dense")
    hp = model.hp
    if hp.activation not in RELU_FAMILY:
        raise UsageError(f"A predictor needs a ReLU-family FFN; this model runs '{hp.activation}', "
                         "whose activations are never exactly zero. Relufy it first (aios-convert relufy).")
    tok = load_tokenizer(path, Path(tokenizer_dir) if tokenizer_dir else None)
    texts = texts if texts is not None else load_texts()
    ids = [tok(t)["input_ids"] for t in texts]
    H = collect_ffn_inputs(model, [x for x in ids if x], cfg.max_tokens)
    rng = np.random.default_rng(cfg.seed)
    threshold = float(hp.activation_threshold or 0.0) if hp.activation == "fatrelu" else 0.0
    layers, evals = [], []
    for i, L in enumerate(model.layers):
        if progress:
            progress(i, hp.n_layers)
        pre = "ffn_gate" if "ffn_gate.weight" in L else "ffn_up"
        W = L[f"{pre}.weight"].dense()
        # a pre-activation bias (GPT-2's c_fc) shifts each neuron's firing threshold: W·h + b > t  <=>  W·h > t - b
        thr = threshold - L[f"{pre}.bias"] if f"{pre}.bias" in L else threshold
        n = len(H[i])
        if n < 16:
            raise UsageError(f"Only {n} calibration tokens reached layer {i}; give more calibration text.")
        perm = rng.permutation(n)
        n_eval = max(1, int(n * cfg.heldout_fraction))
        tr, ev = H[i][perm[n_eval:]], H[i][perm[:n_eval]]
        p = fit_layer(W, tr, thr, cfg)
        layers.append(p)
        evals.append(evaluate(p, W, ev, thr))
    fired = sum(e["fired"] for e in evals)
    info = {
        "format": PREDICTOR_FORMAT,
        "config": asdict(cfg),
        "source": file_fingerprint(path),
        "calibration_tokens": int(len(H[0])),
        "heldout": {
            "evidence": "measured on held-out calibration tokens (not used for fitting)",
            "fnr": sum(e["false_negatives"] for e in evals) / max(1, fired),
            "true_density": float(np.mean([e["true_density"] for e in evals])),
            "predicted_density": float(np.mean([e["predicted_density"] for e in evals])),
            "per_layer": evals,
        },
    }
    return Predictor(layers, info)
