"""R1: the FFN activation yields exact zeros for ≥ 70 % of activations (measured)."""

from __future__ import annotations

import time

from aios.errors import AiosError, ExitCode
from aios.measure.ffn import DECISION_MIN_TEXTS, DECISION_Z, FfnActivity, SetEstimate, measure_ffn_activity
from aios.models import ModelHandle
from aios.models.handle import IncompleteWeightsError
from contract.checks.base import CheckContext
from contract.result import Evidence, Metric, RequirementResult, Status

ID, TITLE = "R1", "Exact-zero FFN activations"
FREQ_BINS = 20  # equal-width bins of per-neuron firing frequency over [0, 1]


class NoCalibrationTokensError(AiosError):
    """The calibration texts tokenized to nothing: R1 cannot be evaluated (exit 3)."""

    exit_code = ExitCode.NOT_EVALUATED


def activation_is_relu_family(activation: str, threshold: float | None, family: list[str],
                              threshold_site: str | None = None) -> tuple[bool, str]:
    act = activation.lower()
    if threshold_site is not None:  # aios-convert sparsify: the cut is part of the model
        where = "|act(gate)|" if threshold_site == "gate" else "the down projection's input"
        return True, (f"'{activation}' with calibrated per-layer thresholds on {where} "
                      "(aios.ffn_threshold.*): the zeros come from the thresholds, not from a ReLU")
    if act not in family:
        return False, f"'{activation}' is smooth: it never yields exact zeros"
    if act == "fatrelu" and threshold is None:
        return False, "thresholded ReLU without a declared threshold"
    return True, f"'{activation}' is ReLU-family"


def activity(handle: ModelHandle, ctx: CheckContext) -> FfnActivity:
    """Measured FFN statistics, computed once per check run and shared (projection, maps)."""
    if "ffn_activity" not in ctx.cache and handle.kind == "gguf":
        # executed as stored by the runtime: quantized blocks in place, alias/low-rank formats
        # applied, file-size memory (transformers' GGUF loader dequantizes every tensor and
        # random-initializes the ones it does not know)
        from runtime.measure import measure_ffn_activity_gguf

        n = len(ctx.calibration_texts)
        ctx.cache["ffn_activity"] = measure_ffn_activity_gguf(
            handle.path, ctx.calibration_texts, handle.load_tokenizer(), max_tokens=ctx.max_tokens,
            eps=ctx.spec(ID)["near_zero_eps"],
            progress=lambda done, _tot: ctx.progress("R1: running calibration prompts in aios-run", done, n),
            settle_at=None if ctx.full_calibration else ctx.spec(ID)["min_mean_zero_fraction"])
    if "ffn_activity" not in ctx.cache:
        n = len(ctx.calibration_texts)
        model, tokenizer = handle.load_torch(), handle.load_tokenizer()
        if ctx.keep_model:  # the quality gate runs the same model next: load it once
            ctx.cache["torch_model"] = (model, tokenizer)
        ctx.cache["ffn_activity"] = measure_ffn_activity(
            handle,
            ctx.calibration_texts,
            model=model,
            tokenizer=tokenizer,
            max_tokens=ctx.max_tokens,
            eps=ctx.spec(ID)["near_zero_eps"],
            progress=lambda done, _tot: ctx.progress("R1: running calibration prompts", done, n),
        )
    return ctx.cache["ffn_activity"]


def check(handle: ModelHandle, ctx: CheckContext) -> RequirementResult:
    t0 = time.perf_counter()
    spec = ctx.spec(ID)
    floor = spec["min_mean_zero_fraction"]
    f = handle.facts
    criterion = (
        f"ReLU-family activation ({', '.join(spec['relu_family'])}) and mean exact-zero fraction "
        f"of FFN activations over layers ≥ {floor:.2f}"
    )
    relu, why = activation_is_relu_family(f.activation, f.activation_threshold, spec["relu_family"],
                                          f.ffn_threshold_site)
    declared = Metric(name="ffn_activation", value=f.activation, evidence=Evidence.declared, note=f"from {f.activation_key}")
    zeros_from = ("calibrated thresholds (aios.ffn_threshold.site = "
                  f"'{f.ffn_threshold_site}')" if f.ffn_threshold_site else f"the activation ('{f.activation}')")
    base = dict(id=ID, title=TITLE, criterion=criterion)
    if not handle.has_weights:
        if not relu:
            return RequirementResult(
                **base, status=Status.failed, evidence=Evidence.declared, metrics=[declared],
                summary=f"Declared activation {why}; R1 cannot pass without retraining (aios-convert relufy).",
            )
        return RequirementResult(
            **base, status=Status.not_measured, evidence=Evidence.declared, metrics=[declared],
            summary="ReLU-family activation declared, but the zero fraction needs the weights.",
            reason="weights not on this machine", command=handle.fetch_hint(),
        )
    try:
        stats = activity(handle, ctx)
    except IncompleteWeightsError as e:  # transformers would run random weights: not a measurement
        return RequirementResult(
            **base, status=Status.not_measured, evidence=Evidence.declared, metrics=[declared],
            summary=("The zero fraction was not measured: transformers cannot load every weight of "
                     "this file, and a measurement on random-initialized weights would be noise."),
            reason=e.message,
            details={"not_loaded": e.keys[:50]},
        )
    if stats.tokens == 0:  # a fraction of nothing is not a measurement
        raise NoCalibrationTokensError(
            f"The calibration set ({ctx.calibration_source}) gave no tokens after tokenization, so "
            "R1 could not be measured; pass --calibration with text.")
    mean = stats.mean_zero_fraction
    est = stats.set_estimate()
    metrics = [
        declared,
        Metric(name="mean_exact_zero_fraction", value=round(mean, 6), evidence=Evidence.measured),
        Metric(name="mean_near_zero_fraction", value=round(stats.mean_near_zero_fraction, 6),
               evidence=Evidence.measured, note=f"|x| < {stats.eps:g}; information only, not exact zeros"),
        Metric(name="calibration_tokens", value=stats.tokens, evidence=Evidence.measured),
        *_set_metrics(est),
        Metric(name="min_layer_exact_zero_fraction", value=round(float(stats.zero_fraction.min()), 6),
               evidence=Evidence.measured),
        *(Metric(name=f"{site}_exact_zero_fraction", value=round(v, 6), evidence=Evidence.measured,
                 note=f"the {site} input cut (aios.input_threshold.{site}): information for the projection")
          for site, v in stats.site_zero_fraction.items()),
    ]
    details = {
        "per_layer_exact_zero_fraction": [round(float(x), 6) for x in stats.zero_fraction],
        "per_layer_near_zero_fraction": [round(float(x), 6) for x in stats.near_zero_fraction],
        "hook": f"input of {handle.arch.ffn_down} in every block",
        "engine": "aios-run (the file as stored)" if handle.kind == "gguf" else "transformers",
        "zeros_from": zeros_from,
        # distribution of per-neuron firing frequencies (for sparsity maps / plots)
        "neuron_frequency_deciles": [
            [round(float(q), 4) for q in _deciles(row)] for row in stats.neuron_frequency
        ],
        # per layer: how many neurons fire on a fraction of tokens in each bin (for plots)
        "neuron_frequency_histogram": _histogram(stats.neuron_frequency, FREQ_BINS),
    }
    early = est is not None and est.texts < est.of
    if early:  # runtime.measure stopped once the whole set's side of the floor was settled
        details["early_decision"] = {
            "texts_measured": est.texts, "texts_in_set": est.of, "interval": [round(est.low, 6), round(est.high, 6)],
            "z": DECISION_Z, "min_texts": DECISION_MIN_TEXTS, "order": "seeded random permutation (seed 0)"}
    passed = relu and mean >= floor
    if passed:
        summary = f"{mean:.1%} of FFN activations are exact zeros (≥ {floor:.0%})."
        if f.ffn_threshold_site:
            summary = f"{mean:.1%} of FFN activations are exact zeros (≥ {floor:.0%}), from {zeros_from}."
    elif not relu:
        summary = (f"Declared activation {why}: measured exact zeros {mean:.2%}, near-zero "
                   f"{stats.mean_near_zero_fraction:.1%}; relufy to pass.")
    else:
        summary = f"Only {mean:.1%} of FFN activations are exact zeros (needs ≥ {floor:.0%})."
    if early:
        summary += (f" Measured on {est.texts} of {est.of} calibration texts, where the set's pass or fail was "
                    f"settled: its mean lies in [{est.low:.1%}, {est.high:.1%}] (±{DECISION_Z:g} standard "
                    "errors); --full-calibration measures every text.")
    return RequirementResult(
        **base, status=Status.passed if passed else Status.failed, evidence=Evidence.measured,
        metrics=metrics, details=details, summary=summary,
        formula="mean over layers of (#x == 0) / (tokens × d_ffn), x = input of the FFN output projection",
        seconds=time.perf_counter() - t0,
    )


def _set_metrics(est: SetEstimate | None) -> list[Metric]:
    if est is None:
        return []
    return [Metric(name="calibration_texts", value=est.texts, evidence=Evidence.measured,
                   note=f"of {est.of} in the set" + ("" if est.texts == est.of else ": the decision was settled"))]


def _deciles(row):
    import numpy as np

    return np.quantile(row, np.linspace(0, 1, 11))


def _histogram(freq, bins: int) -> dict:
    """Counts of neurons per firing-frequency bin, per layer; ``freq`` is (L, d_ffn) in [0, 1]."""
    import numpy as np

    edges = np.linspace(0.0, 1.0, bins + 1)
    counts = [np.histogram(row, bins=edges)[0].astype(int).tolist() for row in freq]  # (L, bins)
    return {"bin_edges": [round(float(e), 4) for e in edges], "counts": counts}
