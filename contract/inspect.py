"""``aios-contract inspect``: architecture facts and the tensor inventory, from headers only."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from aios import __version__
from aios.models import ModelHandle, resolve_model

INSPECT_SCHEMA_VERSION = "1"


def inspect_model(model: str | ModelHandle) -> dict[str, Any]:
    """Facts (evidence: declared by config/metadata) and, when weights exist, the inventory.

    No tensor data is read: shapes, dtypes and byte counts come from safetensors headers
    or GGUF tensor infos.
    """
    handle = model if isinstance(model, ModelHandle) else resolve_model(model)
    report: dict[str, Any] = {
        "schema_version": INSPECT_SCHEMA_VERSION,
        "tool_version": __version__,
        "model": handle.describe(),
        "facts_evidence": "declared",
        "llama_cpp_ffn_activation": handle.llama_cpp_activation,
        "tensors": None,
        "totals": None,
    }
    if handle.has_weights:
        inv = handle.tensor_inventory()
        by_dtype: dict[str, dict[str, int]] = defaultdict(lambda: {"tensors": 0, "bytes": 0, "params": 0})
        for t in inv:
            d = by_dtype[t.dtype]
            d["tensors"] += 1
            d["bytes"] += t.nbytes
            d["params"] += t.n_elements
        report["tensors"] = [
            {"name": t.name, "shape": list(t.shape), "dtype": t.dtype, "bytes": t.nbytes, "file": t.file}
            for t in inv
        ]
        report["totals"] = {
            "tensors": len(inv),
            "params": sum(t.n_elements for t in inv),
            "bytes": sum(t.nbytes for t in inv),
            "by_dtype": dict(sorted(by_dtype.items())),
        }
    return report
