"""The contract as versioned data: thresholds, zones and tiers live in ``contract-<v>.json``.

Prose lives in ``CONTRACT.md``. Checks read every threshold from here; none is hard-coded
in a check module. ``contract.spec`` (with the R5 manifest format, :mod:`contract.spec.manifest`)
is the contract's published data: it imports nothing else from ``contract``, so converters and
the runtime may read it without depending on the checker (docs/design.md, "Layering").
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

SPEC_DIR = Path(__file__).resolve().parent
CURRENT_VERSION = "1.0"


@lru_cache(maxsize=None)
def load_spec(version: str = CURRENT_VERSION) -> dict[str, Any]:
    path = SPEC_DIR / f"contract-{version}.json"
    if not path.is_file():
        from aios.errors import UsageError

        raise UsageError(f"Unknown contract version '{version}'; known: {CURRENT_VERSION}.")
    return json.loads(path.read_text(encoding="utf-8"))


def requirement(rid: str, version: str = CURRENT_VERSION) -> dict[str, Any]:
    return load_spec(version)["requirements"][rid]


def tiers(version: str = CURRENT_VERSION) -> list[dict[str, Any]]:
    return load_spec(version)["tiers"]


def tier_ids(version: str = CURRENT_VERSION) -> tuple[str, ...]:
    """The tier ids in contract order (``--require-tier`` choices)."""
    return tuple(t["id"] for t in tiers(version))


def zone_threshold(layer: int, n_layers: int, version: str = CURRENT_VERSION) -> float:
    """Aliasing cosine threshold for ``layer`` by its relative depth (docs/design.md, "Aliasing zones")."""
    depth = layer / n_layers
    for z in requirement("R3", version)["zone_cosine_thresholds"]:
        if z["from"] <= depth < z["to"]:
            return float(z["min_cosine"])
    return float(requirement("R3", version)["zone_cosine_thresholds"][-1]["min_cosine"])
