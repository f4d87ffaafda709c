"""Steps 1-4 of sparsify's calibration (``convert/sparsify/__init__.py``): token windows, the
per-layer curves and sensitivities measured on the GGUF in aios-run, the allocation of zero
fractions over layers, and the target search under ``--max-ppl-ratio``."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from aios.errors import InvalidModelError, UsageError
from convert.sparsify.config import DEFAULT_SITE, R1_FLOOR, R1_MARGIN, Progress, SparsifyConfig
from convert.sparsify.measure import (
    LEVELS,
    SENSITIVITY_LEVELS,
    LayerCurve,
    capture_ffn_inputs,
    layer_curve,
    nll,
    sensitivities,
    stack_thresholds,
    zero_fraction,
)
from convert.sparsify.sites import (
    allocate_sites,
    capture_site_magnitudes,
    input_cuts_at,
    site_bytes,
    site_costs,
)
from runtime.thresholds import FfnThresholds, InputThresholds

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
    site_cuts: dict | None = None  # --scope all: per input site, (layers, LEVELS) cut values
    site_costs: dict | None = None  # --scope all, greedy: per site (the FFN's too), KL at SITE_LEVELS
    site_bytes: dict | None = None  # per site, the bytes of the matrices that read it

    def fractions_for(self, target: float, config: SparsifyConfig) -> dict[str, float] | None:
        """--scope all: per site (the input sites and the FFN's), its zero fraction for a model-wide
        ``target``: the target itself (uniform), or the measured site allocation (greedy); None
        under --scope ffn."""
        if self.site_cuts is None:
            return None
        if self.site_costs is None:
            return {**dict.fromkeys(self.site_cuts, target), self.site: target}
        return allocate_sites(self.site_costs, self.site_bytes, target, config.max_layer_sparsity)

    def inputs_for(self, target: float, config: SparsifyConfig) -> InputThresholds | None:
        """The input sites' cuts for ``target`` (``fractions_for``); None under --scope ffn."""
        frac = self.fractions_for(target, config)
        return None if frac is None else input_cuts_at(self.site_cuts, frac)

    def cuts_for(self, target: float, config: SparsifyConfig) -> tuple[np.ndarray, FfnThresholds]:
        """(per-layer zero fractions, thresholds) for a mean zero fraction of ``target``: uniform,
        every layer at ``target`` itself (cuts interpolated between the grid's quantiles);
        greedy, grid levels whose mean reaches it."""
        sites = self.fractions_for(target, config)
        if config.allocation == "uniform" or sites is not None:  # (--scope all: uniform within each site)
            frac = min(target if sites is None else sites[self.site], config.max_layer_sparsity)
            return (np.full(len(self.curves), frac),
                    FfnThresholds(self.site, stack_thresholds([c.thresholds_at(frac) for c in self.curves])))
        idx = allocate(self.cost, target, config.max_layer_sparsity, config.allocation)
        return LEVELS[idx], FfnThresholds(self.site, stack_thresholds([c.thresholds(k) for c, k in zip(self.curves, idx)]))

    def ppl_ratio(self, cuts: FfnThresholds, inputs: InputThresholds | None = None) -> float:
        """Perplexity ratio (cut / dense) on the calibration tokens."""
        total = nll(self.model, self.wins, cuts, len(self.prefix), inputs)[0]
        return math.exp((total - self.base_nll) / self.n_scored)


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
    if model.thresholds is not None or model.input_cuts is not None:
        warnings.append(f"{src.name} already has activation thresholds; they are recalibrated from the dense "
                        "model and replaced")
        model.thresholds = model.input_cuts = None
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
        # (the local error curves feed only the per-layer greedy allocation)
        curves.append(layer_curve(model, layer, H[layer], site,
                                  errors=config.allocation == "greedy" and config.scope == "ffn"))
        H[layer] = None  # type: ignore[call-overload]  (freed as it goes)
        tell("calibration: per-layer cut curves", layer + 1, hp.n_layers)
    seconds["curves"] = time.perf_counter() - t0
    site_cuts = None
    if config.scope == "all":
        t0 = time.perf_counter()
        tell("calibration: attention and FFN inputs (--scope all)", 0, 1)
        site_cuts = capture_site_magnitudes(model, wins)
        tell("calibration: attention and FFN inputs (--scope all)", 1, 1)
        seconds["input_sites"] = time.perf_counter() - t0
    costs_by_site = None
    if config.allocation == "greedy" and site_cuts is None:
        t0 = time.perf_counter()
        sensitivities(model, windows(stream, config.sensitivity_tokens, config.window, prefix), curves, site,
                      progress)
        seconds["sensitivity"] = time.perf_counter() - t0
    elif config.allocation == "greedy":  # --scope all: one KL curve per site, every layer cut alike
        t0 = time.perf_counter()

        def cuts_at(s: str, f: float):
            if s == site:
                return FfnThresholds(site, stack_thresholds([c.thresholds_at(f) for c in curves])), None
            return None, input_cuts_at({s: site_cuts[s]}, f)

        sens = windows(stream[config.tokens:] if len(stream) > config.tokens + 64 else stream,
                       config.sensitivity_tokens, config.window, prefix)
        costs_by_site = site_costs(model, sens, cuts_at, (*site_cuts, site), progress)
        seconds["sensitivity"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    tell("calibration: dense perplexity", 0, 1)
    base_nll, n_scored = nll(model, wins, None, len(prefix))
    tell("calibration: dense perplexity", 1, 1)
    seconds["dense_ppl"] = time.perf_counter() - t0
    return Calibration(model, tok, prefix, site, curves, costs(curves), wins, base_nll, n_scored, source,
                       seconds, warnings, site_cuts, costs_by_site, site_bytes(model))


def choose_target(cal: Calibration, config: SparsifyConfig, progress: Progress | None = None) -> tuple[float, list]:
    """The target itself, or under ``max_ppl_ratio`` the largest one (bisection, 7 steps: ~1 % of
    sparsity) whose calibration perplexity ratio stays within it, with the steps tried."""
    if config.max_ppl_ratio is None:
        return float(config.target), []  # type: ignore[arg-type]
    lo, hi, best, search = 0.0, config.max_layer_sparsity, None, []
    for step in range(7):
        mid = (lo + hi) / 2
        ratio = cal.ppl_ratio(cal.cuts_for(mid, config)[1], cal.inputs_for(mid, config))
        search.append({"target": round(mid, 4), "calibration_ppl_ratio": round(ratio, 4)})
        lo, hi, best = (mid, hi, mid) if ratio <= config.max_ppl_ratio else (lo, mid, best)
        if progress:
            progress("searching the target under --max-ppl-ratio", step + 1, 7)
    if best is None:
        raise UsageError(f"No FFN sparsity keeps the calibration perplexity within {config.max_ppl_ratio}× "
                         f"(at {search[-1]['target']:.1%}: {search[-1]['calibration_ppl_ratio']}×).")
    return best, search




def aim_r1(cal: Calibration, config: SparsifyConfig, progress: Progress | None = None) -> tuple[float, list]:
    """``--target r1``: the target whose cut measures at least R1_FLOOR + R1_MARGIN exact zeros on
    held-out texts calibration never saw (aios/data/heldout.jsonl, each text one window), with
    the rounds tried: start there, then raise the target by each round's shortfall (4 rounds)."""
    from aios.data import HELDOUT_FILE
    from aios.evaluation import load_texts

    body = config.window - len(cal.prefix)
    wins = [cal.prefix + cal.tokenizer(t, add_special_tokens=False)["input_ids"][:body]
            for t in load_texts(HELDOUT_FILE)]
    wins = [w for w in wins if len(w) >= 2]
    goal = R1_FLOOR + R1_MARGIN
    target, rounds = goal, []
    for r in range(4):
        z = zero_fraction(cal.model, wins, cal.cuts_for(target, config)[1], cal.inputs_for(target, config))
        rounds.append({"target": round(target, 4), "heldout_zero_fraction": round(z, 4)})
        if progress:
            progress("aiming at R1 on held-out texts", r + 1, 4)
        if z >= goal - 1e-3 or target >= config.max_layer_sparsity:
            break
        target = min(target + goal - z, config.max_layer_sparsity)
    if progress and r < 3:
        progress("aiming at R1 on held-out texts", 4, 4)
    return target, rounds
