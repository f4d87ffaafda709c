"""What determines a sparsify run and what it reports: the config (checked before the model
loads), the result, and the vocabularies ``convert/cli.py`` offers (torch-free)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from aios.errors import UsageError
from runtime.thresholds import SITES

# uniform: every layer at the target (the default: on the real Gemma 3 270M, held-out perplexity
# ratio at 50 % 1.051 uniform, 1.057 greedy by local error scaled by one KL, 1.083 greedy by KL at
# three levels; docs/benchmarks.md "Training-free sparsity"); greedy: per-layer levels by
# measured sensitivity (the Sensitivity and Allocation steps of the module docstring)
ALLOCATIONS = ("uniform", "greedy")
# Where FFNs are cut by default (key: the FFN is gated). Measured on the real Gemma 3 270M
# (docs/benchmarks.md, "Training-free sparsity"), uniform 50 % per layer, held-out perplexity
# ratio: down_in 1.058, gate 1.335 (1.282 with per-neuron weights). The gate site also skips the
# up rows (twice the bytes at one zero fraction) and is kept as --site gate.
DEFAULT_SITE = {True: "down_in", False: "down_in"}
KEY_PREFIX = "aios.ffn_threshold."
# what is cut: ffn = the FFN's site alone; all = also the inputs of q/k/v, o and gate/up (TEAL;
# convert/sparsify/sites.py)
SCOPES = ("ffn", "all")
# --target r1: the contract's R1 floor (contract/spec/contract-1.0.json R1 min_mean_zero_fraction)
# and the margin aimed above it on held-out texts calibration never saw (aios/data/heldout.jsonl:
# prose, code, dialogue, lists, like the checker's texts). On the real Gemma 3 270M a cut
# calibrated to 70 % on pydoc measured 70.2 % on pydoc's held-out split and 67.7 % on the
# checker's texts: the text moves the zero fraction by points, so aim 2 above the floor there.
R1_FLOOR = 0.70
R1_MARGIN = 0.02
Progress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class SparsifyConfig:
    """What ``aios-convert sparsify`` was asked for (recorded in the file, ``aios.ffn_threshold.config``)."""

    target: float | None = 0.5  # mean zero fraction over FFN layers on the calibration tokens
    max_ppl_ratio: float | None = None  # instead of target: the sparsest file within this ratio
    site: str | None = None  # None: DEFAULT_SITE of the FFN kind
    allocation: str = "uniform"  # measured best on the real Gemma 3 270M (ALLOCATIONS)
    calibration: str | None = None  # JSONL/TXT file; None: the fixtures' pydoc train split
    tokens: int = 2048  # calibration tokens (curves and cut values)
    sensitivity_tokens: int = 256  # tokens of each layer's KL pass
    window: int = 256  # tokens per forward pass (each window starts with BOS where the model uses one)
    heldout_tokens: int = 4096  # held-out tokens of the report's perplexity and zero fraction (0: skip)
    max_layer_sparsity: float = 0.95
    sparse_down: bool = False  # store FFN down projections neuron-major (re-encoded)
    input_major: bool = False  # store every matrix a cut input feeds input-major (re-encoded)
    input_major_type: str = "wider"  # re-encoded in: wider (one step more bits) | same (convert/sparsify/write.py)
    scope: str = "ffn"  # SCOPES
    aim_r1: bool = False  # --target r1: raise the target until held-out texts measure R1_FLOOR + R1_MARGIN

    def check(self, gated: bool) -> None:
        if (self.target is None) == (self.max_ppl_ratio is None):
            raise UsageError("Give one of --target and --max-ppl-ratio.")
        if self.target is not None and not 0 < self.target < 1:
            raise UsageError(f"--target is a zero fraction between 0 and 1; got {self.target}.")
        if self.target is not None and self.target > self.max_layer_sparsity:
            raise UsageError(f"--target {self.target} is above the per-layer cap {self.max_layer_sparsity}.")
        if self.max_ppl_ratio is not None and not self.max_ppl_ratio > 1:
            raise UsageError(f"--max-ppl-ratio is a perplexity ratio above 1; got {self.max_ppl_ratio}.")
        if self.site is not None and self.site not in SITES:
            raise UsageError(f"--site is one of {', '.join(SITES)}; got {self.site!r}.")
        if self.site == "gate" and not gated:
            raise UsageError("--site gate needs a gated FFN (SwiGLU, GeGLU); this model's FFN has no gate: "
                             "use --site down_in.")
        if self.scope not in SCOPES:
            raise UsageError(f"--scope is one of {', '.join(SCOPES)}; got {self.scope!r}.")
        if self.input_major_type not in ("wider", "same"):
            raise UsageError(f"--input-major-type is wider or same; got {self.input_major_type!r}.")
        if self.allocation not in ALLOCATIONS:
            raise UsageError(f"--allocation is one of {', '.join(ALLOCATIONS)}; got {self.allocation!r}.")
        for name in ("tokens", "sensitivity_tokens", "window"):
            if getattr(self, name) < 2:
                raise UsageError(f"--{name.replace('_', '-')} must be at least 2; got {getattr(self, name)}.")


@dataclass
class SparsifyResult:
    output: Path | None
    site: str
    target: float
    layer_sparsity: list[float]
    thresholds: list[float]  # per layer: its cut, or the median of its per-neuron cuts (per_neuron)
    calibration: dict
    heldout: dict = field(default_factory=dict)
    seconds: dict = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    per_neuron: bool = False  # the file holds one cut per neuron (gate site)
    scope: str = "ffn"
    # --scope all: per input site (runtime.thresholds.INPUT_SITES), one cut per layer
    input_thresholds: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        d = asdict(self)
        d["output"] = None if self.output is None else str(self.output)
        return d

