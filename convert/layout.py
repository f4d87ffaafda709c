"""``aios-convert layout`` (R5): rewrite a GGUF with blocks in descending access frequency.

A block is one GGUF tensor (llama.cpp finds tensors by name, so the reordered file still loads).
Its access frequency is the expected fraction of its rows read per generated token:

- every-token tensors (embeddings, attention, norms, output head, the FFN gate of gated FFNs,
  the FFN up projection of plain FFNs, sparsity masks): 1.0;
- rows a sparsity-aware kernel may skip (the FFN down projection, and the up projection of
  gated FFNs): the layer's measured mean neuron firing rate on the calibration texts
  (runtime/measure.py: the R1 measurement, the file executed as stored), restricted to neurons a ``blk.N.ffn_active``
  mask keeps.

Classes: ≥ ``high`` → high, < ``low`` → low, else medium. Tiers: HOT = high blocks of the first
two and last two layers plus embeddings/head; WARM = other high and medium; STREAM = low.

The manifest is embedded as ``aios.manifest`` and written beside the file as
``<name>.aios.json``. Its offsets are absolute file offsets: the manifest's own length fixes
where tensor data starts, so a fixed-length slot is reserved, the tensor infos are written,
and the slot is then filled with the manifest padded by spaces (valid JSON).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from aios import CONTRACT_VERSION, __version__
from aios.errors import InvalidModelError
from aios.io import write_atomic
from aios.models import ModelHandle, resolve_model
from contract.spec.manifest import FREQ_RANK, Manifest, verify

MANIFEST_KEY = "aios.manifest"
TIER_RANK = {"HOT": 0, "WARM": 1, "STREAM": 2}
_FFN = re.compile(r"^blk\.(\d+)\.ffn_(gate|up|down)\.")
_BLK = re.compile(r"^blk\.(\d+)\.")


@dataclass(frozen=True)
class LayoutConfig:
    """Converter config, embedded in the artifact (``aios.layout.config``)."""

    calibration: str | None = None  # file name (None = bundled calibration set)
    samples: int | None = None
    max_tokens: int = 128
    high: float = 0.9
    low: float = 0.2
    version: int = 1


@dataclass
class Block:
    name: str
    frequency: float
    access: str  # high | medium | low
    tier: str  # HOT | WARM | STREAM
    size: int
    offset: int = -1


@dataclass
class LayoutResult:
    output: Path
    sidecar: Path
    blocks: list[Block]
    ffn_read_fraction: list[float]  # (L,) measured
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        """Block counts by access class and residency tier: "12 high, 3 medium, 2 low; 6 HOT, ..."."""
        from collections import Counter

        access = Counter(b.access for b in self.blocks)
        tiers = Counter(b.tier for b in self.blocks)
        return (", ".join(f"{access[k]} {k}" for k in ("high", "medium", "low")) + "; "
                + ", ".join(f"{tiers[k]} {k}" for k in ("HOT", "WARM", "STREAM")))


# --- frequencies (pure) --------------------------------------------------------------------


def block_frequency(name: str, read_fraction: np.ndarray, gated: bool) -> float:
    """Expected fraction of tensor ``name``'s rows read per token (see module doc)."""
    m = _FFN.match(name)
    if m is None:
        return 1.0
    layer, kind = int(m.group(1)), m.group(2)
    if kind == "gate" or (kind == "up" and not gated):
        return 1.0
    return float(read_fraction[layer])


def classify(freq: float, high: float, low: float) -> str:
    return "high" if freq >= high else "low" if freq < low else "medium"


def tier(name: str, access: str, n_layers: int) -> str:
    if access == "low":
        return "STREAM"
    m = _BLK.match(name)
    edge = m is None or int(m.group(1)) < 2 or int(m.group(1)) >= n_layers - 2
    return "HOT" if access == "high" and edge else "WARM"


def order_blocks(blocks: list[Block]) -> list[Block]:
    """high → medium → low, HOT before WARM, then by frequency, then file order (stable)."""
    return sorted(blocks, key=lambda b: (FREQ_RANK[b.access], TIER_RANK[b.tier], -b.frequency))


def ffn_read_fraction(neuron_frequency: np.ndarray, masks: dict[int, np.ndarray]) -> np.ndarray:
    """(L,) mean over neurons of firing rate × kept, from (L, d_ffn) measured rates."""
    f = neuron_frequency.astype(np.float64).copy()
    for i, m in masks.items():
        f[i] *= m.astype(bool)
    return f.mean(axis=1)


# --- measuring -----------------------------------------------------------------------------


def measure_read_fraction(handle: ModelHandle, texts: list[str], max_tokens: int,
                          progress: Callable[[int, int], None] | None = None) -> np.ndarray:
    """Run the GGUF in aios-run (the file as stored, with the activation it declares) on
    ``texts``: quantized blocks are read in place, never dequantized into a float model."""
    from runtime.measure import measure_ffn_activity_gguf

    activity = measure_ffn_activity_gguf(handle.path, texts, handle.load_tokenizer(), max_tokens=max_tokens,
                                         progress=progress)
    masks = {}
    for name in handle.store.iter_names():  # type: ignore[union-attr]
        m = re.match(r"^blk\.(\d+)\.ffn_active$", name)
        if m:
            masks[int(m.group(1))] = handle.store.get(name).astype(bool)  # type: ignore[union-attr]
    return ffn_read_fraction(activity.neuron_frequency, masks)


# --- rewriting -----------------------------------------------------------------------------


def manifest_json(blocks: list[Block]) -> str:
    return json.dumps({
        "aios_contract_version": CONTRACT_VERSION,
        "frequency_ordered": True,
        "layout": [{"block_id": b.name, "access_frequency": b.access, "rws_tier": b.tier,
                    "offset_bytes": b.offset, "size_bytes": b.size} for b in blocks],
    }, separators=(",", ":"))


def layout_gguf(model: str | ModelHandle, output: str | Path, config: LayoutConfig, *,
                calibration_texts: list[str] | None = None,
                progress: Callable[[int, int], None] | None = None) -> LayoutResult:
    """Measure block frequencies of a GGUF and rewrite it frequency-ordered with a manifest."""
    from aios.data import load_texts, texts_sha256

    handle = model if isinstance(model, ModelHandle) else resolve_model(model)
    if handle.kind != "gguf" or handle.path is None:
        raise InvalidModelError(f"'{handle.spec}' is not a .gguf file; export it first with `aios-convert gguf`.")
    out = Path(output)
    if out.resolve() == handle.path.resolve():
        raise InvalidModelError("-o must differ from the input file (the input is read while writing).")
    texts = calibration_texts if calibration_texts is not None else load_texts(config.calibration, config.samples)
    read = measure_read_fraction(handle, texts, config.max_tokens, progress)
    reader = handle.store.reader  # type: ignore[union-attr]
    blocks = []
    for t in reader.tensors:
        f = block_frequency(t.name, read, handle.facts.gated_ffn)
        access = classify(f, config.high, config.low)
        blocks.append(Block(t.name, f, access, tier(t.name, access, handle.facts.n_layers), int(t.n_bytes)))
    blocks = order_blocks(blocks)
    extra = {
        "aios.layout.config": json.dumps(_portable(config), sort_keys=True),
        "aios.layout.calibration_sha256": texts_sha256(texts),
        "aios.layout.tool_version": __version__,
        "aios.layout.ffn_read_fraction": [round(float(x), 6) for x in read],
    }
    _rewrite(handle, out, blocks, extra)
    sidecar = out.with_name(out.stem + ".aios.json")
    write_atomic(sidecar, manifest_json(blocks) + "\n")
    return LayoutResult(out, sidecar, blocks, [float(x) for x in read])


def _portable(config: LayoutConfig) -> dict:
    d = asdict(config)
    if d["calibration"]:
        d["calibration"] = Path(d["calibration"]).name
    return d


def _rewrite(handle: ModelHandle, out: Path, blocks: list[Block], extra: dict) -> None:
    """``handle``'s GGUF with ``blocks``' tensors in their order, ``extra`` and the manifest (its
    offsets filled in once the tensors' places are known) as the last key."""
    from convert.gguf.writer import RawTensor, ReservedKey, rewrite_gguf

    reader = handle.store.reader  # type: ignore[union-attr]
    by_name = {t.name: t for t in reader.tensors}
    src_size = handle.path.stat().st_size  # type: ignore[union-attr]
    digits = len(str(2 * src_size + (64 << 20)))
    for b in blocks:  # reserve the widest offsets the output can have
        b.offset = 10**digits - 1

    def fill(offsets: list[int]) -> str:
        for b, offset in zip(blocks, offsets):
            b.offset = offset
        return manifest_json(blocks)

    rewrite_gguf(reader, out, [RawTensor.copied(handle.path, by_name[b.name]) for b in blocks], extra,  # type: ignore[arg-type]
                 skip=lambda key: key == MANIFEST_KEY or key.startswith("aios.layout."),
                 reserved=ReservedKey(MANIFEST_KEY, len(manifest_json(blocks)), fill),
                 check=lambda tmp: _verify_written(tmp, manifest_json(blocks)))


def _verify_written(path: Path, text: str) -> None:
    """The embedded manifest must describe the written file exactly (else nothing is kept)."""
    import gguf

    r = gguf.GGUFReader(str(path))
    embedded = r.get_field(MANIFEST_KEY).contents()  # type: ignore[union-attr]
    layout = {t.name: (int(t.data_offset), int(t.n_bytes)) for t in r.tensors}
    problems = verify(Manifest.model_validate_json(embedded), layout)
    if problems or embedded.strip() != text:
        raise AssertionError(f"layout rewrite produced an inconsistent manifest: {problems[:1]}")
