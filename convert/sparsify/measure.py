"""Measurements ``aios-convert sparsify`` takes on the running model (steps 1-3 of
``convert/sparsify/__init__.py``): FFN inputs, per-layer cut curves, perplexity and per-layer
KL sensitivity, all through aios-run executing the GGUF as stored."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from runtime.thresholds import FfnThresholds

LEVELS = np.round(np.concatenate([np.arange(0.0, 0.9, 0.05), np.arange(0.9, 0.99, 0.025)]), 4)
SENSITIVITY_LEVELS = (0.3, 0.6, 0.9)  # the zero fractions each layer's KL passes cut it at
Progress = Callable[[str, int, int], None]


@dataclass
class LayerCurve:
    cuts: np.ndarray  # (len(LEVELS),) cut value (of the weighted score) at each grid zero fraction
    error: np.ndarray  # (len(LEVELS),) relative error of the layer's FFN output
    sensitivity: np.ndarray | None = None  # KL (nats/token), only this layer cut, at each SENSITIVITY_LEVELS
    # gate site: per-neuron weight of |act(gate)| in the score (see neuron_weights); None: score = magnitude
    weight: np.ndarray | None = None

    def thresholds(self, k: int) -> np.ndarray:
        """The magnitude cut at level ``k``: one value, or one per neuron (cut / weight)."""
        return self.thresholds_at(float(LEVELS[k]))

    def thresholds_at(self, frac: float) -> np.ndarray:
        """The magnitude cut at zero fraction ``frac``: the quantiles of the grid interpolated
        linearly between its levels (a grid level gives its own cut)."""
        cut = np.float32(np.interp(frac, LEVELS, self.cuts))
        if self.weight is None:
            return cut
        return (cut / self.weight).astype(np.float32)


# --- measurements on the running model ------------------------------------------------------


def capture_ffn_inputs(model, wins: list[list[int]]) -> list[np.ndarray]:
    """Every layer's FFN input over ``wins`` (dense, no thresholds): a list of (N, d_model)."""
    seen: list[list[np.ndarray]] = [[] for _ in range(model.hp.n_layers)]
    model.ffn_input_hook = lambda layer, h: seen[layer].append(np.array(h, np.float32))
    try:
        for w in wins:
            model.reset()
            model.forward(w)
    finally:
        model.ffn_input_hook = None
        model.reset()
    return [np.concatenate(s) for s in seen]


def ffn_parts(model, layer: int, H: np.ndarray, site: str) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(magnitudes the site's cut compares, the down projection's dense input, the per-neuron
    RMS of the up projection's output — gate site only) for inputs ``H``, computed by the
    runtime's own kernels and activation."""
    from runtime.activations import activation

    L, hp = model.layers[layer], model.hp
    ar = model.arith  # the arithmetic the file runs in (its kernels and activation)
    act = model._activation(ar)
    if "ffn_gate.weight" in L:
        g = activation(act, L["ffn_gate.weight"].matmul(H, None, ar) + L.get("ffn_gate.bias", 0), hp.activation_threshold)
        u = L["ffn_up.weight"].matmul(H, None, ar) + L.get("ffn_up.bias", 0)
        a = (g * u).astype(np.float32)
        if site == "gate":
            return np.abs(g), a, np.sqrt(np.mean(np.square(u, dtype=np.float64), axis=0))
        return np.abs(a), a, None
    a = activation(act, L["ffn_up.weight"].matmul(H, None, ar) + L.get("ffn_up.bias", 0), hp.activation_threshold)
    a = np.asarray(a, np.float32)
    return np.abs(a), a, None


def down_column_norms(model, layer: int) -> np.ndarray:
    """‖W_down[:, i]‖ for every neuron i: what one unit of its activation adds to the output,
    from the stored (decoded) weights, in either down layout."""
    from runtime.measure import gguf_row_reader

    read = gguf_row_reader(model.path)
    hp = model.hp
    names = {t.name for t in model.reader.tensors}
    name = f"blk.{layer}.ffn_down.weight"
    if name in names:  # d_model rows of d_ffn, streamed in slices
        acc = np.zeros(hp.d_ffn)
        for r0 in range(0, hp.d_model, 256):
            acc += np.sum(np.square(read(name, r0, min(hp.d_model, r0 + 256)), dtype=np.float64), axis=0)
        return np.sqrt(acc)
    name = f"blk.{layer}.ffn_down.t"  # neuron-major (--sparse-down): one row per neuron
    return np.concatenate([np.linalg.norm(read(name, r0, min(hp.d_ffn, r0 + 1024)).astype(np.float64), axis=1)
                           for r0 in range(0, hp.d_ffn, 1024)])


def _ffn_out(model, layer: int, a: np.ndarray) -> np.ndarray:
    """What the FFN adds to the residual stream for down-projection input ``a``."""
    L = model.layers[layer]
    y = L["ffn_down.weight"].matmul(a, None, model.arith)
    if "ffn_down.bias" in L:
        y = y + L["ffn_down.bias"]
    if model.hp.graph.post_norms:  # Gemma: the branch output is normed before the residual add
        y = model._norm(y, L["post_ffw_norm.weight"], None, model.arith)
    return y


def layer_curve(model, layer: int, H: np.ndarray, site: str, sample: int = 1 << 20,
                errors: bool = True) -> LayerCurve:
    """Cut values (quantiles over a fixed sample of the layer's magnitudes) and relative output
    errors at every LEVELS zero fraction (``errors`` False: zeros, not measured; only the greedy
    per-layer allocation reads them, and they are most of the calibration's time: one down
    projection of every calibration token per level, 773 s of 1,429 on the real Qwen 1.5B)."""
    mag, a, up_rms = ffn_parts(model, layer, H, site)
    weight = None
    if up_rms is not None:
        # the gate site scores |act(gate)_i| by what neuron i then adds to the output: × the RMS
        # of its up value and × the norm of its down column (measured on the real Gemma 3 270M:
        # held-out perplexity ratio 1.28 instead of 1.34 at 50 %, 1.84 instead of 2.27 at 70 %,
        # docs/benchmarks.md "Training-free sparsity"); the cut stays one per neuron: t / weight
        weight = np.maximum(up_rms * down_column_norms(model, layer), 1e-30).astype(np.float32)
        mag = mag * weight
    flat = mag.ravel()
    if flat.size > sample:  # quantiles of a fixed random sample: the same cuts on every run
        flat = flat[np.random.default_rng(layer).choice(flat.size, sample, replace=False)]
    cuts = np.quantile(flat, LEVELS).astype(np.float32)
    cuts[0] = 0.0
    if not errors:
        return LayerCurve(cuts, np.zeros(len(LEVELS)), weight=weight)
    y0 = _ffn_out(model, layer, a)
    ref = float(np.sum(y0.astype(np.float64) ** 2)) or 1.0
    err = np.zeros(len(LEVELS))
    for k, t in enumerate(cuts):
        if k == 0:
            continue
        y = _ffn_out(model, layer, np.where(mag < t, 0, a).astype(np.float32))
        err[k] = float(np.sum((y - y0).astype(np.float64) ** 2)) / ref
    return LayerCurve(cuts, np.maximum.accumulate(err), weight=weight)  # a deeper cut never costs less


def zero_fraction(model, wins: list[list[int]], cuts: FfnThresholds, inputs=None) -> float:
    """The exact-zero fraction of the down projections' inputs over ``wins`` with the cuts on
    (every token, every layer), as R1 counts it."""
    zeros = seen = 0

    def hook(layer: int, a: np.ndarray) -> None:
        nonlocal zeros, seen
        zeros += int(np.count_nonzero(a == 0))
        seen += a.size

    model.ffn_act_hook, model.thresholds, model.input_cuts = hook, cuts, inputs
    try:
        for w in wins:
            model.reset()
            model.forward(w)
    finally:
        model.ffn_act_hook, model.thresholds, model.input_cuts = None, None, None
        model.reset()
    return zeros / max(seen, 1)


def log_probs(logits: np.ndarray) -> np.ndarray:
    """log softmax over the last axis, in float64."""
    z = logits.astype(np.float64)
    z -= z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def nll(model, wins: list[list[int]], cuts: FfnThresholds | None, skip: int, inputs=None) -> tuple[float, int]:
    """(total NLL in nats, tokens scored) of ``wins`` with ``cuts`` (and the input cuts ``inputs``,
    runtime.thresholds.InputThresholds) applied; the first ``skip`` tokens of each window (its BOS
    prefix) are context, not scored."""
    model.thresholds = cuts
    model.input_cuts = inputs
    total, count = 0.0, 0
    try:
        for w in wins:
            model.reset()
            lp = log_probs(model.forward(w, all_logits=True)[:-1])
            tgt = np.asarray(w[1:])
            rows = np.arange(len(tgt))[max(0, skip - 1):]
            total -= float(lp[rows, tgt[rows]].sum())
            count += len(rows)
    finally:
        model.thresholds = None
        model.input_cuts = None
        model.reset()
    return total, count


def sensitivities(model, wins: list[list[int]], curves: list[LayerCurve], site: str,
                  progress: Progress | None = None) -> None:
    """Each curve's ``sensitivity``: mean KL(dense ‖ cut) per token with only its layer cut at
    each of SENSITIVITY_LEVELS, over ``wins``."""
    n, m = len(curves), len(SENSITIVITY_LEVELS)
    ks = [int(np.argmin(np.abs(LEVELS - x))) for x in SENSITIVITY_LEVELS]
    kl, count = np.zeros((n, m)), 0
    try:
        for j, w in enumerate(wins):
            model.thresholds = None
            model.reset()
            p = log_probs(model.forward(w, all_logits=True))
            pe = np.exp(p)
            for layer in range(n):
                for i, k in enumerate(ks):
                    values = [np.float32(0)] * n
                    values[layer] = curves[layer].thresholds(k)
                    model.thresholds = FfnThresholds(site, stack_thresholds(values))
                    model.reset()
                    q = log_probs(model.forward(w, all_logits=True))
                    kl[layer, i] += float((pe * (p - q)).sum())
                if progress:
                    progress("sensitivity: one layer cut at a time", j * n + layer + 1, len(wins) * n)
            count += len(w)
    finally:
        model.thresholds = None
        model.reset()
    for c, k in zip(curves, kl / max(1, count)):
        c.sensitivity = np.maximum.accumulate(np.maximum(k, 0.0))  # a deeper cut never costs less


def stack_thresholds(values: list) -> np.ndarray:
    """Per-layer thresholds as one array: (layers,) when each is one value, else (layers, d_ffn)."""
    if all(np.ndim(v) == 0 for v in values):
        return np.asarray(values, np.float32)
    width = max(np.size(v) for v in values)
    return np.stack([np.broadcast_to(np.float32(v), (width,)) for v in values]).astype(np.float32)
