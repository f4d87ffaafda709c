"""What every check receives: the calibration set, options, progress, and shared caches."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from contract.spec import CURRENT_VERSION, requirement

Progress = Callable[[str, int, int], None]  # (task description, done, total)


def no_progress(_task: str, _done: int, _total: int) -> None:
    """The default :data:`Progress`: report nothing (library callers without a bar)."""


@dataclass
class CheckContext:
    calibration_texts: list[str]
    calibration_source: str = "bundled"
    max_tokens: int = 128
    context: int = 4096
    spec_version: str = CURRENT_VERSION
    progress: Progress = no_progress
    cache: dict[str, Any] = field(default_factory=dict)  # shared measurements (e.g. R1 stats)
    keep_model: bool = False  # keep R1's loaded (model, tokenizer) in cache["torch_model"] (quality gate)
    full_calibration: bool = False  # R1 on a GGUF: every text, even once pass/fail is settled

    def spec(self, rid: str) -> dict[str, Any]:
        return requirement(rid, self.spec_version)


def fmt_bytes(n: float, *, group_bytes: bool = True) -> str:
    """``n`` bytes in the largest binary unit it reaches (2 decimals), else plain bytes.

    The one byte formatter of the checks and ``aios-contract inspect``. ``group_bytes=False``
    prints sub-KiB counts without a thousands separator ("1000 B"), as ``inspect`` always has.
    """
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:,.2f} {unit}"
    return f"{n:,.0f} B" if group_bytes else f"{n:.0f} B"
