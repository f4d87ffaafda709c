"""Calibrated FFN thresholds in an HF folder, applied to the torch model as aios-run applies them.

A GGUF carries the cut in ``aios.ffn_threshold.*`` keys (``runtime/thresholds.py``). An HF folder
carries the same cut in ``config.json``::

    "aios_ffn_threshold": {"site": "down_in", "values": [t_0, ..., t_{L-1}], "source": "..."}

(written by ``aios-convert relufy --init-thresholds``): the input x of block l's FFN down
projection is set to exactly zero where |x| < t_l. Only the ``down_in`` site with one value per
layer is stored in folders; it is the one cut that a hook on the down projection can make
alone (a ``gate`` cut needs the gate's output, which the modelling code does not expose).

Stock transformers keeps the key in the config and ignores it: it runs the model without the
cut (fewer zeros, slightly different logits). Our loader (``ModelHandle.load_torch``) installs
the cut as a forward pre-hook on every down projection, so ``aios-contract check`` measures the
model as defined, and ``aios-convert gguf`` writes the values to ``aios.ffn_threshold.*`` so
aios-run applies them to the exported file.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from aios.errors import InvalidModelError

CONFIG_KEY = "aios_ffn_threshold"
SITE = "down_in"
# the GGUF keys of the same cut (read by runtime/thresholds.py, written by sparsify and gguf exports)
GGUF_SITE = "aios.ffn_threshold.site"
GGUF_VALUES = "aios.ffn_threshold.values"
TRANSFORMERS_NOTE = (f"stock transformers ignores config.json's '{CONFIG_KEY}' and runs the model "
                     "without the cut (fewer zeros); aios-contract, aios-convert gguf and aios-run "
                     "apply it")


def from_config(config: Mapping[str, Any], n_layers: int, where: str = "config.json") -> list[float] | None:
    """The per-layer cut values of ``config[CONFIG_KEY]``; None without one; one sentence when unusable."""
    entry = config.get(CONFIG_KEY)
    if entry is None:
        return None
    if not isinstance(entry, Mapping) or entry.get("site") != SITE:
        site = entry.get("site") if isinstance(entry, Mapping) else entry
        raise InvalidModelError(f"{where}: '{CONFIG_KEY}' must be an object with site '{SITE}' "
                                f"(an HF folder stores only that cut); it has {site!r}.")
    values = entry.get("values")
    if (not isinstance(values, list) or len(values) != n_layers
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                       and v >= 0 for v in values)):
        shown = f"{len(values)} values" if isinstance(values, list) else repr(values)
        raise InvalidModelError(f"{where}: '{CONFIG_KEY}.values' must hold {n_layers} finite numbers "
                                f"≥ 0, one per layer; it has {shown}.")
    return [float(v) for v in values]


def from_gguf(store, n_layers: int, where: str) -> list[float]:
    """The per-layer down_in cut of a GGUF written by ``aios-convert sparsify`` (``store``: a
    :class:`aios.models.tensors.GGUFStore`), for a warm start; one sentence when it has none
    that a torch model can take."""
    site, values = store.field(GGUF_SITE), store.field(GGUF_VALUES)
    if site is None and values is None:
        raise InvalidModelError(f"{where} has no calibrated FFN thresholds ({GGUF_SITE}); make "
                                "one with `aios-convert sparsify`.")
    if site != SITE:
        raise InvalidModelError(f"{where}: its thresholds cut at site {site!r}; a warm start takes "
                                f"'{SITE}' cuts (`aios-convert sparsify --site {SITE}`, the default).")
    n = len(values) if isinstance(values, list) else 0
    if n != n_layers:
        raise InvalidModelError(f"{where} holds {n} threshold values; this model has {n_layers} "
                                "layers (one value each): the file was calibrated on another model.")
    return from_config({CONFIG_KEY: {"site": SITE, "values": values}}, n_layers, where)  # type: ignore[return-value]


def config_entry(values: list[float], source: str) -> dict[str, Any]:
    """The ``config.json`` value for ``values`` (one per layer, down_in site)."""
    return {"site": SITE, "values": [float(v) for v in values], "source": source,
            "note": TRANSFORMERS_NOTE}


def install(model, down_names: list[str], values: list[float]) -> list:
    """Forward pre-hooks on the modules named ``down_names`` (one per layer) that zero every input
    entry with |x| < t_l. The gradient flows through the kept entries (x·mask), so a fine-tune
    trains the model with its cut in place. Returns the hook handles (``.remove()`` undoes them).

    Install before any hook that should see the cut input (measurement taps): pre-hooks run in
    the order they were registered.
    """
    if len(down_names) != len(values):
        raise ValueError(f"{len(values)} thresholds for {len(down_names)} layers")
    handles = []
    for name, t in zip(down_names, values):
        if t > 0:
            handles.append(model.get_submodule(name).register_forward_pre_hook(_cut(float(t))))
    return handles


def _cut(t: float):
    def hook(_module, args):
        x = args[0]
        return (x * (x.abs() >= t).to(x.dtype), *args[1:])

    return hook
