"""Cross-layer similarity of same-type weight matrices from one streamed Gram matrix.

All quantities R3 needs follow from inner products G[i, j] = <W_i, W_j> (Frobenius):
cosine, ‖W_i − W_j‖, and the distance of each W_i to a group mean W̄. G is accumulated
over row blocks, so every tensor is read once and memory stays ≈ L × block rows.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

RowReader = Callable[[str, int, int], np.ndarray]  # (name, start, stop) -> rows as float32


def streamed_gram(read_rows: RowReader, names: Sequence[str], n_rows: int, n_cols: int,
                  budget_elements: int = 8_000_000) -> np.ndarray:
    """G (L, L) float64 of the flattened matrices ``names``, reading ``block`` rows at a time."""
    L = len(names)
    block = max(1, budget_elements // max(1, L * n_cols))
    G = np.zeros((L, L), np.float64)
    X = np.empty((L, block * n_cols), np.float64)  # one buffer: rows land in it as float64 directly
    for r0 in range(0, n_rows, block):
        r1 = min(n_rows, r0 + block)
        Xb = X[:, : (r1 - r0) * n_cols]
        for i, n in enumerate(names):
            Xb[i] = read_rows(n, r0, r1).reshape(-1)
        G += Xb @ Xb.T
    return G


def cosine_from_gram(G: np.ndarray) -> np.ndarray:
    norms = np.sqrt(np.clip(np.diag(G), 1e-300, None))
    return G / np.outer(norms, norms)


def rel_delta_from_gram(G: np.ndarray) -> np.ndarray:
    """R[i, j] = ‖W_i − W_j‖ / ‖W_j‖."""
    d = np.diag(G)
    sq = np.clip(d[:, None] + d[None, :] - 2 * G, 0, None)
    return np.sqrt(sq) / np.sqrt(np.clip(d[None, :], 1e-300, None))


def rel_delta_to_mean(G: np.ndarray, group: Sequence[int]) -> tuple[np.ndarray, float]:
    """‖W_i − W̄‖ / ‖W̄‖ for i in ``group`` with W̄ the group mean, and ‖W̄‖."""
    g = np.asarray(group)
    sub = G[np.ix_(g, g)]
    k = len(g)
    mean_sq = sub.sum() / k**2  # ‖W̄‖²
    dist_sq = np.diag(sub) - 2 * sub.sum(1) / k + mean_sq  # ‖W_i − W̄‖²
    mean_norm = float(np.sqrt(max(mean_sq, 1e-300)))
    return np.sqrt(np.clip(dist_sq, 0, None)) / mean_norm, mean_norm
