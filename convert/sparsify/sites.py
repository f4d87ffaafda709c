"""``--scope all``: cuts of every projection's input, not only the FFN's (TEAL).

Beside the FFN cut (``down_in`` or ``gate``), three more inputs per layer are thresholded
(runtime/thresholds.py ``INPUT_SITES``): the attention norm's output (q, k and v read it: one
threshold for the three), the attention output (the output projection's input) and the FFN norm's
output (gate and up read it). Each site's cut at a zero fraction is the quantile of |x| over the
calibration tokens, as the FFN site's is; every site of every layer is cut at the target
(uniform: on the real Gemma 3 270M uniform beat greedy allocation for the FFN site, and TEAL's
greedy needs a block-error pass per step, left for a measured comparison).

"Model-wide" zero fraction: each site's zero fraction weighted by the bytes of the matrices that
read it (a zero of the FFN's 8960-wide down input skips a column of 1536 values, one of the
attention input a column of q, k and v together), the share of the layer matrices' bytes a
token's zeros let a sparse kernel skip.
"""

from __future__ import annotations

import numpy as np

from convert.sparsify.measure import LEVELS
from runtime.thresholds import INPUT_SITES, SITE_MATRICES, InputThresholds

SAMPLE = 1 << 20  # values per (layer, site) the quantiles are taken over (a fixed random sample)
SITE_LEVELS = (0.3, 0.5, 0.7, 0.9)  # the zero fractions each site's KL pass cuts it at (greedy)


def capture_site_magnitudes(model, wins: list[list[int]]) -> dict[str, np.ndarray]:
    """Per site, (n_layers, len(LEVELS)) cut values: the quantiles of |x| at each LEVELS zero
    fraction over ``wins`` (dense, no cuts), computed by the running model."""
    n = model.hp.n_layers
    seen: dict[str, list[list[np.ndarray]]] = {s: [[] for _ in range(n)] for s in INPUT_SITES}
    model.input_hook = lambda layer, site, x: seen[site][layer].append(np.abs(np.asarray(x, np.float32)).ravel())
    try:
        for w in wins:
            model.reset()
            model.forward(w, all_logits=True)
    finally:
        model.input_hook = None
        model.reset()
    out = {}
    for site in INPUT_SITES:
        rows = []
        for layer in range(n):
            flat = np.concatenate(seen[site][layer])
            seen[site][layer] = []  # freed as it goes
            if flat.size > SAMPLE:  # the same sample on every run
                flat = flat[np.random.default_rng(layer).choice(flat.size, SAMPLE, replace=False)]
            cuts = np.quantile(flat, LEVELS).astype(np.float32)
            cuts[0] = 0.0
            rows.append(cuts)
        out[site] = np.array(rows)
    return out


def input_cuts_at(site_cuts: dict[str, np.ndarray], fractions: dict[str, float] | float) -> InputThresholds:
    """Each input site of every layer cut at its zero fraction (``fractions``: per site, or one
    for all), the cut interpolated between the grid's quantiles."""
    out = {}
    for site, v in site_cuts.items():
        f = fractions if isinstance(fractions, float) else fractions.get(site, 0.0)
        out[site] = np.array([np.interp(f, LEVELS, row) for row in v], np.float32)
    return InputThresholds(out)


def site_costs(model, wins: list[list[int]], cuts_at, sites: tuple[str, ...], progress=None) -> dict[str, np.ndarray]:
    """Per site, the mean KL (nats/token) of the next-token distribution from the dense model's
    with only that site cut, in every layer, at each SITE_LEVELS zero fraction, over ``wins``.
    ``cuts_at(site, f)``: (FFN thresholds or None, input thresholds or None) cutting ``site`` alone."""
    from convert.sparsify.measure import log_probs

    kl = {s: np.zeros(len(SITE_LEVELS)) for s in sites}
    count, step, steps = 0, 0, len(wins) * len(sites) * len(SITE_LEVELS)
    try:
        for w in wins:
            model.thresholds = model.input_cuts = None
            model.reset()
            p = log_probs(model.forward(w, all_logits=True))
            pe = np.exp(p)
            for site in sites:
                for i, f in enumerate(SITE_LEVELS):
                    model.thresholds, model.input_cuts = cuts_at(site, f)
                    model.reset()
                    kl[site][i] += float((pe * (p - log_probs(model.forward(w, all_logits=True)))).sum())
                    step += 1
                    if progress:
                        progress("sensitivity: one site cut at a time (--scope all)", step, steps)
            count += len(w)
    finally:
        model.thresholds = model.input_cuts = None
        model.reset()
    return {s: np.maximum.accumulate(np.maximum(v / max(count, 1), 0.0)) for s, v in kl.items()}


def allocate_sites(costs: dict[str, np.ndarray], nbytes: dict[str, int], target: float, cap: float) -> dict[str, float]:
    """Per site, the zero fraction that reaches a model-wide ``target`` (each site weighted by its
    matrices' bytes) at the least summed cost: from 0, the step of LEVELS' spacing whose cost
    increase per byte skipped is smallest, until the target is met (each site's cost is its KL
    curve, 0 at 0, interpolated). Sites assumed to cost independently: measured, not assumed,
    is the resulting perplexity (the report's)."""
    grid = LEVELS[LEVELS <= cap + 1e-9]
    total = sum(nbytes[s] for s in costs)
    idx = dict.fromkeys(costs, 0)

    def cost(site: str, k: int) -> float:
        return float(np.interp(grid[k], (0.0, *SITE_LEVELS), (0.0, *costs[site])))

    while sum(grid[idx[s]] * nbytes[s] for s in costs) / total < target - 1e-9:
        best, rate = None, np.inf
        for s in costs:
            k = idx[s]
            if k + 1 >= len(grid) or not nbytes[s]:
                continue
            r = (cost(s, k + 1) - cost(s, k)) / ((grid[k + 1] - grid[k]) * nbytes[s])
            if r < rate:
                best, rate = s, r
        if best is None:
            break
        idx[best] += 1
    return {s: float(grid[k]) for s, k in idx.items()}


def site_bytes(model) -> dict[str, int]:
    """Per site (INPUT_SITES and the FFN's), the bytes of the layer matrices that read its input."""
    out = {}
    for site, names in SITE_MATRICES.items():
        total = 0
        for L in model.layers:
            for n in names:
                m = L.get(f"{n}.weight")
                if m is not None and hasattr(m, "parts"):
                    total += sum(p.nbytes for p in m.parts())
        out[site] = total
    return out


def model_wide(fractions: dict[str, float], nbytes: dict[str, int]) -> float:
    """The zero fractions of ``fractions`` (site -> fraction) weighted by each site's matrix bytes,
    over all layer matrices (a site without cuts counts as 0)."""
    total = sum(nbytes[s] for s in ("attn_in", "attn_out", "ffn_in", "down_in"))
    return sum(f * nbytes[s] for s, f in fractions.items()) / max(total, 1)
