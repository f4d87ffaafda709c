"""Sparsity-map math: neuron ranking, masks, the skip-count search, false negatives.

Pure numpy; the model runs happen in ``convert/sparsity_map/run.py``, which hands in a
``measure(k) -> relative perplexity change`` callable.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np


def skip_order(freq: np.ndarray) -> np.ndarray:
    """Flat neuron indices of ``freq`` (L, d_ffn), least frequently firing first.

    Ties (e.g. many never-firing neurons) break by flat index, so the order is deterministic.
    """
    assert freq.ndim == 2, "freq must be (n_layers, d_ffn)"
    return np.argsort(freq.reshape(-1), kind="stable")


def keep_masks(order: np.ndarray, k: int, shape: tuple[int, int]) -> np.ndarray:
    """(L, d_ffn) bool: True = kept, False for the first ``k`` neurons of ``order``."""
    keep = np.ones(shape[0] * shape[1], dtype=bool)
    keep[order[:k]] = False
    return keep.reshape(shape)


@dataclass(frozen=True)
class Probe:
    skipped: int  # neurons skipped (all layers)
    change: float  # relative held-out perplexity change, (ppl_with - ppl_without) / ppl_without
    ok: bool  # |change| < budget


def search_skip_count(n: int, measure: Callable[[int], float], budget: float,
                      resolution: int = 1024) -> tuple[int, list[Probe]]:
    """Largest measured skip count ``k`` in [0, n] whose |Δppl| stays below ``budget``.

    Binary search on k (Δppl grows with k, up to noise); the answer is always a count that
    was measured and passed, never an interpolation. The search stops when the bracket is
    narrower than ``n / resolution`` neurons (at least 1). ``budget`` is a fraction
    (0.001 = 0.1 %).
    """
    probes: list[Probe] = []

    def probe(k: int) -> bool:
        change = measure(k)
        probes.append(Probe(k, change, abs(change) < budget))
        return probes[-1].ok

    lo, hi = 0, n  # lo passes (0 skipped changes nothing); hi is not yet known to fail
    if probe(n):
        return n, probes
    step = max(1, n // resolution)
    while hi - lo > step:
        mid = (lo + hi) // 2
        if probe(mid):
            lo = mid
        else:
            hi = mid
    return lo, probes


def false_negative_rate(active: np.ndarray, keep: np.ndarray) -> float:
    """Share of nonzero activations that fall in skipped neurons.

    ``active`` (L, d_ffn): how many tokens each neuron was nonzero for (on held-out text,
    without the mask); ``keep`` (L, d_ffn) bool.
    """
    assert active.shape == keep.shape
    total = active.sum()
    return float(active[~keep].sum() / total) if total else 0.0
