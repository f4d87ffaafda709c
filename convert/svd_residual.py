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
"""

from __future__ import annotations

import json
import re
import tempfile
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable

import numpy as np

from aios import quant
from aios.errors import UsageError
from aios.models import ModelHandle, resolve_model
from aios.models.from_gguf import hf_source

RESIDUALS = ("q8_0", "q5_0", "q4_0", "q4_k", "q2_k", "q6_k", "f16", "none")
K_TYPES = ("q4_k", "q2_k", "q6_k")
FACTOR_TYPES = ("f16", "f32", "q8_0")
METHODS = ("plain", "activation-aware")
BASE_TYPES = ("f32", "f16", "q8_0", "q4_0")
# a residual type whose blocks cannot tile the tensor at all falls back (declared per tensor)
RESIDUAL_FALLBACK = {"q4_k": "q4_0", "q2_k": "q4_0", "q6_k": "q8_0", "q8_0": "f16", "q5_0": "f16", "q4_0": "f16"}
EPS_REL = 1e-6  # Cholesky jitter, relative to the mean diagonal of XᵀX


@dataclass(frozen=True)
class SvdResidualConfig:
    """Converter config, embedded in the artifact (``aios.provenance``) and the report."""

    rank: int | str | None = None  # int or "full"
    energy: float | None = None
    bpw: float | None = None
    method: str = "activation-aware"
    residual: str = "q4_0"
    factor_type: str = "f16"
    outtype: str = "f16"  # embeddings, output head (as the plain export)
    calibration: str | None = None  # file name only (paths are machine-specific)
    samples: int | None = None
    max_tokens: int = 128
    seed: int = 0
    version: int = 1
    # FFN down projections with V and the residual neuron-major (lr_v.t, residual.t): the sparse
    # modes of aios-run read only firing neurons' rows (recorded in provenance only when on)
    sparse_down: bool = False
    # --like SOURCE.gguf (its file name): the plain tensors in SOURCE's type for the same tensor and
    # each residual in the type SOURCE has for the matrix it replaces (recorded only when given)
    like: str | None = None

    @property
    def selection(self) -> str:
        if self.rank is not None:
            return f"rank={self.rank}"
        if self.bpw is not None:
            return f"bpw={self.bpw:g}"
        return f"energy={self.energy if self.energy is not None else 0.95:g}"


def validate(cfg: SvdResidualConfig) -> SvdResidualConfig:
    """Return ``cfg`` (energy defaulted) or raise a one-sentence UsageError."""
    given = [k for k in ("rank", "energy", "bpw") if getattr(cfg, k) is not None]
    if len(given) > 1:
        raise UsageError(f"Choose one of --rank, --energy, --bpw (got {', '.join('--' + g for g in given)}).")
    if cfg.rank is not None and cfg.rank != "full" and (not isinstance(cfg.rank, int) or cfg.rank < 1):
        raise UsageError(f"--rank must be a positive integer or 'full', not '{cfg.rank}'.")
    if cfg.energy is not None and not 0 < cfg.energy <= 1:
        raise UsageError(f"--energy must be in (0, 1], not {cfg.energy:g}.")
    if cfg.bpw is not None and not cfg.bpw > 0:
        raise UsageError(f"--bpw must be positive, not {cfg.bpw:g}.")
    for value, allowed, opt in ((cfg.method, METHODS, "--method"), (cfg.residual, RESIDUALS, "--residual"),
                                (cfg.factor_type, FACTOR_TYPES, "--factor-type"), (cfg.outtype, BASE_TYPES, "--outtype")):
        if value not in allowed:
            raise UsageError(f"{opt} must be one of {', '.join(allowed)}, not '{value}'.")
    if cfg.max_tokens < 1 or (cfg.samples is not None and cfg.samples < 1):
        raise UsageError("--samples and --max-tokens must be positive.")
    if not given:
        from dataclasses import replace

        cfg = replace(cfg, energy=0.95)
    return cfg


# --- encoding (gguf-py quantizers; K-quants from convert.kquants) -----------------------------


def block_size(t: str) -> tuple[int, int]:
    """(values per block, bytes per block) of a GGML type."""
    return quant.block_size(t), quant.type_size(t)


def nbytes_of(n_values: int, t: str) -> int:
    return quant.row_bytes(t, n_values)


def encode(x: np.ndarray, t: str) -> np.ndarray:
    """float32 (rows, cols) -> stored array of type ``t`` (cols a multiple of the block)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if t == "f32":
        return x
    if t == "f16":
        return x.astype(np.float16)
    if t in K_TYPES:
        try:
            from convert import kquants
        except ImportError as e:
            raise UsageError(f"--residual {t} needs the K-quant encoders (convert/kquants.py), "
                             "which this installation lacks; use q4_0 or q8_0.") from e
        return kquants.quantize(x, t)
    from gguf import quants

    return quants.quantize(x, quant.qtype(t))


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
    """Factorize W (n_out, n_in) into stored U, V and residual per ``cfg`` (see module doc);
    ``neuron_major``: V and the residual stored transposed (``lr_v.t``, ``residual.t``)."""
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
        sqnr_db=_sqnr(W, approx), output_sqnr_db=out_sqnr, bits_per_weight=8 * nbytes / (m * n),
        residual_type=rtype, residual_layout=layout, notes=notes, eps=eps,
    )


def _sqnr(x: np.ndarray, y: np.ndarray) -> float:
    noise = float(np.linalg.norm(x - y))
    return float("inf") if noise == 0 else float(20 * np.log10(float(np.linalg.norm(x)) / noise))


# --- calibration ----------------------------------------------------------------------------


def collect_grams(handle: ModelHandle, sources: list[str], texts: list[str], max_tokens: int,
                  progress: Callable[[str], None] | None = None, batch_size: int = 32) -> tuple[dict[str, np.ndarray], int]:
    """XᵀX (float64, n_in × n_in) of the input of each module whose weight is in ``sources``.

    Forward pre-hooks on the HF modules; texts cut to ``max_tokens`` tokens, batched by length
    and right-padded, padded positions masked out (as the R1 measurement does). Returns the
    Gram matrices and the number of tokens seen.
    """
    import torch

    model = handle.load_torch(dtype="float32")
    tok = handle.load_tokenizer()
    grams: dict[str, torch.Tensor] = {}
    mask: list = [None]  # (B, T) bool of real (unpadded) positions in the running batch
    hooks = []

    def make_hook(src: str):
        def hook(_module, args):
            x = args[0].detach()[mask[0]].double()  # (real tokens, n_in)
            grams[src] = grams[src] + x.T @ x if src in grams else x.T @ x

        return hook

    for src in sources:
        module = model.get_submodule(src.removesuffix(".weight"))
        hooks.append(module.register_forward_pre_hook(make_hook(src)))
    encoded = [ids for ids in (tok(t, verbose=False)["input_ids"][:max_tokens] for t in texts) if ids]
    encoded.sort(key=len)  # similar lengths per batch: little padding
    n_tokens = 0
    try:
        with torch.inference_mode():
            for b0 in range(0, len(encoded), batch_size):
                batch = encoded[b0 : b0 + batch_size]
                T = max(len(ids) for ids in batch)
                input_ids = torch.zeros((len(batch), T), dtype=torch.long)
                mask[0] = torch.zeros((len(batch), T), dtype=torch.bool)
                for r, ids in enumerate(batch):  # right padding: causal attention keeps real positions exact
                    input_ids[r, : len(ids)] = torch.tensor(ids)
                    mask[0][r, : len(ids)] = True
                model(input_ids=input_ids, attention_mask=mask[0].long(), use_cache=False)
                n_tokens += int(mask[0].sum())
                if progress:
                    progress(f"calibration: {min(b0 + batch_size, len(encoded))}/{len(encoded)} texts")
    finally:
        for h in hooks:
            h.remove()
    return {k: v.numpy() for k, v in grams.items()}, n_tokens


# --- conversion -----------------------------------------------------------------------------


@dataclass
class TensorRow:
    name: str  # base name, e.g. blk.0.attn_qkv
    shape: tuple[int, int]
    rank: int
    energy_kept: float
    sqnr_db: float
    output_sqnr_db: float | None
    bits_per_weight: float
    residual_type: str
    residual_layout: str
    notes: list[str]


@dataclass
class SvdResidualResult:
    output: Path
    config: SvdResidualConfig
    rows: list[TensorRow]
    metadata: dict[str, object]
    calibration: dict | None
    warnings: list[str]
    total_bytes: int
    measured: dict | None = None  # held-out perplexity and MB/token from the runtime
    report_path: Path | None = None

    @property
    def bits_per_weight(self) -> float:
        params = sum(r.shape[0] * r.shape[1] for r in self.rows)
        return sum(r.bits_per_weight * r.shape[0] * r.shape[1] for r in self.rows) / max(1, params)

    def to_json(self) -> dict:
        return {"tool": "aios-convert svd-residual", "output": self.output.name, "config": asdict(self.config),
                "selection": self.config.selection, "calibration": self.calibration,
                "bits_per_weight_factorized": self.bits_per_weight, "tensor_bytes": self.total_bytes,
                "tensors": [asdict(r) for r in self.rows], "measured": self.measured,
                "evidence": {"tensors": "measured (reconstruction of the stored tensors)",
                             "measured": "measured (the GGUF run in aios-run: perplexity and byte counter)"},
                "warnings": self.warnings}


def is_factorized(p) -> bool:
    """2-D block weights (attention and FFN); embeddings, head, norms and biases stay plain."""
    return p.name.startswith("blk.") and p.name.endswith(".weight") and len(p.shape) == 2 and p.source is not None


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
        result = _write(handle, out, plan, entries, rows, cfg, calib)
    return result


def calibrate(model: str | ModelHandle, cfg: SvdResidualConfig, calibration: str | None = None,
              progress: Callable[[str], None] | None = None) -> tuple[dict[str, np.ndarray], dict]:
    """XᵀX of every factorized matrix's input on the calibration texts, and their description."""
    from aios.data import load_texts, texts_sha256
    from convert.gguf import check_exportable, plan_tensors

    handle = hf_source(model if isinstance(model, ModelHandle) else resolve_model(model))
    check_exportable(handle)
    texts = load_texts(calibration, cfg.samples)
    sources = [p.source for p in plan_tensors(handle, cfg.outtype) if is_factorized(p)]
    grams, n_tok = collect_grams(handle, sources, texts, cfg.max_tokens, progress)
    return grams, {"source": Path(calibration).name if calibration else "aios/data/calibration.jsonl",
                   "texts": len(texts), "tokens": n_tok, "max_tokens": cfg.max_tokens,
                   "texts_sha256": texts_sha256(texts)}


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


def lowrank_metadata(rows: list[TensorRow], cfg: SvdResidualConfig, calib: dict | None) -> dict[str, object]:
    """The ``aios.lowrank.*`` keys (per-tensor values as parallel arrays)."""
    meta: dict[str, object] = {
        "aios.lowrank.format": "W = lr_u (n_out x r) @ lr_v (r x n_in) + residual; residual rows (n_out x n_in) "
                               "or flat (n_out*n_in,) row-major in 256-value K-quant blocks; no .weight",
        "aios.lowrank.method": cfg.method,
        "aios.lowrank.selection": cfg.selection,
        "aios.lowrank.residual": cfg.residual if not cfg.like or cfg.residual == "none" else f"like {cfg.like}",
        "aios.lowrank.factor_type": cfg.factor_type,
        "aios.lowrank.tensors": [r.name for r in rows],
        "aios.lowrank.ranks": [r.rank for r in rows],
        "aios.lowrank.energy_kept": [round(r.energy_kept, 6) for r in rows],
        "aios.lowrank.bits_per_weight": [round(r.bits_per_weight, 4) for r in rows],
        "aios.lowrank.residual_types": [r.residual_type for r in rows],
        "aios.lowrank.residual_layouts": [r.residual_layout for r in rows],
        "aios.lowrank.runtime": "aios-run only: llama.cpp finds no blk.N.X.weight and cannot load this file",
        "aios.llama_cpp.loadable": False,
    }
    notes = [f"{r.name}: {n}" for r in rows for n in r.notes]
    if notes:
        meta["aios.lowrank.fallbacks"] = notes
    if cfg.sparse_down:
        from convert.gguf.metadata import sparse_down_keys

        meta.update(sparse_down_keys(sum(1 for r in rows if NEURON_MAJOR_DOWN.fullmatch(r.name + ".weight")),
                                     SPARSE_DOWN_FORMAT))
    if calib:
        meta["aios.lowrank.calibration"] = json.dumps(calib, sort_keys=True)
    return meta


SPARSE_DOWN_FORMAT = ("blk.N.ffn_down = lr_u (d_model x r) @ lr_v + residual with lr_v.t (d_ffn x r) = lr_vᵀ and "
                      "residual.t (d_ffn x d_model) = residualᵀ stored neuron-major (row j = neuron j, the residual "
                      "quantized along d_model), so exact-sparse runs read only firing neurons' rows of lr_v.t and "
                      "residual.t, and lr_u whole")
SPARSE_DOWN_WARNING = ("--sparse-down stores every FFN down projection's lr_v and residual neuron-major "
                       "(blk.N.ffn_down.lr_v.t, .residual.t): the file is for aios-run (all modes); llama.cpp cannot "
                       "load it, as it cannot load any svd-residual file")


def _write(handle, out: Path, tensors, entries, rows, cfg: SvdResidualConfig, calib) -> SvdResidualResult:
    """The standard plan with each factorized matrix replaced by its factors and residual."""
    from convert.gguf import ExportPlan, PlannedTensor, aios_metadata, provenance, write_plan
    from convert.gguf.tokenizer import read_tokenizer

    plan = ExportPlan(handle, cfg.outtype, [])
    for p in tensors:
        if p.name not in entries:
            plan.tensors.append(p)
            continue
        for name, t, shape, f in entries[p.name]:
            nbytes = int(np.load(f, mmap_mode="r").nbytes)
            plan.tensors.append(PlannedTensor(name, None, shape, p.source_dtype, t, nbytes,
                                              data=lambda f=f: np.load(f, mmap_mode="r")))
    plan.sort()
    converter_config = asdict(cfg)
    for key in ("sparse_down", "like"):  # recorded only when on: older exports keep their bytes
        if not converter_config[key]:
            del converter_config[key]
    prov = provenance(handle, command="aios-convert svd-residual", converter_config=converter_config)
    meta, warnings, _ = aios_metadata(handle, cfg.outtype, plan.fallbacks, prov)
    if cfg.sparse_down:
        warnings.append(SPARSE_DOWN_WARNING)
    meta.update(lowrank_metadata(rows, cfg, calib))
    plan.metadata = meta
    plan.tokenizer = read_tokenizer(handle.path, handle.facts.vocab_size)
    write_plan(plan, out)
    return SvdResidualResult(out, cfg, rows, meta, calib, warnings, plan.total_bytes)
