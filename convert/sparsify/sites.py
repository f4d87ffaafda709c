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
from runtime.thresholds import INPUT_SITES, InputThresholds

# the matrices that read each site's input (GGUF names relative to blk.N.; fused forms included)
SITE_MATRICES = {
    "attn_in": ("attn_q", "attn_k", "attn_v", "attn_qkv"),
    "attn_out": ("attn_output",),
    "ffn_in": ("ffn_gate", "ffn_up"),
    "down_in": ("ffn_down",),
    "gate": ("ffn_up", "ffn_down"),  # the gate site skips up and down rows of a cut neuron
}
SAMPLE = 1 << 20  # values per (layer, site) the quantiles are taken over (a fixed random sample)


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


def input_cuts_at(site_cuts: dict[str, np.ndarray], target: float) -> InputThresholds:
    """Every site of every layer cut at the LEVELS zero fraction nearest ``target`` from above."""
    k = min(int(np.searchsorted(LEVELS, target - 1e-9)), len(LEVELS) - 1)
    return InputThresholds({s: np.ascontiguousarray(v[:, k], np.float32) for s, v in site_cuts.items()})


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
