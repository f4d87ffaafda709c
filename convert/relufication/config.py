"""What determines a relufy run: its config, the activations it accepts, its file names.

Shared by ``convert/relufy.py`` (the entry point users import; it re-exports these names) and
``convert/relufication/run.py`` (the run itself), so neither has to import the other's module to
know them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Callable

from aios.errors import UsageError

CONFIG_VERSION = 2  # 2: density weights of the L1 penalty lag one step (engine)
ACTIVATIONS = ("relu", "relu2")
DEVICES = ("auto", "cpu", "cuda")  # where the fine-tune runs; auto: cuda when torch sees one
PROVENANCE_FILE = "aios_relufy.json"


@dataclass(frozen=True)
class RelufyConfig:
    """Everything that determines the output weights (embedded in the provenance).

    The defaults reach R1 (≥ 0.85 exact zeros, ≤ 1.10 × held-out perplexity) on the bundled
    tiny-falcon in a few CPU minutes; see benchmarks/relufy_curve.py.
    """

    version: int = CONFIG_VERSION
    activation: str = "relu"
    steps: int = 150
    lr: float = 2e-3  # peak learning rate
    batch: int = 16  # windows per step
    seq_len: int = 128  # tokens per window
    l1: float = 6.0  # final weight of the activation-L1 penalty (0 = off)
    l1_start: float = 0.1  # fraction of the steps before the penalty starts rising
    l1_full: float = 0.6  # fraction of the steps at which it reaches ``l1``
    warmup_frac: float = 0.05
    min_lr_frac: float = 0.1  # cosine decays to this fraction of the peak
    weight_decay: float = 0.1  # AdamW, matrices only
    clip: float = 1.0  # gradient-norm clipping
    seed: int = 0
    # warm start (--init-thresholds) only: fraction of the steps over which the FFN activation
    # moves linearly from the source's (GELU/SiLU, with the cut: the sparsified model) to
    # ``activation``; 0 swaps at the first step as a plain run does
    anneal: float = 0.5

    def validate(self) -> None:
        if self.activation not in ACTIVATIONS:
            raise UsageError(f"Unknown activation '{self.activation}'; "
                             f"choose from {', '.join(ACTIVATIONS)}.")
        positive = {"steps": self.steps, "lr": self.lr, "batch": self.batch,
                    "seq_len": self.seq_len, "clip": self.clip}
        for name, value in positive.items():
            if not value > 0:
                raise UsageError(f"--{name.replace('_', '-')} must be positive (got {value}).")
        if self.l1 < 0 or self.weight_decay < 0:
            raise UsageError("--l1 and the weight decay must be ≥ 0.")
        if not 0 <= self.anneal <= 1:
            raise UsageError(f"--anneal must be between 0 and 1 (got {self.anneal}).")
        if not 0 <= self.l1_start <= self.l1_full <= 1 or not 0 <= self.warmup_frac < 1:
            raise UsageError("Schedule fractions must satisfy 0 ≤ l1_start ≤ l1_full ≤ 1 "
                             "and 0 ≤ warmup < 1.")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RelufyConfig":
        if d.get("version") != CONFIG_VERSION:
            raise UsageError(f"Relufy config version {d.get('version')} is not supported "
                             f"(this tool writes version {CONFIG_VERSION}).")
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


ProgressFn = Callable[..., None]  # progress(event, **info); events: phase, step, eval
