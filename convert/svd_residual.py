"""``aios-convert svd-residual``: W ≈ U·V + Q(E) as a GGUF the AIOS runtime executes.

Every 2-D block weight (attention and FFN matrices) is factorized after llama.cpp's layout
transform (Falcon QKV regrouped, Llama q/k permuted), so the runtime reads the file exactly as
a plain export; embeddings, output head, norms and biases are written as ``aios-convert gguf``
writes them. Per factorized matrix the file holds

    blk.N.X.lr_u      (n_out × r)   factor type (F16 by default)
    blk.N.X.lr_v      (r × n_in)
    blk.N.X.residual  (n_out × n_in) Q8_0/Q4_0 rows, or K-quant *flat*: the row-major values
                      (n_out·n_in,) in 256-value super-blocks that may span rows (so a 2-bit or
                      4-bit K residual exists on 128-wide rows); absent with --residual none

and no ``blk.N.X.weight``, so llama.cpp cannot load it (``aios.llama_cpp.loadable`` false).

With ``--sparse-down`` (``SvdResidualConfig.sparse_down``) each FFN down projection
(W: d_model × d_ffn) is stored neuron-major, so aios-run's sparse modes read only the firing
neurons' rows:

    blk.N.ffn_down.lr_u        (d_model × r)   as above (read whole: U·z needs every row)
    blk.N.ffn_down.lr_v.t      (d_ffn × r)     Vᵀ, factor type along r (F16 when r does not fill its blocks)
    blk.N.ffn_down.residual.t  (d_ffn × d_model) Eᵀ in rows quantized along d_model (layout
                               "neuron-major"); a type whose blocks do not divide d_model falls
                               back as a residual does (Q4_K/Q2_K -> Q4_0, Q6_K -> Q8_0, -> F16);
                               no flat layout

and ``aios.sparse_down.*`` declares it. The factors and E are the same SVD as without the
option; E = W − deq(U)·deq(Vᵀ)ᵀ absorbs the rounding of the stored Vᵀ.

Math (pure functions below): truncated SVD, either of W (``plain``) or of W·S with
S = chol(XᵀX + εI) from calibration activations (``activation-aware``, SVD-LLM-style
whitening, float64; ε grows tenfold while Cholesky fails), so the truncation minimises
‖(W − Ŵ)Xᵀ‖ instead of ‖W − Ŵ‖. The residual E = W − deq(U)·deq(V) is computed from the
*stored* factors, so it also absorbs their rounding. Rank per matrix: ``--rank``, the smallest
rank keeping ``--energy`` of the (whitened) spectrum, or the largest rank whose U, V and
residual fit ``--bpw`` bits per weight.

The code, by concept, is in ``convert/lowrank/``: ``config`` (options and their validation),
``factorize`` (storage rules and the math), ``calibrate`` (XᵀX from calibration texts),
``write`` (the GGUF and its ``aios.lowrank.*`` keys) and ``cli`` (the report). This module is
the entry point: :func:`svd_residual`, and the names its callers use, re-exported.
"""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Callable

import numpy as np

from aios.errors import UsageError
from aios.models import ModelHandle, resolve_model
from aios.models.from_gguf import hf_source
from convert.gguf.tensors import encode
from convert.lowrank.calibrate import calibrate, collect_grams
from convert.lowrank.config import (
    BASE_TYPES,
    FACTOR_TYPES,
    K_TYPES,
    METHODS,
    RESIDUAL_FALLBACK,
    RESIDUALS,
    SvdResidualConfig,
    validate,
)
from convert.lowrank.factorize import (
    EPS_REL,
    NEURON_MAJOR_DOWN,
    Compressed,
    block_size,
    choose_rank,
    compress,
    decode,
    factor_type_for,
    is_factorized,
    nbytes_of,
    neuron_major_residual_layout,
    residual_layout,
    whitening_factor,
)
from convert.lowrank.write import (
    SPARSE_DOWN_FORMAT,
    SPARSE_DOWN_WARNING,
    SvdResidualResult,
    TensorRow,
    lowrank_metadata,
    write_lowrank_gguf,
)

__all__ = ["BASE_TYPES", "EPS_REL", "FACTOR_TYPES", "K_TYPES", "METHODS", "NEURON_MAJOR_DOWN", "RESIDUALS",
           "RESIDUAL_FALLBACK", "SPARSE_DOWN_FORMAT", "SPARSE_DOWN_WARNING", "Compressed", "SvdResidualConfig",
           "SvdResidualResult", "TensorRow", "block_size", "calibrate", "choose_rank", "collect_grams", "compress",
           "decode", "encode", "factor_type_for", "is_factorized", "like_residual", "lowrank_metadata", "nbytes_of",
           "neuron_major_residual_layout", "residual_layout", "svd_residual", "validate", "whitening_factor"]


def svd_residual(model: str | ModelHandle, output: str | Path, cfg: SvdResidualConfig, *,
                 calibration: str | None = None, progress: Callable[[str], None] | None = None,
                 grams: tuple[dict[str, np.ndarray], dict] | None = None,
                 like: str | Path | None = None) -> SvdResidualResult:
    """Convert ``model`` to a low-rank + residual GGUF at ``output`` (written atomically).

    ``grams``: (XᵀX per source tensor, calibration description) from an earlier
    :func:`calibrate` of the same model and texts, so a sweep calibrates once. ``like``: a GGUF
    (e.g. the quantized file ``model`` was dequantized from) whose per-tensor types the plain
    tensors and the residuals take (:func:`like_residual`), instead of ``outtype`` and ``residual``.
    """
    from convert.gguf import check_exportable, plan_tensors
    from convert.gguf.tensors import like_types

    cfg = validate(cfg)
    out = Path(output)
    if out.is_dir():
        raise UsageError(f"-o {out} is a folder; pass a file name such as {out / 'model.gguf'}.")
    like_map = None
    if like is not None:
        like_map, _ = like_types(like)
        cfg = replace(cfg, like=Path(like).name)
    handle = hf_source(model if isinstance(model, ModelHandle) else resolve_model(model))
    check_exportable(handle)
    plan = plan_tensors(handle, cfg.outtype, like=like_map)
    targets = [p for p in plan if is_factorized(p)]
    gram_by_source: dict[str, np.ndarray] = {}
    calib = None
    if cfg.method == "activation-aware":
        gram_by_source, calib = grams if grams is not None else calibrate(handle, cfg, calibration, progress)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{out.name}.", dir=out.parent) as scratch:
        rows, entries = _compress_all(handle, targets, gram_by_source, cfg, Path(scratch), progress, like_map)
        result = write_lowrank_gguf(handle, out, plan, entries, rows, cfg, calib)
    return result


def like_residual(source_type: str) -> str:
    """The residual type for a matrix SOURCE stores as ``source_type`` (``like_types``' choice,
    lower case): the same where the residual encoder has it, else F16 (F32/BF16 sources)."""
    return source_type if source_type in RESIDUALS else "f16"


def _compress_all(handle, targets, grams, cfg, scratch: Path, progress, like=None):
    """Factorize each target; encoded arrays go to ``scratch`` (so memory stays ~one tensor)."""
    from convert.gguf.tensors import source_rows

    rows: list[TensorRow] = []
    entries: dict[str, list[tuple[str, str, tuple[int, ...], Path]]] = {}
    for k, p in enumerate(targets):
        W = source_rows(handle, p)(0, p.shape[0])  # laid out as llama.cpp stores it
        tcfg = cfg
        if like and p.name in like and cfg.residual != "none":
            tcfg = replace(cfg, residual=like_residual(like[p.name][0]))
        c = compress(W, tcfg, grams.get(p.source),
                     neuron_major=cfg.sparse_down and bool(NEURON_MAJOR_DOWN.fullmatch(p.name)))
        base = p.name.removesuffix(".weight")
        entries[p.name] = []
        for suffix, (arr, t, shape) in c.tensors.items():
            f = scratch / f"{base}.{suffix}.npy"
            np.save(f, arr)
            entries[p.name].append((f"{base}.{suffix}", t, shape, f))
        rows.append(TensorRow(base, p.shape, c.rank, c.energy_kept, c.sqnr_db, c.output_sqnr_db,
                              c.bits_per_weight, c.residual_type, c.residual_layout, c.notes))
        if progress:
            progress(f"{k + 1}/{len(targets)} {base}: rank {c.rank}, {c.bits_per_weight:.2f} bits/weight, "
                     f"SQNR {c.sqnr_db:.1f} dB")
    return rows, entries
