"""Calibrated per-layer FFN thresholds (``aios-convert sparsify``), as the forward pass applies them.

A sparsified file keeps its weights and its smooth activation (SiLU, GELU) and adds one number
per layer: activations whose magnitude is below the layer's threshold are set to exactly zero.
The threshold is part of the model (the contract's R1 admits "a thresholded ReLU whose threshold
is part of the activation"), so aios-run applies it in every FFN mode, and the exact-sparse mode
skips the weight rows of the zeroed neurons with results equal to the thresholded dense model.

Where the cut is made (``aios.ffn_threshold.site``):

``gate``     gated FFNs (SwiGLU, GeGLU): |act(gate)| < t → 0 (CATS). The up row and the down
             row of a zeroed neuron are both skipped; the gate is computed in full. Cuts are
             one per neuron (sparsify weighs each neuron by what it adds to the output).
``down_in``  the input of the down projection: |act(gate)·up| < t (gated) or |act(up)| < t
             (plain MLPs) → 0. Only down rows are skipped (all of gate and up are read), but at
             one zero fraction it costs far less quality than ``gate`` (sparsify's default).

The inputs of the other projections can be cut the same way (TEAL: every matrix input;
``aios-convert sparsify --scope all``), one threshold per layer and site (``InputThresholds``):

``attn_in``  the attention norm's output, the input q, k and v share
``attn_out`` the attention output, the input of the output projection
``ffn_in``   the FFN norm's output, the input gate and up share (a parallel block's MLP input)

GGUF keys ``aios.input_threshold.<site>`` (float32 array, one value per layer; 0: no cut).

GGUF keys (read here, written by ``convert/sparsify.py``):
``aios.ffn_threshold.site`` (string), ``aios.ffn_threshold.values`` (float32 array: one value per
layer, or one per neuron, layer-major: ``n_layers × d_ffn``); the calibration's record lives beside them (``aios.ffn_threshold.*``) and is not read by
the forward pass. llama.cpp ignores all of them and runs the dense smooth activation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from aios.errors import InvalidModelError
from aios.models.ffn_cut import GGUF_SITE as KEY_SITE
from aios.models.ffn_cut import GGUF_VALUES as KEY_VALUES

SITES = ("gate", "down_in")


@dataclass(frozen=True)
class FfnThresholds:
    site: str  # one of SITES
    # (n_layers,) one cut per layer, or (n_layers, d_ffn) one per neuron; float32, ≥ 0 (0: no cut)
    values: np.ndarray

    def cut(self, x: np.ndarray, layer: int) -> np.ndarray:
        """``x`` (tokens, d_ffn) with every entry of magnitude below its threshold set to 0 (in place)."""
        t = self.values[layer]
        if t.ndim or t > 0:
            x[np.abs(x) < t] = 0
        return x


def read(store, n_layers: int, d_ffn: int, gated: bool, path: Path) -> FfnThresholds | None:
    """The file's thresholds, None when it has none; one sentence (exit 4) when they are unusable."""
    site, values = store.field(KEY_SITE), store.field(KEY_VALUES)
    if site is None and values is None:
        return None
    if site not in SITES:
        raise InvalidModelError(f"{path}: '{KEY_SITE}' is {site!r}; the runtime knows {', '.join(SITES)}.")
    if site == "gate" and not gated:
        raise InvalidModelError(f"{path}: '{KEY_SITE}' is 'gate' but the FFN has no gate.")
    if (not isinstance(values, list) or len(values) not in (n_layers, n_layers * d_ffn)
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
                       for v in values)):
        shown = f"{len(values)} values" if isinstance(values, list) else repr(values)
        raise InvalidModelError(f"{path}: '{KEY_VALUES}' must hold {n_layers} (one per layer) or "
                                f"{n_layers} × {d_ffn} (one per neuron) finite numbers ≥ 0; it has {shown}.")
    v = np.asarray(values, np.float32)
    return FfnThresholds(site, v if len(v) == n_layers else v.reshape(n_layers, d_ffn))


INPUT_SITES = ("attn_in", "attn_out", "ffn_in")
KEY_INPUT = "aios.input_threshold."  # + site: float32, one value per layer
# the matrices that read each site's input (GGUF names relative to blk.N.; fused forms included):
# what a sparse kernel may skip the rows of, stored input-major (``X.t``: runtime/sparse_down.py)
SITE_MATRICES = {
    "attn_in": ("attn_q", "attn_k", "attn_v", "attn_qkv"),
    "attn_out": ("attn_output",),
    "ffn_in": ("ffn_gate", "ffn_up"),
    "down_in": ("ffn_down",),
    "gate": ("ffn_up", "ffn_down"),  # the gate site skips up and down rows of a cut neuron
}
# every matrix a file may store input-major (one .t tensor each, n_in rows of n_out)
INPUT_MAJOR = ("attn_q", "attn_k", "attn_v", "attn_qkv", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


@dataclass(frozen=True)
class InputThresholds:
    """Per-site, per-layer cuts of the projections' inputs (``INPUT_SITES``)."""

    values: dict  # site -> (n_layers,) float32 ≥ 0 (0: no cut)

    def sites(self, layer: int) -> tuple[str, ...]:
        """The sites cut in ``layer`` (INPUT_SITES order)."""
        return tuple(s for s in INPUT_SITES if s in self.values and self.values[s][layer] > 0)

    def cut(self, x: np.ndarray, layer: int, site: str) -> np.ndarray:
        """A copy of ``x`` with every entry of magnitude below the site's threshold set to 0 (the
        input may feed another site too: a parallel block's attention and MLP)."""
        out = np.array(x, np.float32)
        out[np.abs(out) < self.values[site][layer]] = 0
        return out


def read_inputs(store, n_layers: int, path: Path) -> InputThresholds | None:
    """The file's input cuts (``aios.input_threshold.<site>``), None when it has none; one
    sentence (exit 4) when they are unusable."""
    values = {}
    for site in INPUT_SITES:
        v = store.field(KEY_INPUT + site)
        if v is None:
            continue
        if (not isinstance(v, list) or len(v) != n_layers
                or not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0
                           for x in v)):
            shown = f"{len(v)} values" if isinstance(v, list) else repr(v)
            raise InvalidModelError(f"{path}: '{KEY_INPUT + site}' must hold {n_layers} finite numbers ≥ 0 "
                                    f"(one per layer); it has {shown}.")
        values[site] = np.asarray(v, np.float32)
    return InputThresholds(values) if values else None
