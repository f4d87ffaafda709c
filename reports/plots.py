"""Figures for the HTML reports, as PNG bytes (matplotlib, Agg, no pyplot state).

Every function takes plain lists (what the JSON reports hold) and returns the PNG bytes of
one figure of fixed size, so the same report renders to the same bytes: no timestamps or
software version are written into the PNG metadata.
"""

from __future__ import annotations

import io
import math
from typing import Sequence

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

MEASURED, PROJECTED, THRESHOLD = "#1f6feb", "#9a6700", "#cf222e"


def _png(fig: Figure) -> bytes:
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, metadata={"Software": None})
    return buf.getvalue()


def _figure(w: float, h: float) -> Figure:
    return Figure(figsize=(w, h), layout="constrained")


def layer_zero_fractions(exact: Sequence[float], near: Sequence[float] | None, floor: float) -> bytes:
    """Per-layer exact-zero and near-zero fractions (both measured) against R1's floor."""
    fig = _figure(8, 3.2)
    ax = fig.add_subplot()
    x = np.arange(len(exact))
    w = 0.4 if near else 0.8
    ax.bar(x - (w / 2 if near else 0), exact, w, color=MEASURED, label="exact zeros (measured)")
    if near:
        ax.bar(x + w / 2, near, w, color="#8ab4f8", label="near zeros |x| < eps (measured, information)")
    ax.axhline(floor, color=THRESHOLD, ls="--", lw=1.2, label=f"R1 floor {floor:.0%} (mean over layers)")
    ax.set(xlabel="layer", ylabel="fraction of FFN activations", ylim=(0, 1.05), xticks=x)
    fig.legend(loc="outside lower center", ncol=3, fontsize=8, frameon=False)
    ax.grid(axis="y", alpha=0.3)
    return _png(fig)


def activation_frequency(edges: Sequence[float], counts: Sequence[Sequence[int]]) -> bytes:
    """Heatmap: share of each layer's neurons (rows) per firing-frequency bin (columns)."""
    c = np.asarray(counts, dtype=float)  # (L, bins)
    share = c / np.maximum(c.sum(1, keepdims=True), 1)
    L = share.shape[0]
    fig = _figure(8, max(2.4, 0.9 + 0.28 * L))
    ax = fig.add_subplot()
    im = ax.imshow(share, aspect="auto", cmap="viridis", vmin=0, vmax=max(float(share.max()), 1e-9),
                   extent=(edges[0], edges[-1], L - 0.5, -0.5), interpolation="nearest")
    ax.set(xlabel="fraction of calibration tokens on which a neuron is nonzero", ylabel="layer",
           yticks=range(L) if L <= 40 else None)
    fig.colorbar(im, ax=ax, label="share of the layer's neurons")
    return _png(fig)


def similarity_heatmaps(matrices: dict[str, Sequence[Sequence[float | None]]], core: Sequence[int],
                        threshold: float) -> bytes:
    """One L×L cross-layer cosine heatmap per matrix type; the core zone is outlined."""
    names = list(matrices)
    cols = min(2, len(names))
    rows = math.ceil(len(names) / cols)
    fig = _figure(4.6 * cols, 4.0 * rows)
    for k, name in enumerate(names):
        m = np.array([[np.nan if v is None else v for v in row] for row in matrices[name]], dtype=float)
        L = m.shape[0]
        ax = fig.add_subplot(rows, cols, k + 1)
        im = ax.imshow(m, cmap="magma", vmin=min(0.0, float(np.nanmin(m))), vmax=1.0, interpolation="nearest")
        if core:
            a, b = min(core), max(core)
            ax.add_patch(Rectangle((a - 0.5, a - 0.5), b - a + 1, b - a + 1, fill=False, ec="#2da44e", lw=2))
        if L <= 12:
            for i in range(L):
                for j in range(L):
                    if not np.isnan(m[i, j]):
                        ax.text(j, i, f"{m[i, j]:.2f}", ha="center", va="center", fontsize=7,
                                color="black" if m[i, j] > 0.6 else "white")
        ax.set_title(name, fontsize=9)
        ax.set(xlabel="layer j", ylabel="layer i")
        fig.colorbar(im, ax=ax, shrink=0.8, label="cosine")
    fig.suptitle(f"cross-layer cosine (measured); core zone outlined, zone threshold {threshold:g}", fontsize=10)
    return _png(fig)


def mb_per_token(terms: Sequence[str], series: Sequence[tuple[str, Sequence[float | None], str]]) -> bytes:
    """Grouped horizontal bars of MB/token per term; ``series`` is (label, values, evidence).

    Projected series are hatched and measured ones solid, so the two are never confused.
    """
    fig = _figure(8, 1.4 + 0.22 * len(terms) * max(1, len(series)) + 0.2 * math.ceil(len(series) / 2))
    ax = fig.add_subplot()
    y = np.arange(len(terms))
    h = 0.8 / max(1, len(series))
    palettes = {"projected": ["#d4a72c", "#9a6700", "#e09b13"],  # ambers, hatched
                "measured": ["#1f6feb", "#2da44e", "#8250df", "#bf3989", "#0969da", "#1a7f37"]}
    used = {"projected": 0, "measured": 0}
    for k, (label, values, evidence) in enumerate(series):
        kind = "projected" if evidence == "projected" else "measured"
        color = palettes[kind][used[kind] % len(palettes[kind])]
        used[kind] += 1
        vals = [np.nan if v is None else v for v in values]
        ax.barh(y + (k - (len(series) - 1) / 2) * h, vals, h, label=f"{label} ({evidence})", color=color,
                hatch="//" if kind == "projected" else None, edgecolor="white" if kind == "projected" else None)
    ax.set(yticks=y, yticklabels=terms, xlabel="MB per generated token")
    ax.invert_yaxis()
    fig.legend(loc="outside lower center", ncol=2, fontsize=8, frameon=False)
    ax.grid(axis="x", alpha=0.3)
    return _png(fig)


def relufy_curve(steps: Sequence[float], zero: Sequence[float | None], ppl: Sequence[float | None],
                 floor: float = 0.7, source_ppl: float | None = None) -> bytes:
    """Exact-zero fraction (left axis) and held-out perplexity (right axis) over fine-tuning steps."""
    fig = _figure(8, 3.4)
    ax = fig.add_subplot()
    z = [np.nan if v is None else v for v in zero]
    # two measurements (start and end of a short run) are two points, not a trend: no line
    style_z, style_p = ("o-", "s-") if len(steps) > 2 else ("o", "s")
    ax.plot(steps, z, style_z, color=MEASURED, label="exact-zero fraction (measured)")
    ax.axhline(floor, color=THRESHOLD, ls="--", lw=1, label=f"R1 floor {floor:.0%}")
    ax.set(xlabel="fine-tuning step", ylabel="exact-zero fraction", ylim=(0, 1.05))
    ax2 = ax.twinx()
    p = [np.nan if v is None else v for v in ppl]
    ax2.plot(steps, p, style_p, color="#bc4c00", label="held-out perplexity (measured)")
    if source_ppl is not None:
        ax2.axhline(source_ppl, color="#bc4c00", ls=":", lw=1.2, label=f"source model perplexity {source_ppl:.4g}")
    ax2.set_ylabel("held-out perplexity")
    finite = [v for v in p if not np.isnan(v)] + ([source_ppl] if source_ppl else [])
    if finite and min(finite) > 0 and max(finite) / min(finite) > 10:
        ax2.set_yscale("log")  # a swapped activation can raise perplexity by orders of magnitude
    fig.legend(loc="outside lower center", ncol=3, fontsize=8, frameon=False)
    ax.grid(alpha=0.3)
    return _png(fig)
