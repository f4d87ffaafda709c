"""What determines an svd-residual conversion: its config, the choices it accepts, and their
validation (``aios-convert svd-residual``'s options; torch-free, read by ``convert/cli.py``)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from aios.errors import UsageError

RESIDUALS = ("q8_0", "q5_0", "q4_0", "q4_k", "q2_k", "q6_k", "f16", "none")
K_TYPES = ("q4_k", "q2_k", "q6_k")
FACTOR_TYPES = ("f16", "f32", "q8_0")
METHODS = ("plain", "activation-aware")
BASE_TYPES = ("f32", "f16", "q8_0", "q4_0")
# a residual type whose blocks cannot tile the tensor at all falls back (declared per tensor)
RESIDUAL_FALLBACK = {"q4_k": "q4_0", "q2_k": "q4_0", "q6_k": "q8_0", "q8_0": "f16", "q5_0": "f16", "q4_0": "f16"}


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
        cfg = replace(cfg, energy=0.95)
    return cfg
