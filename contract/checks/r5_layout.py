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
    criterion = ("manifest present (sidecar or embedded aios.manifest; every one found is verified) "
                 "with frequency_ordered: true, "
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
    # every manifest found is verified (embedded and each sidecar): a reader may pick any of
    # them, so one that disagrees with the file fails R5, named with its block
    layout = real_layout(handle.path, handle)
    verified: list[dict] = []
    first_problem: str | None = None
    blocks = 0
    for where, raw in sources:
        try:
            manifest = parse_manifest(raw, where)
        except ManifestProblem as e:  # its message already names the manifest
            problems = [str(e).removeprefix(f"{where}: ")]
        else:
            problems = verify(manifest, layout)
            blocks = blocks or len(manifest.layout)
        verified.append({"manifest": where, "ok": not problems, "problems": problems[:50]})
        if problems and first_problem is None:
            first_problem = f"Manifest {where}: {problems[0]}"
    init_s = time.perf_counter() - t0
    names = ", ".join(v["manifest"] for v in verified)
    metrics = [
        Metric(name="manifest", value=names, evidence=Evidence.declared),
        Metric(name="manifests_verified", value=len(verified), evidence=Evidence.measured),
        Metric(name="blocks", value=blocks, evidence=Evidence.declared),
        Metric(name="init_seconds", value=round(init_s, 4), unit="s", evidence=Evidence.measured,
               note="parse + verify every manifest found against the file layout"),
    ]
    passed = first_problem is None and init_s < spec["max_init_seconds"]
    if passed:
        summary = (f"Manifest {names} matches the file: {blocks} blocks ordered high → low."
                   if len(verified) == 1 else
                   f"All {len(verified)} manifests ({names}) match the file: {blocks} blocks ordered high → low.")
    else:
        summary = f"{first_problem or 'init too slow'}."
        if first_problem and len(verified) > 1:
            bad = sum(not v["ok"] for v in verified)
            summary += f" ({bad} of {len(verified)} manifests disagree with the file.)"
    problems = [f"{v['manifest']}: {p}" for v in verified for p in v["problems"]]
    return RequirementResult(
        **base, status=Status.passed if passed else Status.failed, evidence=Evidence.measured,
        metrics=metrics, summary=summary, details={"problems": problems[:50], "manifests": verified},
        seconds=init_s,
    )
