"""R3: core-zone layers are one canonical weight + small per-layer deltas.

Explicit structure (the alias format of ``aios.models.alias_format``, written by
``aios-convert alias``) is read directly: the aliasing ratio from the artifact's own tensor
bytes (the converter's definition, one shared function), ‖δ_i‖/‖W_c‖ from the stored
tensors (both *measured* from the artifact), and the perplexity change vs the
independent-weight model *declared* by the converter in the artifact's provenance (the
checker does not have the independent model to measure it). Ordinary checkpoints get the
*emergent* aliasing potential per matrix type in the core zone, streamed tensor by tensor,
and fail R3 with those numbers.
"""

from __future__ import annotations

import time

import numpy as np

import json

from aios.measure.similarity import (
    cosine_from_gram,
    rel_delta_from_gram,
    rel_delta_to_mean,
    streamed_gram,
)
from aios.models import ModelHandle
from aios.models import alias_format as af
from contract.checks.base import CheckContext
from contract.result import Evidence, Metric, RequirementResult, Status
from contract.spec import zone_threshold

ID, TITLE = "R3", "Core-zone canonical + delta weights"


def emergent_aliasing(handle: ModelHandle, ctx: CheckContext) -> dict:
    """Per matrix type: best cross-layer cosine and relative deltas of core-zone layers."""
    f, arch = handle.facts, handle.arch
    core = list(f.core_zone)
    thr = zone_threshold(core[len(core) // 2], f.n_layers, ctx.spec_version)
    max_delta = ctx.spec(ID)["max_relative_delta_norm"]
    out: dict[str, dict] = {}
    types = [t for t in arch.shareable if handle.stored_name(arch.block(0, t))]
    read = handle.tensor_rows
    if handle.kind == "gguf":  # quantized blocks decoded by the runtime's kernels, not gguf-py's numpy
        from runtime.measure import gguf_row_reader

        read = gguf_row_reader(handle.path)
    for k, rel in enumerate(types):
        ctx.progress("R3: streaming weight matrices", k, len(types))
        names = [handle.stored_name(arch.block(i, rel)) for i in range(f.n_layers)]
        if any(n is None for n in names):
            continue
        info = handle.store.inventory[names[0]]  # type: ignore[union-attr]
        rows, cols = info.shape[0], int(np.prod(info.shape[1:])) if len(info.shape) > 1 else 1
        G = streamed_gram(read, names, rows, cols)  # (L, L)
        cos = cosine_from_gram(G)
        rd = rel_delta_from_gram(G)
        full = [[round(float(x), 4) for x in row] for row in cos]  # (L, L), for the heatmap
        np.fill_diagonal(cos, -np.inf)
        best = cos[core].argmax(1)
        to_mean, _ = rel_delta_to_mean(G, core)
        out[rel] = {
            "core_layers": core,
            "best_partner": [int(b) for b in best],
            "best_cosine": [round(float(cos[i, b]), 6) for i, b in zip(core, best)],
            "rel_delta_to_best": [round(float(rd[i, b]), 6) for i, b in zip(core, best)],
            "rel_delta_to_core_mean": [round(float(x), 6) for x in to_mean],
            "pairs_over_zone_threshold": int(sum(cos[i, b] >= thr for i, b in zip(core, best))),
            "bytes_per_layer": int(info.nbytes),
            "aliasable_by_delta_criterion": int((to_mean < max_delta).sum()),
            "cosine_matrix": full,
        }
    ctx.progress("R3: streaming weight matrices", len(types), len(types))
    return {"zone_cosine_threshold": thr, "matrix_types": out}


def check(handle: ModelHandle, ctx: CheckContext) -> RequirementResult:
    t0 = time.perf_counter()
    spec = ctx.spec(ID)
    criterion = (f"aliasing ratio in core zone ≥ {spec['min_aliasing_ratio']:.2f}, ‖δ_i‖ < "
                 f"{spec['max_relative_delta_norm']:.0%} of ‖W_c‖ (Frobenius), perplexity delta < "
                 f"{spec['max_perplexity_delta']}")
    f = handle.facts
    base = dict(id=ID, title=TITLE, criterion=criterion)
    zone = Metric(name="core_zone_layers", value=f"{f.core_zone.start}..{f.core_zone.stop - 1}",
                  evidence=Evidence.analytic, note="⌊0.4L⌋..⌊0.6L⌋")
    if not handle.has_weights:
        return RequirementResult(
            **base, status=Status.not_measured, evidence=Evidence.declared, metrics=[zone],
            summary="Aliasing is measured on the weights, which are not on this machine.",
            reason="weights not on this machine", command=handle.fetch_hint(),
        )
    groups = af.groups_of(handle)
    if groups:
        return _explicit(handle, ctx, groups, base, zone, spec, t0)
    deltas = [t.name for t in handle.tensor_inventory() if ".delta" in t.name or t.name.endswith(".canonical")]
    if deltas:
        return RequirementResult(
            **base, status=Status.not_measured, evidence=Evidence.declared, metrics=[zone],
            summary=f"{len(deltas)} delta/canonical tensors found but no alias group records (aios.alias); "
                    "the structure cannot be read.",
            reason="alias tensors without aios.alias group records", details={"delta_tensors": deltas[:20]},
        )
    em = emergent_aliasing(handle, ctx)
    types = em["matrix_types"]
    core_bytes = sum(v["bytes_per_layer"] * len(v["core_layers"]) for v in types.values())
    potential_bytes = sum(v["bytes_per_layer"] * v["aliasable_by_delta_criterion"] for v in types.values())
    best_cos = max((max(v["best_cosine"]) for v in types.values()), default=float("nan"))
    min_delta = min((min(v["rel_delta_to_core_mean"]) for v in types.values()), default=float("nan"))
    potential = potential_bytes / core_bytes if core_bytes else 0.0
    metrics = [
        zone,
        Metric(name="aliasing_ratio", value=0.0, evidence=Evidence.declared,
               note="no canonical + delta structure stored: every core-zone matrix is independent"),
        Metric(name="emergent_aliasing_potential", value=round(potential, 6), evidence=Evidence.measured,
               note="core-zone bytes whose ‖W_i − mean‖/‖mean‖ < 10 %"),
        Metric(name="best_cross_layer_cosine", value=round(best_cos, 6), evidence=Evidence.measured),
        Metric(name="min_rel_delta_to_core_mean", value=round(min_delta, 6), evidence=Evidence.measured),
        Metric(name="zone_cosine_threshold", value=em["zone_cosine_threshold"], evidence=Evidence.declared),
    ]
    return RequirementResult(
        **base, status=Status.failed, evidence=Evidence.measured, metrics=metrics, details=em,
        summary=(f"No canonical + delta structure (aliasing ratio 0); emergent potential {potential:.1%}, "
                 f"best cross-layer cosine {best_cos:.3f}, smallest ‖δ‖/‖W_c‖ {min_delta:.1%}."),
        formula="cos(W_i, W_j) = <W_i, W_j>/(‖W_i‖‖W_j‖), ‖δ_i‖/‖W_c‖ with W_c = mean of core-zone W_i; all from a streamed Gram matrix",
        seconds=time.perf_counter() - t0,
    )


def declared_perplexity(handle: ModelHandle) -> dict | None:
    """The converter's measured perplexity change, as declared in the artifact's provenance."""
    if handle.kind == "gguf":
        d = handle.store.field("aios.alias.perplexity_delta")  # type: ignore[union-attr]
        if d is None:
            return None
        return {"perplexity_delta": float(d), "source": "GGUF key aios.alias.perplexity_delta",
                "heldout_perplexity": handle.store.field("aios.alias.heldout_perplexity"),  # type: ignore[union-attr]
                "source_heldout_perplexity": handle.store.field("aios.alias.source_heldout_perplexity")}  # type: ignore[union-attr]
    side = handle.path / af.SIDECAR if handle.path else None
    if side is None or not side.is_file():
        return None
    try:
        rep = json.loads(side.read_text())
        return {"perplexity_delta": float(rep["perplexity_delta"]), "source": af.SIDECAR,
                "heldout_perplexity": rep.get("heldout_perplexity"),
                "source_heldout_perplexity": rep.get("source_heldout_perplexity")}
    except (ValueError, KeyError, TypeError):
        return None


def _explicit(handle: ModelHandle, ctx: CheckContext, groups: list, base: dict, zone: Metric, spec: dict,
              t0: float) -> RequirementResult:
    ctx.progress("R3: reading canonical + delta tensors", 0, 1)
    ratio = af.ratio_of(handle, groups)
    norms = af.delta_norms(handle, groups)
    core = set(handle.facts.core_zone)
    core_norms = [n["rel_delta_norm"] for n in norms if n["layer"] in core]
    max_delta = max(core_norms, default=float("nan"))
    ppl = declared_perplexity(handle)
    ctx.progress("R3: reading canonical + delta tensors", 1, 1)
    ok_ratio = ratio.core_ratio >= spec["min_aliasing_ratio"]
    ok_delta = bool(core_norms) and max_delta < spec["max_relative_delta_norm"]
    metrics = [
        zone,
        Metric(name="aliasing_ratio", value=round(ratio.core_ratio, 6), evidence=Evidence.measured,
               note="core zone, from the artifact's tensor bytes; canonical charged pro rata to its group"),
        Metric(name="model_aliasing_ratio", value=round(ratio.model_ratio, 6), evidence=Evidence.measured,
               note="same definition over all layers"),
        Metric(name="max_rel_delta_norm", value=round(max_delta, 6), evidence=Evidence.measured,
               note="max over core-zone members of ‖δ_i‖_F/‖W_c‖_F, from the stored tensors"),
        Metric(name="max_rel_delta_spectral", value=round(max((n["rel_delta_spectral"] for n in norms
                                                               if n["layer"] in core), default=float("nan")), 6),
               evidence=Evidence.measured,
               note="same with spectral norms (the contract prose writes ‖·‖₂); information, not the criterion"),
        Metric(name="alias_groups", value=len(groups), evidence=Evidence.declared),
    ]
    if ppl is not None:
        metrics.append(Metric(name="perplexity_delta", value=round(ppl["perplexity_delta"], 4),
                              evidence=Evidence.declared,
                              note=f"held-out perplexity change vs the independent-weight model, measured by the "
                                   f"converter, read from {ppl['source']}"))
    details = {"aliasing": ratio.to_dict(), "delta_norms": norms, "declared_perplexity": ppl,
               "groups": json.loads(af.dumps(groups))}
    formula = f"aliasing ratio = {af.RATIO_DEFINITION}; ‖δ_i‖_F/‖W_c‖_F from the stored tensors"
    text = (f"canonical + delta structure: {len(groups)} group(s), core-zone aliasing ratio {ratio.core_ratio:.1%} "
            f"(model-wide {ratio.model_ratio:.1%}), max ‖δ_i‖/‖W_c‖ {max_delta:.1%}")
    if not (ok_ratio and ok_delta) or (ppl is not None and ppl["perplexity_delta"] >= spec["max_perplexity_delta"]):
        why = [w for w, bad in ((f"ratio < {spec['min_aliasing_ratio']:.0%}", not ok_ratio),
                                (f"deltas ≥ {spec['max_relative_delta_norm']:.0%}", not ok_delta),
                                ("declared perplexity change ≥ 1.0",
                                 ppl is not None and ppl["perplexity_delta"] >= spec["max_perplexity_delta"])) if bad]
        ppl_txt = f", declared perplexity change {ppl['perplexity_delta']:+.3f}" if ppl else ""
        return RequirementResult(**base, status=Status.failed, evidence=Evidence.measured, metrics=metrics,
                                 details=details, formula=formula, seconds=time.perf_counter() - t0,
                                 summary=f"{text}{ppl_txt}: fails ({'; '.join(why)}).")
    if ppl is None:
        return RequirementResult(**base, status=Status.not_measured, evidence=Evidence.measured, metrics=metrics,
                                 details=details, formula=formula, seconds=time.perf_counter() - t0,
                                 reason="no declared perplexity change vs the independent-weight model",
                                 command="re-create the artifact with aios-convert alias (it measures and records it)",
                                 summary=f"{text}; the perplexity change vs the independent model is not recorded.")
    return RequirementResult(**base, status=Status.passed, evidence=Evidence.measured, metrics=metrics,
                             details=details, formula=formula, seconds=time.perf_counter() - t0,
                             summary=f"{text}, declared perplexity change {ppl['perplexity_delta']:+.3f} (< 1.0).")
