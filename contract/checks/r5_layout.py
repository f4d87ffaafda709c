"""R5: frequency-ordered checkpoint with a JSON manifest matching the real file layout."""

from __future__ import annotations

import time

from aios.models import ModelHandle
from contract.checks.base import CheckContext
from contract.spec.manifest import ManifestProblem, candidate_paths, parse_manifest, real_layout, verify
from contract.result import Evidence, Metric, RequirementResult, Status

ID, TITLE = "R5", "Frequency-ordered checkpoint with manifest"


def check(handle: ModelHandle, ctx: CheckContext) -> RequirementResult:
    spec = ctx.spec(ID)
    criterion = ("manifest present (sidecar or embedded aios.manifest) with frequency_ordered: true, "
                 "every block present with matching offset/size, order high → medium → low, "
                 f"init from manifest < {spec['max_init_seconds']} s")
    base = dict(id=ID, title=TITLE, criterion=criterion)
    if not handle.has_weights or handle.path is None:
        return RequirementResult(
            **base, status=Status.not_measured, evidence=Evidence.declared,
            summary="The manifest and layout are checked against the model files, which are not on this machine.",
            reason="weights not on this machine", command=handle.fetch_hint(),
        )
    t0 = time.perf_counter()
    sources: list[tuple[str, str | bytes]] = []
    if handle.kind == "gguf":
        embedded = handle.store.field(spec["gguf_key"])  # type: ignore[union-attr]
        if isinstance(embedded, str):
            sources.append((f"embedded {spec['gguf_key']}", embedded))
    searched = candidate_paths(handle.path)
    sources += [(str(p), p.read_bytes()) for p in searched if p.is_file()]
    if not sources:
        return RequirementResult(
            **base, status=Status.failed, evidence=Evidence.declared,
            summary="No AIOS manifest found; write one with `aios-convert layout`.",
            details={"searched": [str(p) for p in searched] + ([spec["gguf_key"]] if handle.kind == "gguf" else [])},
        )
    where, raw = sources[0]
    try:
        manifest = parse_manifest(raw, where)
    except ManifestProblem as e:
        return RequirementResult(**base, status=Status.failed, evidence=Evidence.declared, summary=str(e))
    problems = verify(manifest, real_layout(handle.path, handle))
    init_s = time.perf_counter() - t0
    metrics = [
        Metric(name="manifest", value=where, evidence=Evidence.declared),
        Metric(name="blocks", value=len(manifest.layout), evidence=Evidence.declared),
        Metric(name="init_seconds", value=round(init_s, 4), unit="s", evidence=Evidence.measured,
               note="parse + verify against the file layout"),
    ]
    passed = not problems and init_s < spec["max_init_seconds"]
    summary = (f"Manifest {where} matches the file: {len(manifest.layout)} blocks ordered high → low."
               if passed else f"Manifest {where}: {problems[0] if problems else 'init too slow'}.")
    return RequirementResult(
        **base, status=Status.passed if passed else Status.failed, evidence=Evidence.measured,
        metrics=metrics, summary=summary, details={"problems": problems[:50]}, seconds=init_s,
    )
