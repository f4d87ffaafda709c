"""Text sets shipped with the package, and loading of user text files.

- ``calibration.jsonl``: prompts written for this project (prose, code, dialogue, lists,
  numbers, several languages) used to measure activation statistics.
- ``heldout.jsonl``: separate passages for perplexity; never used for calibration.

User files: JSONL with a ``text`` field per line, or plain text (blank-line separated
paragraphs become separate samples). Empty samples are skipped; a file with none left is refused.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from aios.errors import InvalidModelError, ModelNotFoundError

DATA_DIR = Path(__file__).resolve().parent
CALIBRATION_FILE = DATA_DIR / "calibration.jsonl"
HELDOUT_FILE = DATA_DIR / "heldout.jsonl"


class BadTextFileError(InvalidModelError):
    """A calibration / evaluation text file that cannot be used (exit code 4)."""


def load_texts(path: str | Path | None = None, limit: int | None = None) -> list[str]:
    """Texts from a JSONL (``text`` field) or TXT file; the bundled calibration set by default."""
    p = Path(path) if path is not None else CALIBRATION_FILE
    if not p.is_file():
        raise ModelNotFoundError(f"Text file not found: {p}.")
    try:
        raw = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise BadTextFileError(f"{p} is not UTF-8 text ({e.reason} at byte {e.start}).") from e
    if p.suffix in {".jsonl", ".ndjson"}:
        texts = []
        for lineno, line in enumerate(raw.splitlines(), 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except (ValueError, RecursionError) as e:  # RecursionError: absurdly deep nesting
                raise BadTextFileError(f"{p}:{lineno} is not valid JSON ({e}).") from None
            if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
                raise BadTextFileError(f"{p}:{lineno} has no string field 'text'.")
            if obj["text"].strip():  # an empty sample has no tokens to measure: skip it
                texts.append(obj["text"])
    else:
        texts = [blk.strip() for blk in raw.split("\n\n") if blk.strip()]
    if not texts:
        # never a measurement over zero tokens ("measured 0.0 %"): exit 4, one sentence
        raise BadTextFileError(f"{p} contains no text samples (every sample is empty); "
                               "pass a file with text to measure.")
    return texts[:limit] if limit else texts


def load_heldout(limit: int | None = None) -> list[str]:
    return load_texts(HELDOUT_FILE, limit)


def texts_sha256(texts: list[str]) -> str:
    """Stable digest of a text set, for provenance (order-sensitive)."""
    h = hashlib.sha256()
    for t in texts:
        h.update(t.encode("utf-8"))
        h.update(b"\0")
    return h.hexdigest()
