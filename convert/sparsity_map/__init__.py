"""``aios-convert sparsity-map``: a static mask of FFN neurons to skip, under a perplexity budget.

Method
------
1. Per-layer, per-neuron firing frequencies (share of tokens on which the neuron's
   activation — the input of the FFN output projection — is nonzero) are measured on the
   calibration texts by the R1 checker's code (``aios.measure.ffn``).
2. Neurons are ranked globally, least frequent first (``convert/sparsity_map/search.py``).
3. The number of skipped neurons is found by binary search against *measured* held-out
   perplexity with the mask applied (a forward pre-hook on each FFN output projection that
   zeroes the skipped neurons' activations — exactly what a runtime that skips their
   up/gate rows and down columns computes). Budgets: conservative < 0.1 %, balanced
   < 0.5 %, aggressive = ``--budget`` percent (relative |Δppl|).
4. Reported: per-layer skip fraction, held-out perplexity with and without the map, and the
   false-negative rate on held-out text: the share of nonzero activations (measured
   without the mask) that fall in skipped neurons. Held-out perplexity follows the fixtures'
   protocol (``convert/evaluation.py``, pydoc held-out split); the false-negative rate is
   measured on the paragraphs of the same held-out topics and, as an independent check, on
   the bundled ``aios/data/heldout.jsonl`` passages (used neither for calibration nor search).

File format (read by ``convert/gguf/sparsity.py``, embedded in GGUF as ``blk.N.ffn_active``)
-------------------------------------------------------------------------------------------
``MAP.npz`` (an uncompressed zip of ``.npy`` arrays, fixed timestamps so it is
byte-reproducible):

- ``layer_<i>``: bool (d_ffn,), one per FFN layer i; True = neuron kept (may fire),
  False = neuron skipped (treated as always zero; its up/gate rows and down column are not
  read).
- ``header``: 0-d unicode array holding the JSON header below.

``MAP.json`` (sidecar, same JSON): ``format_version`` (1), ``mode``, ``budget_pct``,
``calibration_sha256`` (``aios.data.texts_sha256`` of the calibration texts),
``calibration_source``, ``calibration_tokens``, ``model`` (name), ``model_sha256``,
``activation``, ``n_layers``, ``d_ffn``, ``per_layer_kept`` [L ints],
``per_layer_skip_fraction``, ``skip_fraction``, ``heldout_ppl_without``, ``heldout_ppl_with``,
``ppl_change_pct``, ``heldout`` (source, texts hash, tokens), ``false_negative_rate``,
``false_negative_rate_bundled_heldout``, ``search`` (every probe: skipped, change_pct, ok),
``config`` (``SparsityMapConfig``), ``tool_version``.
"""

from __future__ import annotations

import io
import json
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from aios.errors import UsageError
from aios.io import write_atomic
from convert.gguf.sparsity import load_sparsity_map, sparsity_map_header

FORMAT_VERSION = 1
CONFIG_VERSION = 1
MODE_BUDGET_PCT = {"conservative": 0.1, "balanced": 0.5}  # aggressive: --budget
MODES = ("conservative", "balanced", "aggressive")


@dataclass(frozen=True)
class SparsityMapConfig:
    version: int = CONFIG_VERSION
    mode: str = "conservative"
    budget_pct: float | None = None  # aggressive only; the others use MODE_BUDGET_PCT
    max_tokens: int = 128  # per calibration / held-out text, as the R1 checker
    resolution: int = 1024  # search stops when the bracket is < total neurons / resolution

    def budget(self) -> float:
        """The relative perplexity budget as a percentage."""
        if self.mode not in MODES:
            raise UsageError(f"Unknown mode '{self.mode}'; choose from {', '.join(MODES)}.")
        if self.mode == "aggressive":
            if self.budget_pct is None or not self.budget_pct > 0:
                raise UsageError("--mode aggressive needs --budget PCT "
                                 "(a positive perplexity change in %).")
            return float(self.budget_pct)
        if self.budget_pct is not None and self.budget_pct != MODE_BUDGET_PCT[self.mode]:
            raise UsageError(f"--budget applies to --mode aggressive; {self.mode} is fixed at "
                             f"{MODE_BUDGET_PCT[self.mode]} %.")
        return MODE_BUDGET_PCT[self.mode]


@dataclass
class SparsityMapResult:
    path: Path
    header: dict[str, Any]
    keep: np.ndarray  # (L, d_ffn) bool


def sparsity_map(model: str, out: str | Path, config: SparsityMapConfig | None = None, *,
                 calibration: str | Path | None = None,
                 progress: Callable[[str], None] = lambda _m: None) -> SparsityMapResult:
    """Build and write a sparsity map; library entry point of ``aios-convert sparsity-map``."""
    from convert.sparsity_map.run import build

    cfg = config or SparsityMapConfig()
    cfg.budget()
    out = Path(out)
    if out.suffix != ".npz":
        out = out.with_name(out.name + ".npz")
    header, keep = build(model, cfg, calibration, progress)
    write_sparsity_map(out, keep, header)
    return SparsityMapResult(out, header, keep)


def _npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, array, allow_pickle=False)
    return buf.getvalue()


def write_sparsity_map(path: str | Path, keep: np.ndarray, header: dict[str, Any]) -> Path:
    """Write ``MAP.npz`` (+ ``MAP.json``) atomically and byte-reproducibly (format above)."""
    path = Path(path)
    assert keep.ndim == 2 and keep.dtype == bool, "keep must be (n_layers, d_ffn) bool"
    text = json.dumps(header, indent=2) + "\n"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        for i, row in enumerate(keep):
            z.writestr(zipfile.ZipInfo(f"layer_{i}.npy", (1980, 1, 1, 0, 0, 0)), _npy(row))
        z.writestr(zipfile.ZipInfo("header.npy", (1980, 1, 1, 0, 0, 0)), _npy(np.array(text)))
    write_atomic(path, buf.getvalue())
    try:
        write_atomic(path.with_suffix(".json"), text)
    except BaseException:  # Ctrl-C / full disk: the pair is the output, so no map without its header
        path.unlink(missing_ok=True)
        raise
    return path


__all__ = ["MODES", "SparsityMapConfig", "SparsityMapResult", "load_sparsity_map",
           "sparsity_map", "sparsity_map_header", "write_sparsity_map"]
