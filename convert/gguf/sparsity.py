"""Sparsity maps embedded in a GGUF: ``blk.N.ffn_active`` masks and ``aios.sparsity.*`` keys.

Map file format read here (the sparsity-map converter, ``convert/sparsity_map/__init__.py``,
must write exactly this; keep the two in step):

- ``MAP.npz`` with one array ``layer_<i>`` per FFN layer ``i``: shape (d_ffn,), bool or 0/1
  integers, 1 = neuron kept (may fire), 0 = neuron pruned (always zero, its rows skipped);
- optional JSON header beside it, ``MAP.json`` (or an array ``header`` inside the npz holding
  a JSON string), an object such as ``{"mode": "balanced", "calibration_sha256": ...}``.

In the GGUF each mask becomes an ``F32`` tensor ``blk.N.ffn_active`` of shape (d_ffn,) holding
1.0 / 0.0: F32 is the one type every reader tolerates (gguf-py's ``dequantize`` and so
transformers' GGUF loader reject I8), and 4 bytes per neuron is noise next to the weights
(Falcon-7B: 2.3 MB). llama.cpp refuses files
with tensors its architecture does not know ("wrong number of tensors"), so a GGUF carrying
a sparsity map is for the AIOS runtime; the export says so in its output and metadata.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np

from aios.errors import InvalidModelError, ModelNotFoundError

TENSOR_NAME = "blk.{i}.ffn_active"
MAX_MEMBER_BYTES = 1 << 26  # a mask is d_ffn entries (Falcon-180B: 29,696); headers are a few KB


def _read_npz(p: Path) -> dict[str, np.ndarray]:
    """Every array of the npz, after checking sizes: no member (declared or stored) may be
    larger than ``MAX_MEMBER_BYTES``, and an array header may not declare more data than its
    member holds, so a hostile map cannot make numpy allocate terabytes."""
    fmt = np.lib.format
    try:
        with zipfile.ZipFile(p) as zf:
            for info in zf.infolist():
                if info.file_size > MAX_MEMBER_BYTES:
                    raise InvalidModelError(f"{p}: member '{info.filename}' declares {info.file_size:,} "
                                            f"bytes (at most {MAX_MEMBER_BYTES:,}).")
                with zf.open(info) as fh:
                    read = {(1, 0): fmt.read_array_header_1_0, (2, 0): fmt.read_array_header_2_0}.get(
                        fmt.read_magic(fh))
                    if read is None:
                        raise ValueError(f"'{info.filename}' is not a version 1 or 2 .npy array")
                    shape, _, dtype = read(fh)
                    if int(np.prod(shape, dtype=object)) * dtype.itemsize > info.file_size:
                        raise InvalidModelError(f"{p}: array '{info.filename}' declares shape {shape}, "
                                                "more data than the file holds.")
        with np.load(p, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError, KeyError, TypeError,
            NotImplementedError, RuntimeError) as e:  # zipfile: encrypted / unsupported members
        raise InvalidModelError(f"{p} is not a readable .npz sparsity map ({e}).") from None


def load_sparsity_map(path: str | Path) -> dict[int, np.ndarray]:
    """Layer index -> bool mask (d_ffn,) from a ``.npz`` sparsity map (format above)."""
    p = Path(path)
    if not p.is_file():
        raise ModelNotFoundError(f"Sparsity map not found: {p}.")
    arrays = _read_npz(p)
    masks: dict[int, np.ndarray] = {}
    for key, a in arrays.items():
        if key == "header":
            continue
        if not key.startswith("layer_") or not key[6:].isdigit():
            raise InvalidModelError(f"{p}: unexpected array '{key}' (expected layer_<i> or header).")
        if a.ndim != 1 or not (a.dtype == bool or np.issubdtype(a.dtype, np.integer)):
            raise InvalidModelError(f"{p}: '{key}' must be a 1-D bool or 0/1 array, got {a.dtype}{a.shape}.")
        if a.dtype != bool and not np.isin(a, (0, 1)).all():
            raise InvalidModelError(f"{p}: '{key}' holds values other than 0 and 1.")
        masks[int(key[6:])] = a.astype(bool)
    if not masks:
        raise InvalidModelError(f"{p} holds no layer_<i> masks.")
    return dict(sorted(masks.items()))


def sparsity_map_header(path: str | Path) -> dict:
    """The map's JSON header (sidecar ``.json`` or the npz's ``header`` array); {} if none."""
    p = Path(path)
    side = p.with_suffix(".json")
    raw: str | None = None
    if side.is_file():
        raw = side.read_text(encoding="utf-8")
    else:
        arrays = _read_npz(p)
        if "header" in arrays:
            raw = str(arrays["header"])
    if raw is None:
        return {}
    try:
        header = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise InvalidModelError(f"The header of sparsity map {p} is not valid JSON ({e}).") from e
    if not isinstance(header, dict):
        raise InvalidModelError(f"The header of sparsity map {p} is not a JSON object.")
    return header


def check_masks(masks: dict[int, np.ndarray], n_layers: int, d_ffn: int, where: str) -> None:
    for i, m in masks.items():
        if not 0 <= i < n_layers:
            raise InvalidModelError(f"{where}: layer_{i} is outside the model's {n_layers} layers.")
        if m.shape != (d_ffn,):
            raise InvalidModelError(f"{where}: layer_{i} has {m.shape[0]} entries; the model's d_ffn is {d_ffn}.")


def mask_tensor(mask: np.ndarray) -> np.ndarray:
    """The stored form: float32 1.0 (kept) / 0.0 (pruned), shape (d_ffn,)."""
    return mask.astype(np.float32)
