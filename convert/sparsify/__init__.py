"""``aios-convert sparsify``: exact-zero FFN activations without training (calibrated thresholds).

Gated FFNs (SwiGLU, GeGLU) never produce exact zeros, but most of their activations are small:
zeroing the ones below a per-layer magnitude threshold (CATS; TEAL for every matrix input) keeps
most of the model's quality at 40-50 % FFN sparsity. The threshold becomes part of the model
(``runtime/thresholds.py``: GGUF keys ``aios.ffn_threshold.*``), the weights stay as they are,
and aios-run's exact-sparse mode skips the rows of every zeroed neuron.

Calibration, on the GGUF executed by aios-run (quantized weights in place, its own arithmetic):

1. **Inputs.** One dense pass over the calibration tokens records every layer's FFN input
   (``Model.ffn_input_hook``).
2. **Per-layer curves.** For each layer, from those inputs alone: the cut value at each zero
   fraction of a grid (quantiles of |act(gate)| or |act(gate)·up| over the calibration tokens) and
   the relative error the cut causes in the layer's FFN output (after Gemma's post-FFN norm, the
   value added to the residual stream): ``e_l(s) = Σ‖y_s − y‖² / Σ‖y‖²``.
3. **Sensitivity.** A layer's local error does not say how much the model's output moves: with
   only that layer cut, at each zero fraction of ``SENSITIVITY_LEVELS``, a full forward pass
   measures the KL divergence of the next-token distribution from the dense model's. The layer's
   cost curve ``c_l(s)`` interpolates those (0 at 0) and, past the last one, follows the local
   error: ``c_l(s) = k_l(last) · e_l(s) / e_l(last)``.
4. **Allocation.** ``uniform`` (the default) gives every layer the target. ``greedy``
   (TEAL-like): every layer starts at 0; the step of one grid level with the smallest cost
   increase per unit of sparsity is taken, until the mean zero fraction over layers reaches the
   target. On the real Gemma 3 270M uniform won (ALLOCATIONS); greedy is kept for models whose
   layers differ more. ``--max-ppl-ratio`` bisects the target on the calibration tokens' measured
   perplexity ratio (both allocations are nested: a higher target only cuts more).

The report then measures, on held-out tokens calibration never saw: perplexity of the dense and
the thresholded file in aios-run, and the exact-zero fraction of the down projections' inputs.

``--scope all`` also cuts the inputs of q/k/v, of the attention output and of gate/up at the
target (``sites``: per-site quantiles of |x|, runtime/thresholds.py ``InputThresholds``), and the
report measures each site's held-out zeros and the model-wide fraction weighted by matrix bytes.

Modules: ``config`` (options, result), ``measure`` (what is measured on the running model),
``sites`` (the input sites of ``--scope all``),
``calibrate`` (steps 1-4), ``write`` (the output GGUF), ``cli`` (rendering); this package's
root is the entry point: :func:`sparsify`, and the names its callers use.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np

from convert.sparsify.calibrate import (
    Calibration,
    aim_r1,
    allocate,
    bos_prefix,
    calibrate,
    calibration_stream,
    check_paths,
    choose_target,
    costs,
    windows,
)
from convert.sparsify.config import (
    ALLOCATIONS,
    DEFAULT_SITE,
    KEY_PREFIX,
    R1_FLOOR,
    R1_MARGIN,
    Progress,
    SparsifyConfig,
    SparsifyResult,
)
from convert.sparsify.measure import LEVELS, SENSITIVITY_LEVELS, LayerCurve, nll
from convert.sparsify.sites import model_wide, site_bytes
from convert.sparsify.write import input_major_tensors, metadata, write_sparsified
from runtime.thresholds import SITES, FfnThresholds, InputThresholds

__all__ = ["aim_r1", "ALLOCATIONS", "DEFAULT_SITE", "KEY_PREFIX", "LEVELS", "SENSITIVITY_LEVELS", "SITES", "Calibration",
           "LayerCurve", "Progress", "SparsifyConfig", "SparsifyResult", "allocate", "bos_prefix", "calibrate",
           "calibration_stream", "check_paths", "choose_target", "costs", "finish", "measure_heldout", "metadata",
           "sparsify", "windows", "write_sparsified"]


def sparsify(model_path: str | Path, output: str | Path, config: SparsifyConfig, *,
             progress: Progress | None = None) -> SparsifyResult:
    """Calibrate per-layer thresholds on the GGUF ``model_path`` and write ``output``."""
    t_start = time.perf_counter()
    src, out = Path(model_path), Path(output)
    check_paths(src, out)
    config.check(gated=True)  # every option but the site's fit to the FFN, before the model loads
    cal = calibrate(src, config, progress)
    t0 = time.perf_counter()
    target, search = choose_target(cal, config, progress)
    r1_rounds = None
    if config.aim_r1:
        target, r1_rounds = aim_r1(cal, config, progress)
    levels, cuts = cal.cuts_for(target, config)
    inputs = cal.inputs_for(target, config)
    calibration = {
        **cal.source, "tokens_used": int(sum(len(w) for w in cal.wins)), "window": config.window,
        "allocation": config.allocation, "sensitivity_levels": list(SENSITIVITY_LEVELS),
        "ppl_dense": round(math.exp(cal.base_nll / cal.n_scored), 4), "ppl_ratio": round(cal.ppl_ratio(cuts, inputs), 4),
        "sensitivity_kl": [None if c.sensitivity is None else [round(float(x), 6) for x in c.sensitivity]
                           for c in cal.curves], "target_search": search,
        **({} if cal.site_cuts is None else {
            "site_fractions": {s: round(f, 4) for s, f in cal.fractions_for(target, config).items()},
            "site_kl": None if cal.site_costs is None else {s: [round(float(x), 6) for x in v]
                                                            for s, v in cal.site_costs.items()}}),
        **({} if r1_rounds is None else {"r1_aim": {"floor": R1_FLOOR, "margin": R1_MARGIN, "texts": "aios/data/heldout.jsonl",
                                                      "rounds": r1_rounds}}),
    }
    seconds = dict(cal.seconds, allocation=time.perf_counter() - t0)
    return finish(cal, out, target, levels, cuts, calibration, config, seconds, progress, t_start, inputs)


def finish(cal: Calibration, out: Path, target: float, levels: np.ndarray, cuts: FfnThresholds, calibration: dict,
           config: SparsifyConfig, seconds: dict, progress: Progress | None, t_start: float,
           inputs: InputThresholds | None = None) -> SparsifyResult:
    """Measure the held-out figures of ``cuts`` (and ``inputs``: --scope all) and write the file."""
    heldout = {}
    if config.heldout_tokens:
        t0 = time.perf_counter()
        if progress:
            progress("held-out perplexity and zeros", 0, 1)
        heldout = measure_heldout(cal.model, cal.tokenizer, cal.prefix, cuts, config, inputs=inputs)
        if progress:
            progress("held-out perplexity and zeros", 1, 1)
        seconds["heldout"] = time.perf_counter() - t0
    per_layer = cuts.values if cuts.values.ndim == 1 else np.median(cuts.values, axis=1)
    result = SparsifyResult(out, cal.site, round(target, 4), [round(float(x), 4) for x in levels],
                            [float(x) for x in per_layer], calibration, heldout, seconds,
                            list(cal.warnings), per_neuron=cuts.values.ndim == 2, scope=config.scope,
                            input_thresholds={} if inputs is None else
                            {s: [float(x) for x in v] for s, v in inputs.values.items()})
    result.warnings.append("llama.cpp ignores aios.ffn_threshold.*: it runs this file as the dense "
                           f"'{cal.model.hp.activation}' model it came from, without the thresholds "
                           "(aios-run applies them)")
    t0 = time.perf_counter()
    major = input_major_tensors(cal.model, cal.site, bool(np.any(cuts.values > 0)), inputs, config.sparse_down,
                                config.input_major)
    write_sparsified(cal.model.path, out, metadata(result, cuts, config, inputs), cal.model, major, result.warnings,
                     config.input_major_type if config.input_major else "same")
    seconds["write"] = time.perf_counter() - t0
    seconds["total"] = time.perf_counter() - t_start
    return result


def measure_heldout(model, tok, prefix: list[int], cuts: FfnThresholds, config: SparsifyConfig,
                    dense_cache: dict | None = None, inputs: InputThresholds | None = None) -> dict:
    """Perplexity (dense and cut) and the cut model's exact-zero fraction of the down projections'
    inputs (and, with ``inputs``, of each input site's, and the model-wide fraction weighted by the
    matrices' bytes), on the held-out pydoc split (never used by calibration). ``dense_cache``: a
    dict that keeps the dense NLL between calls with the same model and settings (the curve
    benchmark)."""
    from aios.evaluation import pydoc_split

    ts = pydoc_split(tok, "heldout")
    wins = windows(ts.ids.numpy(), config.heldout_tokens, config.window, prefix)
    cache = {} if dense_cache is None else dense_cache
    if "nll" not in cache:
        cache["nll"], cache["n"] = nll(model, wins, None, len(prefix))
    dense, n = cache["nll"], cache["n"]
    zeros = np.zeros(model.hp.n_layers)
    seen = np.zeros(model.hp.n_layers)

    def hook(layer: int, a: np.ndarray) -> None:
        zeros[layer] += int(np.count_nonzero(a == 0))
        seen[layer] += a.size

    site_zeros = {s: np.zeros((2, model.hp.n_layers)) for s in ([] if inputs is None else inputs.values)}

    def site_hook(layer: int, site: str, x: np.ndarray) -> None:  # the input before its cut: what the cut zeroes
        if site in site_zeros:
            site_zeros[site][:, layer] += (np.count_nonzero(np.abs(x) < inputs.values[site][layer]), x.size)

    model.ffn_act_hook, model.input_hook = hook, site_hook
    try:
        cut, _ = nll(model, wins, cuts, len(prefix), inputs)
    finally:
        model.ffn_act_hook = model.input_hook = None
    frac = zeros / np.maximum(seen, 1)
    out = {**ts.describe(), "tokens_scored": n, "ppl_dense": round(math.exp(dense / n), 4),
           "ppl_sparse": round(math.exp(cut / n), 4), "ppl_ratio": round(math.exp((cut - dense) / n), 4),
           "mean_exact_zero_fraction": round(float(frac.mean()), 4),
           "per_layer_exact_zero_fraction": [round(float(x), 4) for x in frac]}
    if site_zeros:
        fractions = {s: float(z[0].sum() / max(z[1].sum(), 1)) for s, z in site_zeros.items()}
        fractions[cuts.site] = float(frac.mean())
        out["site_exact_zero_fraction"] = {s: round(f, 4) for s, f in fractions.items()}
        out["model_wide_zero_fraction"] = round(model_wide(fractions, site_bytes(model)), 4)
    return out

