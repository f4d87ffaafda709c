"""The R5 manifest: schema, discovery beside a model, and verification against the file."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, ValidationError

FREQ_RANK = {"high": 0, "medium": 1, "low": 2}


class Block(BaseModel):
    block_id: str
    access_frequency: Literal["high", "medium", "low"]
    rws_tier: Literal["HOT", "WARM", "STREAM"]
    offset_bytes: int = Field(ge=0)
    size_bytes: int = Field(ge=0)


class Manifest(BaseModel):
    aios_contract_version: str
    frequency_ordered: bool
    layout: list[Block]


class ManifestProblem(Exception):
    pass


def candidate_paths(model_path: Path) -> list[Path]:
    """The three sidecar locations (docs/design.md, "Manifest locations") for a .gguf file
    or an HF folder."""
    if model_path.is_dir():
        folder = model_path
        stems = [model_path.name] + sorted(p.stem for p in model_path.glob("*.safetensors"))
    else:
        folder, stems = model_path.parent, [model_path.stem]
    out = [folder / "aios_manifest.json"]
    out += [folder / f"{s}.aios.json" for s in dict.fromkeys(stems)]
    out.append(folder / "aios" / "manifest.json")
    return out


def parse_manifest(raw: str | bytes, where: str) -> Manifest:
    try:
        return Manifest.model_validate_json(raw)
    except ValidationError as e:
        first = e.errors()[0]
        loc = ".".join(str(x) for x in first["loc"])
        raise ManifestProblem(f"{where}: schema error at '{loc}': {first['msg']}") from e


def real_layout(model_path: Path, handle) -> dict[str, tuple[int, int]]:
    """block_id -> (absolute offset, size) as the file really stores it."""
    if handle.kind == "gguf":
        return {t.name: (int(t.data_offset), int(t.n_bytes)) for t in handle.store.reader.tensors}
    layout: dict[str, tuple[int, int]] = {}
    for st in sorted(model_path.glob("*.safetensors")):
        with open(st, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        for name, meta in header.items():
            if name == "__metadata__":
                continue
            b, e = meta["data_offsets"]
            layout[name] = (8 + n + b, e - b)
    return layout


def verify(manifest: Manifest, layout: dict[str, tuple[int, int]]) -> list[str]:
    """Problems, first mismatch first; empty when the manifest describes the file exactly."""
    problems: list[str] = []
    if not manifest.frequency_ordered:
        problems.append("manifest says frequency_ordered: false")
    last_rank, last_end = 0, -1
    for i, b in enumerate(manifest.layout):
        if b.block_id not in layout:
            problems.append(f"layout[{i}] block '{b.block_id}' does not exist in the file")
            continue
        off, size = layout[b.block_id]
        if (b.offset_bytes, b.size_bytes) != (off, size):
            problems.append(f"layout[{i}] '{b.block_id}' says offset {b.offset_bytes}, size "
                            f"{b.size_bytes}; the file has offset {off}, size {size}")
        rank = FREQ_RANK[b.access_frequency]
        if rank < last_rank:
            problems.append(f"layout[{i}] '{b.block_id}' is '{b.access_frequency}' after a lower-frequency block")
        if b.offset_bytes < last_end:
            problems.append(f"layout[{i}] '{b.block_id}' is not stored after the previous block")
        last_rank, last_end = max(last_rank, rank), b.offset_bytes + b.size_bytes
    listed = {b.block_id for b in manifest.layout}
    missing = [k for k in layout if k not in listed]
    if missing:
        problems.append(f"{len(missing)} tensors in the file are not in the manifest (first: '{missing[0]}')")
    return problems
