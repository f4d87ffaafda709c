"""Read the JSON files the toolchain writes and tell which kind each one is.

Kinds: ``check`` (``aios-contract check``, validated against :class:`CheckReport`), ``bench``
(``aios-run bench``), ``relufy`` (the provenance ``aios-convert relufy`` writes) and
``compare`` (``aios-contract compare``). A relufy input needs a curve or before/after metrics:

    {"curve": [{"step": 0, "exact_zero_fraction": 0.0, "heldout_ppl": 48.9}, ...],
     "metrics": {"before": {...}, "after_swap": {...}, "after": {...}},  # optional, shown as a table
     "steps": 400, "source": {"model": "..."}, "config": {...}}          # optional provenance

``aios-convert relufy`` writes this as ``aios_relufy.json`` in its output folder, naming the
curve values ``mean_exact_zero_fraction`` and ``heldout_perplexity``; both spellings are read.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from aios.errors import InvalidModelError
from contract.result import CheckReport

KINDS = ("check", "bench", "relufy", "compare")


class InvalidReportError(InvalidModelError):
    """A report file that is missing, not JSON, or not a report this tool can read (exit 4)."""


def read_json(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise InvalidReportError(f"No such report file: {path}.")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:  # deep nesting too
        raise InvalidReportError(f"{path} is not JSON ({e.__class__.__name__}: {e}).") from None
    if not isinstance(data, dict):
        raise InvalidReportError(f"{path} holds a JSON {type(data).__name__}, not a report object.")
    return data


def detect_kind(data: dict[str, Any]) -> str | None:
    tool = str(data.get("tool", ""))
    if tool == "aios-contract compare" or ("changes" in data and "a" in data and "b" in data):
        return "compare"
    if "requirements" in data and "gate" in data:
        return "check"
    if tool == "aios-run bench" or ("rows" in data and "baseline" in data):
        return "bench"
    if tool.startswith("aios-convert") or isinstance(data.get("curve"), list):
        return "relufy"
    return None


def load_report(path: str | Path) -> tuple[str, Any]:
    """(kind, content): a :class:`CheckReport` for check reports, the plain dict otherwise."""
    data = read_json(path)
    kind = detect_kind(data)
    if kind is None:
        raise InvalidReportError(
            f"{path} is not a report of aios-contract check/compare, aios-run bench or aios-convert relufy.")
    if kind == "check":
        return kind, check_report(data, path)
    if kind == "bench" and not isinstance(data.get("rows"), list):
        raise InvalidReportError(f"{path}: bench result without a 'rows' list.")
    if kind == "relufy":
        curve = data.get("curve") or []
        if not all(isinstance(c, dict) and "step" in c for c in curve):
            raise InvalidReportError(f"{path}: every curve point needs a 'step' (see reports/load.py).")
    return kind, data


def check_report(data: dict[str, Any], path: str | Path = "report") -> CheckReport:
    try:
        return CheckReport.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        raise InvalidReportError(f"{path} is not a valid check report: {where}: {first['msg']}.") from None


def load_check_report(path: str | Path) -> CheckReport:
    kind, content = load_report(path)
    if kind != "check":
        raise InvalidReportError(f"{path} is a {kind} result, not an aios-contract check report.")
    return content


def load_bench(path: str | Path) -> dict[str, Any]:
    kind, content = load_report(path)
    if kind != "bench":
        raise InvalidReportError(f"{path} is a {kind} result, not an aios-run bench JSON.")
    return content
