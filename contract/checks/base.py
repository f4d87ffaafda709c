"""What every check receives: the calibration set, options, progress, and shared caches."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from contract.spec import CURRENT_VERSION, requirement

Progress = Callable[[str, int, int], None]  # (task description, done, total)


def _no_progress(_task: str, _done: int, _total: int) -> None:
    pass


@dataclass
class CheckContext:
    calibration_texts: list[str]
    calibration_source: str = "bundled"
    max_tokens: int = 128
    context: int = 4096
    spec_version: str = CURRENT_VERSION
    progress: Progress = _no_progress
    cache: dict[str, Any] = field(default_factory=dict)  # shared measurements (e.g. R1 stats)

    def spec(self, rid: str) -> dict[str, Any]:
        return requirement(rid, self.spec_version)


def fmt_bytes(n: float) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:,.2f} {unit}"
    return f"{n:,.0f} B"
