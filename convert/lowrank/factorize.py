"""The factorization W ≈ U·V + Q(E) of one matrix, and the storage rules of its parts.

Pure functions on arrays (the file layout is in ``convert/svd_residual.py``'s docstring): which
type and layout each stored part takes (factor rows that do not fill their blocks fall back to
F16; K-quant residuals are stored flat, neuron-major ones as rows), SVD-LLM-style whitening,
the rank choice, and :func:`compress`. Encoding and the SQNR are the GGUF spine's
(``convert.gguf.tensors``); decoding is gguf-py's, independent of ours.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from aios import quant
from aios.errors import UsageError
from convert.gguf.tensors import encode, sqnr_db
from convert.lowrank.config import K_TYPES, RESIDUAL_FALLBACK, SvdResidualConfig

EPS_REL = 1e-6  # Cholesky jitter, relative to the mean diagonal of XᵀX


# --- storage types and layouts ---------------------------------------------------------------


def block_size(t: str) -> tuple[int, int]:
    """(values per block, bytes per block) of a GGML type."""
    return quant.block_size(t), quant.type_size(t)


def nbytes_of(n_values: int, t: str) -> int:
    return quant.row_bytes(t, n_values)


def decode(a: np.ndarray, t: str, shape: tuple[int, ...]) -> np.ndarray:
    """Stored array -> float64 values of ``shape`` (gguf-py's dequantizers, independent of ours)."""
    if t in ("f32", "f16"):
        return np.asarray(a, dtype=np.float64).reshape(shape)
    from gguf import quants

    return quants.dequantize(np.asarray(a), quant.qtype(t)).astype(np.float64).reshape(shape)


def factor_type_for(row_len: int, t: str) -> tuple[str, str | None]:
    """(type, fallback reason) for a factor whose rows have ``row_len`` values."""
    blk, _ = block_size(t)
    if row_len % blk:
        return "f16", f"row length {row_len} is not a multiple of the {t.upper()} block ({blk})"
    return t, None


def residual_layout(n_out: int, n_in: int, t: str) -> tuple[str, str, str | None]:
    """(type, layout "rows"|"flat"|"none", fallback reason) for a residual of (n_out, n_in).

    K-quant residuals are always stored flat (1-D, row-major, 256-value super-blocks), so a
    row of 128 values shares a super-block with its neighbour instead of forcing a fallback.
    """
    if t == "none":
        return "none", "none", None
    blk, _ = block_size(t)
    if t in K_TYPES and (n_out * n_in) % blk == 0:
        return t, "flat", None
    if t not in K_TYPES and n_in % blk == 0:
        return t, "rows", None
    fb = RESIDUAL_FALLBACK.get(t, "f16")
    kind, layout, _ = residual_layout(n_out, n_in, fb)
    return kind, layout, f"{n_out}×{n_in} values do not tile {t.upper()} blocks ({blk})"


def neuron_major_residual_layout(n_rows: int, row_len: int, t: str) -> tuple[str, str, str | None]:
    """(type, layout, fallback reason) of a neuron-major residual Eᵀ: ``n_rows`` (d_ffn) rows of
    ``row_len`` (d_model) values, always stored as rows ("neuron-major") so one neuron's row is
    whole blocks; a type whose blocks do not divide the row falls back as ``residual_layout``'s do."""
    if t == "none":
        return "none", "none", None
    blk, _ = block_size(t)
    if row_len % blk == 0:
        return t, "neuron-major", None
    kind, layout, _ = neuron_major_residual_layout(n_rows, row_len, RESIDUAL_FALLBACK.get(t, "f16"))
    return kind, layout, f"neuron-major rows of {row_len} values do not tile {t.upper()} blocks ({blk})"


NEURON_MAJOR_DOWN = re.compile(r"blk\.\d+\.ffn_down\.weight")  # what --sparse-down stores neuron-major


def is_factorized(p) -> bool:
    """2-D block weights (attention and FFN); embeddings, head, norms and biases stay plain."""
    return p.name.startswith("blk.") and p.name.endswith(".weight") and len(p.shape) == 2 and p.source is not None


# --- math -----------------------------------------------------------------------------------


def whitening_factor(gram: np.ndarray, eps_rel: float = EPS_REL, tries: int = 10) -> tuple[np.ndarray, float]:
    """Lower-triangular L with L·Lᵀ = XᵀX + εI (float64); ε grows ×10 until Cholesky succeeds."""
    g = np.asarray(gram, dtype=np.float64)
    scale = float(np.mean(np.diag(g))) or 1.0
    eye = np.eye(g.shape[0])
    for k in range(tries):
        eps = eps_rel * 10.0**k * scale
        try:
            return np.linalg.cholesky(g + eps * eye), eps
        except np.linalg.LinAlgError:
            continue
    raise np.linalg.LinAlgError("XᵀX + εI is not positive definite even with ε = 1e3 × mean diagonal")


def choose_rank(s: np.ndarray, m: int, n: int, cfg: SvdResidualConfig, residual_bytes: int) -> int:
    """Rank from --rank / --energy / --bpw (``s``: singular values of the matrix being truncated)."""
    full = min(m, n)
    if cfg.rank is not None:
        return full if cfg.rank == "full" else min(int(cfg.rank), full)
    if cfg.energy is not None:
        cum = np.cumsum(s.astype(np.float64) ** 2)
        return min(full, int(np.searchsorted(cum, cfg.energy * cum[-1] * (1 - 1e-12)) + 1)) if cum[-1] > 0 else 1
    budget = cfg.bpw * m * n / 8 - residual_bytes  # type: ignore[operator]
    per_elem = quant.type_size(cfg.factor_type) / quant.block_size(cfg.factor_type)
    r = min(full, int(budget // (per_elem * (m + n))))
    if cfg.factor_type == "q8_0" and r < full:
        blk = quant.block_size("q8_0")
        r = r // blk * blk  # U rows of r values must fill whole Q8_0 blocks
    return r


@dataclass
class Compressed:
    """One factorized matrix: stored arrays and what the report needs."""

    tensors: dict[str, tuple[np.ndarray, str, tuple[int, ...]]]  # suffix -> (array, type, shape)
    rank: int
    energy_kept: float
    sqnr_db: float
    output_sqnr_db: float | None
    bits_per_weight: float
    residual_type: str
    residual_layout: str
    notes: list[str] = field(default_factory=list)
    eps: float | None = None


def _svd(M: np.ndarray, r: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rank-r truncated SVD; randomized (scikit-learn, seeded) unless r is near full."""
    if r + 10 < min(M.shape) // 2:
        from sklearn.utils.extmath import randomized_svd

        return randomized_svd(M, r, n_oversamples=10, n_iter=7, random_state=seed)
    u, s, vt = np.linalg.svd(M, full_matrices=False)
    return u[:, :r], s[:r], vt[:r]


def compress(W: np.ndarray, cfg: SvdResidualConfig, gram: np.ndarray | None = None, *,
             neuron_major: bool = False) -> Compressed:
    """Factorize W (n_out, n_in) into stored U, V and residual per ``cfg`` (stored
    as ``convert/svd_residual.py`` describes); ``neuron_major``: V and the residual stored transposed (``lr_v.t``, ``residual.t``)."""
    from threadpoolctl import threadpool_limits

    # small matrices: one BLAS thread (threaded LAPACK on tiny panels is several times slower,
    # worse on shared cores); large ones keep the library default
    with threadpool_limits(1 if np.size(W) <= 1 << 22 else None):
        return _compress(np.asarray(W, dtype=np.float64), cfg, gram, neuron_major)


def _compress(W: np.ndarray, cfg: SvdResidualConfig, gram: np.ndarray | None, neuron_major: bool = False) -> Compressed:
    m, n = W.shape
    if neuron_major:
        rtype, layout, r_why = neuron_major_residual_layout(n, m, cfg.residual)
    else:
        rtype, layout, r_why = residual_layout(m, n, cfg.residual)
    r_bytes = 0 if rtype == "none" else nbytes_of(m * n, rtype)
    L, eps = (None, None)
    M = W
    if cfg.method == "activation-aware":
        assert gram is not None and gram.shape == (n, n), (None if gram is None else gram.shape, n)
        L, eps = whitening_factor(gram)
        M = W @ L  # ‖(W − Ŵ)L‖_F = ‖(W − Ŵ)Xᵀ‖_F (up to ε)
    s_all = np.linalg.svd(M, compute_uv=False)
    r = choose_rank(s_all, m, n, cfg, r_bytes)
    if r < 1:
        raise UsageError(f"--bpw {cfg.bpw:g} leaves no room for a rank-1 factor of a {m}×{n} matrix next to its "
                         f"{rtype.upper()} residual ({8 * r_bytes / (m * n):.2f} bits/weight); raise --bpw.")
    u, s, vt = _svd(M, r, cfg.seed)
    root = np.sqrt(s)
    A = u * root  # (m, r)
    C = root[:, None] * vt  # (r, n)
    if L is not None:
        from scipy.linalg import solve_triangular

        C = solve_triangular(L.T, C.T, lower=False).T  # C·L⁻¹: undo the whitening
    notes = [f"residual: {r_why} -> {rtype.upper()}"] if r_why else []
    tensors: dict[str, tuple[np.ndarray, str, tuple[int, ...]]] = {}
    deq = {}
    # (suffix, stored values): V as Vᵀ (n_in rows of r) when neuron-major, U always as is
    for key, suffix, x in (("lr_u", "lr_u", A), ("lr_v", "lr_v.t" if neuron_major else "lr_v",
                                                  C.T if neuron_major else C)):
        t, why = factor_type_for(x.shape[1], cfg.factor_type)
        if why:
            notes.append(f"{suffix}: {why} -> F16")
        tensors[suffix] = (encode(x, t), t, x.shape)
        d = decode(tensors[suffix][0], t, x.shape)
        deq[key] = d.T if suffix.endswith(".t") else d
    approx = deq["lr_u"] @ deq["lr_v"]
    if rtype != "none":
        E = (W - approx).astype(np.float32)
        blk = block_size(rtype)[0]
        if neuron_major:  # Eᵀ: one row per neuron, quantized along n_out
            stored = encode(np.ascontiguousarray(E.T), rtype)
            tensors["residual.t"] = (stored, rtype, (n, m))
            approx = approx + decode(stored, rtype, (n, m)).T
        else:
            stored = encode(E.reshape(-1, blk) if layout == "flat" else E, rtype)
            shape = (m * n,) if layout == "flat" else (m, n)
            tensors["residual"] = (stored.reshape(-1) if layout == "flat" else stored, rtype, shape)
            approx = approx + decode(stored, rtype, (m, n))
    nbytes = sum(int(a.nbytes) for a, _, _ in tensors.values())
    err = W - approx
    out_sqnr = None
    if gram is not None:
        g = np.asarray(gram, dtype=np.float64)
        sig, noise = np.einsum("ij,jk,ik->", W, g, W), np.einsum("ij,jk,ik->", err, g, err)
        out_sqnr = float("inf") if noise <= 0 else float(10 * np.log10(sig / noise))
    total = float(np.sum(s_all**2))
    return Compressed(
        tensors=tensors, rank=r, energy_kept=float(np.sum(s_all[:r] ** 2) / total) if total else 1.0,
        sqnr_db=sqnr_db(W, approx), output_sqnr_db=out_sqnr, bits_per_weight=8 * nbytes / (m * n),
        residual_type=rtype, residual_layout=layout, notes=notes, eps=eps,
    )
