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
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from aios import __version__
from aios.errors import InvalidModelError, UsageError
from convert.sparsify_measure import (  # noqa: F401  (LEVELS, LayerCurve: part of this module's API)
    LEVELS, SENSITIVITY_LEVELS, LayerCurve, capture_ffn_inputs, layer_curve, nll, sensitivities, stack_thresholds,
)
from runtime.thresholds import KEY_SITE, KEY_VALUES, SITES, FfnThresholds

# uniform: every layer at the target (the default: on the real Gemma 3 270M, held-out perplexity
# ratio at 50 % 1.051 uniform, 1.057 greedy by local error scaled by one KL, 1.083 greedy by KL at
# three levels; docs/benchmarks.md "Training-free sparsity"); greedy: per-layer levels by
# measured sensitivity (the Sensitivity and Allocation steps of the module docstring)
ALLOCATIONS = ("uniform", "greedy")
# Where FFNs are cut by default (key: the FFN is gated). Measured on the real Gemma 3 270M
# (docs/benchmarks.md, "Training-free sparsity"), uniform 50 % per layer, held-out perplexity
# ratio: down_in 1.058, gate 1.335 (1.282 with per-neuron weights). The gate site also skips the
# up rows (twice the bytes at one zero fraction) and is kept as --site gate.
DEFAULT_SITE = {True: "down_in", False: "down_in"}
KEY_PREFIX = "aios.ffn_threshold."
Progress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class SparsifyConfig:
    """What ``aios-convert sparsify`` was asked for (recorded in the file, ``aios.ffn_threshold.config``)."""

    target: float | None = 0.5  # mean zero fraction over FFN layers on the calibration tokens
    max_ppl_ratio: float | None = None  # instead of target: the sparsest file within this ratio
    site: str | None = None  # None: DEFAULT_SITE of the FFN kind
    allocation: str = "uniform"  # measured best on the real Gemma 3 270M (ALLOCATIONS)
    calibration: str | None = None  # JSONL/TXT file; None: the fixtures' pydoc train split
    tokens: int = 2048  # calibration tokens (curves and cut values)
    sensitivity_tokens: int = 256  # tokens of each layer's KL pass
    window: int = 256  # tokens per forward pass (each window starts with BOS where the model uses one)
    heldout_tokens: int = 4096  # held-out tokens of the report's perplexity and zero fraction (0: skip)
    max_layer_sparsity: float = 0.95
    sparse_down: bool = False  # store FFN down projections neuron-major (re-encoded)

    def check(self, gated: bool) -> None:
        if (self.target is None) == (self.max_ppl_ratio is None):
            raise UsageError("Give one of --target and --max-ppl-ratio.")
        if self.target is not None and not 0 < self.target < 1:
            raise UsageError(f"--target is a zero fraction between 0 and 1; got {self.target}.")
        if self.target is not None and self.target > self.max_layer_sparsity:
            raise UsageError(f"--target {self.target} is above the per-layer cap {self.max_layer_sparsity}.")
        if self.max_ppl_ratio is not None and not self.max_ppl_ratio > 1:
            raise UsageError(f"--max-ppl-ratio is a perplexity ratio above 1; got {self.max_ppl_ratio}.")
        if self.site is not None and self.site not in SITES:
            raise UsageError(f"--site is one of {', '.join(SITES)}; got {self.site!r}.")
        if self.site == "gate" and not gated:
            raise UsageError("--site gate needs a gated FFN (SwiGLU, GeGLU); this model's FFN has no gate: "
                             "use --site down_in.")
        if self.allocation not in ALLOCATIONS:
            raise UsageError(f"--allocation is one of {', '.join(ALLOCATIONS)}; got {self.allocation!r}.")
        for name in ("tokens", "sensitivity_tokens", "window"):
            if getattr(self, name) < 2:
                raise UsageError(f"--{name.replace('_', '-')} must be at least 2; got {getattr(self, name)}.")


@dataclass
class SparsifyResult:
    output: Path | None
    site: str
    target: float
    layer_sparsity: list[float]
    thresholds: list[float]  # per layer: its cut, or the median of its per-neuron cuts (per_neuron)
    calibration: dict
    heldout: dict = field(default_factory=dict)
    seconds: dict = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    per_neuron: bool = False  # the file holds one cut per neuron (gate site)

    def to_json(self) -> dict:
        d = asdict(self)
        d["output"] = None if self.output is None else str(self.output)
        return d


# --- token windows -----------------------------------------------------------------------


def bos_prefix(tokenizer) -> list[int]:
    """The special tokens the model's tokenizer puts before a text (Gemma/Llama: BOS; GPT-2: none)."""
    ids = tokenizer("", add_special_tokens=True)["input_ids"]
    return list(ids)


def windows(stream: np.ndarray, n_tokens: int, window: int, prefix: list[int]) -> list[list[int]]:
    """The first ``n_tokens`` of ``stream`` cut into windows of ``window`` tokens, each after ``prefix``."""
    body = window - len(prefix)
    if body < 1:
        raise UsageError(f"--window {window} leaves no room after the {len(prefix)} prefix token(s).")
    ids = [int(t) for t in stream[:n_tokens]]
    return [prefix + ids[i : i + body] for i in range(0, len(ids), body) if len(ids[i : i + body]) >= 2]


def calibration_stream(tokenizer, path: str | None):
    """(token stream, description) of the calibration texts."""
    from aios.evaluation import file_tokens, pydoc_split

    ts = pydoc_split(tokenizer, "train") if path is None else file_tokens(tokenizer, path)
    return ts.ids.numpy(), ts.describe()


# --- allocation (pure) ------------------------------------------------------------------------


def costs(curves: list[LayerCurve]) -> np.ndarray:
    """(layers, levels) cost of each layer at each level: its measured KL, interpolated (0 at 0),
    past the last measured level scaled by the local error; without KL (uniform) the local error."""
    last = int(np.argmin(np.abs(LEVELS - SENSITIVITY_LEVELS[-1])))
    rows = []
    for c in curves:
        if c.sensitivity is None:
            rows.append(c.error.copy())
            continue
        cost = np.interp(LEVELS, (0.0, *SENSITIVITY_LEVELS), (0.0, *c.sensitivity))
        if c.error[last] > 0:
            cost[last + 1:] = c.sensitivity[-1] * c.error[last + 1:] / c.error[last]
        rows.append(np.maximum.accumulate(cost) + c.error * 1e-12)  # ties: the smaller local error first
    return np.array(rows)


def allocate(cost: np.ndarray, target: float, max_level: float, allocation: str = "greedy") -> np.ndarray:
    """Per layer, the index into LEVELS of its zero fraction: mean over layers ≥ ``target``."""
    n = cost.shape[0]
    top = int(np.searchsorted(LEVELS, max_level + 1e-9)) - 1
    if allocation == "uniform":
        k = min(int(np.searchsorted(LEVELS, target - 1e-9)), top)
        return np.full(n, k)
    idx = np.zeros(n, int)
    while LEVELS[idx].mean() < target - 1e-9:
        best, best_rate = -1, math.inf
        for layer in range(n):
            k = idx[layer]
            if k >= top:
                continue
            rate = (cost[layer, k + 1] - cost[layer, k]) / (LEVELS[k + 1] - LEVELS[k])
            if rate < best_rate:
                best, best_rate = layer, rate
        if best < 0:
            break
        idx[best] += 1
    return idx


# --- the command ----------------------------------------------------------------------------


@dataclass
class Calibration:
    """Everything measured before a target is chosen: one calibration serves any number of
    targets (``cuts_for``), as the curve benchmark uses it."""

    model: object  # runtime.model.Model of the source file (dense, thresholds off)
    tokenizer: object
    prefix: list[int]
    site: str
    curves: list[LayerCurve]
    cost: np.ndarray
    wins: list[list[int]]
    base_nll: float
    n_scored: int
    source: dict
    seconds: dict
    warnings: list[str]

    def cuts_for(self, target: float, config: SparsifyConfig) -> tuple[np.ndarray, FfnThresholds]:
        """(per-layer zero fractions, thresholds) for a mean zero fraction of ``target``."""
        idx = allocate(self.cost, target, config.max_layer_sparsity, config.allocation)
        return LEVELS[idx], FfnThresholds(self.site, stack_thresholds([c.thresholds(k) for c, k in zip(self.curves, idx)]))

    def ppl_ratio(self, cuts: FfnThresholds) -> float:
        """Perplexity ratio (cut / dense) on the calibration tokens."""
        return math.exp((nll(self.model, self.wins, cuts, len(self.prefix))[0] - self.base_nll) / self.n_scored)


def check_paths(src: Path, out: Path) -> None:
    from aios.errors import ModelNotFoundError

    if not src.exists():
        raise ModelNotFoundError(f"No such GGUF file: {src}.")
    if not src.is_file() or src.suffix.lower() != ".gguf":
        raise InvalidModelError(f"sparsify reads a .gguf file; '{src}' is not one (export an HF folder first: "
                                "`aios-convert gguf MODEL -o FILE.gguf --outtype q8_0`).")
    if out.exists() and out.resolve() == src.resolve():
        raise UsageError("-o must differ from the input file (the input is read while writing).")
    if out.suffix.lower() != ".gguf":
        raise UsageError(f"-o names the output GGUF; '{out}' does not end in .gguf.")


def calibrate(src: Path, config: SparsifyConfig, progress: Progress | None = None) -> Calibration:
    """Load ``src`` in aios-run and measure the per-layer curves and sensitivities."""
    from aios.models.gguf_tokenizer import load_gguf_tokenizer
    from runtime.model import Model

    tell = progress or (lambda *a: None)
    t0 = time.perf_counter()
    model = Model(src, mode="dense")
    hp = model.hp
    config.check(hp.graph.gated_ffn)
    site = config.site or DEFAULT_SITE[hp.graph.gated_ffn]
    warnings = []
    if model.thresholds is not None:
        warnings.append(f"{src.name} already has FFN thresholds ({model.thresholds.site}); "
                        "they are recalibrated from the dense model and replaced")
        model.thresholds = None
    tok = load_gguf_tokenizer(src)
    prefix = bos_prefix(tok)
    stream, source = calibration_stream(tok, config.calibration)
    wins = windows(stream, config.tokens, config.window, prefix)
    if not wins:
        raise UsageError(f"The calibration texts ({source['source']}) gave fewer than 2 tokens.")
    seconds = {"load": time.perf_counter() - t0}

    t0 = time.perf_counter()
    tell("calibration: FFN inputs", 0, 1)
    H = capture_ffn_inputs(model, wins)
    tell("calibration: FFN inputs", 1, 1)
    curves = []
    for layer in range(hp.n_layers):
        curves.append(layer_curve(model, layer, H[layer], site))
        H[layer] = None  # type: ignore[call-overload]  (freed as it goes)
        tell("calibration: per-layer cut curves", layer + 1, hp.n_layers)
    seconds["curves"] = time.perf_counter() - t0
    if config.allocation == "greedy":
        t0 = time.perf_counter()
        sensitivities(model, windows(stream, config.sensitivity_tokens, config.window, prefix), curves, site,
                      progress)
        seconds["sensitivity"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    tell("calibration: dense perplexity", 0, 1)
    base_nll, n_scored = nll(model, wins, None, len(prefix))
    tell("calibration: dense perplexity", 1, 1)
    seconds["dense_ppl"] = time.perf_counter() - t0
    return Calibration(model, tok, prefix, site, curves, costs(curves), wins, base_nll, n_scored, source,
                       seconds, warnings)


def choose_target(cal: Calibration, config: SparsifyConfig, progress: Progress | None = None) -> tuple[float, list]:
    """The target itself, or under ``max_ppl_ratio`` the largest one (bisection, 7 steps: ~1 % of
    sparsity) whose calibration perplexity ratio stays within it, with the steps tried."""
    if config.max_ppl_ratio is None:
        return float(config.target), []  # type: ignore[arg-type]
    lo, hi, best, search = 0.0, config.max_layer_sparsity, None, []
    for step in range(7):
        mid = (lo + hi) / 2
        ratio = cal.ppl_ratio(cal.cuts_for(mid, config)[1])
        search.append({"target": round(mid, 4), "calibration_ppl_ratio": round(ratio, 4)})
        lo, hi, best = (mid, hi, mid) if ratio <= config.max_ppl_ratio else (lo, mid, best)
        if progress:
            progress("searching the target under --max-ppl-ratio", step + 1, 7)
    if best is None:
        raise UsageError(f"No FFN sparsity keeps the calibration perplexity within {config.max_ppl_ratio}× "
                         f"(at {search[-1]['target']:.1%}: {search[-1]['calibration_ppl_ratio']}×).")
    return best, search


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
    levels, cuts = cal.cuts_for(target, config)
    calibration = {
        **cal.source, "tokens_used": int(sum(len(w) for w in cal.wins)), "window": config.window,
        "allocation": config.allocation, "sensitivity_levels": list(SENSITIVITY_LEVELS),
        "ppl_dense": round(math.exp(cal.base_nll / cal.n_scored), 4), "ppl_ratio": round(cal.ppl_ratio(cuts), 4),
        "sensitivity_kl": [None if c.sensitivity is None else [round(float(x), 6) for x in c.sensitivity]
                           for c in cal.curves], "target_search": search,
    }
    seconds = dict(cal.seconds, allocation=time.perf_counter() - t0)
    return finish(cal, out, target, levels, cuts, calibration, config, seconds, progress, t_start)


def finish(cal: Calibration, out: Path, target: float, levels: np.ndarray, cuts: FfnThresholds, calibration: dict,
           config: SparsifyConfig, seconds: dict, progress: Progress | None, t_start: float) -> SparsifyResult:
    """Measure the held-out figures of ``cuts`` and write the file."""
    heldout = {}
    if config.heldout_tokens:
        t0 = time.perf_counter()
        if progress:
            progress("held-out perplexity and zeros", 0, 1)
        heldout = measure_heldout(cal.model, cal.tokenizer, cal.prefix, cuts, config)
        if progress:
            progress("held-out perplexity and zeros", 1, 1)
        seconds["heldout"] = time.perf_counter() - t0
    per_layer = cuts.values if cuts.values.ndim == 1 else np.median(cuts.values, axis=1)
    result = SparsifyResult(out, cal.site, round(target, 4), [round(float(x), 4) for x in levels],
                            [float(x) for x in per_layer], calibration, heldout, seconds,
                            list(cal.warnings), per_neuron=cuts.values.ndim == 2)
    result.warnings.append("llama.cpp ignores aios.ffn_threshold.*: it runs this file as the dense "
                           f"'{cal.model.hp.activation}' model it came from, without the thresholds "
                           "(aios-run applies them)")
    t0 = time.perf_counter()
    write_sparsified(cal.model.path, out, metadata(result, cuts, config), cal.model, config.sparse_down,
                     result.warnings)
    seconds["write"] = time.perf_counter() - t0
    seconds["total"] = time.perf_counter() - t_start
    return result


def measure_heldout(model, tok, prefix: list[int], cuts: FfnThresholds, config: SparsifyConfig,
                    dense_cache: dict | None = None) -> dict:
    """Perplexity (dense and cut) and the cut model's exact-zero fraction of the down projections'
    inputs, on the held-out pydoc split (never used by calibration). ``dense_cache``: a dict that
    keeps the dense NLL between calls with the same model and settings (the curve benchmark)."""
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

    model.ffn_act_hook = hook
    try:
        cut, _ = nll(model, wins, cuts, len(prefix))
    finally:
        model.ffn_act_hook = None
    frac = zeros / np.maximum(seen, 1)
    return {**ts.describe(), "tokens_scored": n, "ppl_dense": round(math.exp(dense / n), 4),
            "ppl_sparse": round(math.exp(cut / n), 4), "ppl_ratio": round(math.exp((cut - dense) / n), 4),
            "mean_exact_zero_fraction": round(float(frac.mean()), 4),
            "per_layer_exact_zero_fraction": [round(float(x), 4) for x in frac]}


def metadata(result: SparsifyResult, cuts: FfnThresholds, config: SparsifyConfig) -> dict[str, object]:
    """The ``aios.ffn_threshold.*`` keys of the output file."""
    cfg = asdict(config)
    if cfg["calibration"]:
        cfg["calibration"] = Path(cfg["calibration"]).name
    return {
        KEY_SITE: result.site,
        KEY_VALUES: np.ravel(cuts.values).astype(np.float32).tolist(),
        KEY_PREFIX + "layer_sparsity": [float(x) for x in result.layer_sparsity],
        KEY_PREFIX + "target": float(result.target),
        KEY_PREFIX + "calibration": json.dumps(result.calibration, sort_keys=True),
        KEY_PREFIX + "config": json.dumps(cfg, sort_keys=True),
        KEY_PREFIX + "tool_version": __version__,
        KEY_PREFIX + "runtime": "aios-run applies the thresholds; llama.cpp ignores them (dense smooth activation)",
    }


def write_sparsified(src: Path, out: Path, meta: dict[str, object], model, sparse_down: bool,
                     warnings: list[str]) -> None:
    """``src`` with ``meta`` added: every tensor copied byte for byte, or, with ``sparse_down``,
    the FFN down projections re-encoded neuron-major (``blk.N.ffn_down.t``)."""
    import re

    import gguf

    from convert.gguf import add_metadata, atomic_output
    from convert.gguf.metadata import sparse_down_keys
    from convert.gguf.writer import FileSlice, copy_fields

    reader = model.reader
    extra = dict(meta)
    if sparse_down:
        extra.update(sparse_down_keys(model.hp.n_layers))
    out.parent.mkdir(parents=True, exist_ok=True)
    skip = set(extra)
    with atomic_output(out) as tmp:
        w = gguf.GGUFWriter(str(tmp), reader.fields["general.architecture"].contents())
        copy_fields(w, reader, skip=lambda key: key.startswith(KEY_PREFIX) or key in skip)
        add_metadata(w, extra)
        data = []
        for t in reader.tensors:
            if sparse_down and re.fullmatch(r"blk\.\d+\.ffn_down\.weight", t.name):
                name, arr, typ, why = _neuron_major(src, t)
                if why:
                    warnings.append(f"{name}: {why}")
                w.add_tensor_info(name, _elem_shape(t), np.dtype(np.float32), int(arr.nbytes),
                                  raw_dtype=gguf.GGMLQuantizationType[typ])
                data.append(arr)
                continue
            w.add_tensor_info(t.name, tuple(int(d) for d in reversed(t.shape.tolist())),
                              np.dtype(np.float32), int(t.n_bytes), raw_dtype=t.tensor_type)
            data.append(FileSlice(src, int(t.data_offset), int(t.n_bytes)))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        for d in data:
            w.write_tensor_data(d)  # type: ignore[arg-type]
        w.close()


def _elem_shape(t) -> tuple[int, int]:
    """The neuron-major shape (d_ffn, d_model) of down projection ``t`` (stored d_model × d_ffn)."""
    d_ffn, d_model = (int(x) for x in t.shape.tolist())  # ggml order: row length first
    return d_ffn, d_model


def _neuron_major(src: Path, t) -> tuple[str, np.ndarray, str, str | None]:
    """(name, encoded bytes, GGML type name, fallback reason) of ``t`` transposed to d_ffn rows
    of d_model, in its own type where d_model fits the type's blocks (else the export's fallback)."""
    from convert.gguf.plan import SPARSE_DOWN
    from convert.gguf.tensors import choose_type, encode
    from runtime.measure import gguf_row_reader

    d_ffn, d_model = _elem_shape(t)
    w = gguf_row_reader(src)(t.name, 0, d_model)  # (d_model, d_ffn) float32, the stored values
    wt = np.ascontiguousarray(w.T)
    kind = t.tensor_type.name.lower()
    typ, why = choose_type(wt.shape, kind) if kind in _ENCODABLE else ("q8_0", f"{kind.upper()} is not re-encoded "
                                                                               "by this tool")
    arr = encode(wt, typ)
    return SPARSE_DOWN.format(base=t.name.removesuffix(".weight")), arr, typ.upper(), (
        None if why is None else f"stored as {typ.upper()} ({why})")


_ENCODABLE = ("f32", "f16", "q8_0", "q4_0", "q5_0", "q4_k", "q6_k", "q2_k")
