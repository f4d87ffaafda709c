"""``check_model``: run the requirement checks, assign the tier, project, and gate."""

from __future__ import annotations

import time
from datetime import datetime, timezone

from aios import CONTRACT_VERSION, __version__
from aios.data import CALIBRATION_FILE, load_texts, texts_sha256
from aios.errors import AiosError, ExitCode, UsageError
from aios.models import ModelHandle, resolve_model
from contract.checks import CHECKS, REQUIREMENT_IDS
from contract.checks.base import CheckContext, Progress, no_progress
from contract.projection import project
from contract.quality import DEFAULT_MAX_PPL_RATIO, declared_quality, measured_quality
from contract.result import CheckReport, Evidence, Gate, Quality, RequirementResult, Status
from contract.spec import tier_ids, tiers

TIER_IDS = tier_ids()


def assign_tier(results: dict[str, RequirementResult]) -> dict:
    """The highest tier whose required requirements all pass."""
    best = tiers()[0]
    for t in tiers():
        if all(results[r].status == Status.passed for r in t["requires"]):
            best = t
    return best


def gate(results: dict[str, RequirementResult], required_tier: str | None, required: list[str],
         quality: Quality | None = None) -> Gate:
    """The CI gate: requested tier / requirements, plus the quality gate when it was asked for
    (``quality.max_ratio`` set by ``--baseline``)."""
    needed = list(dict.fromkeys(
        (next(t["requires"] for t in tiers() if t["id"] == required_tier) if required_tier else []) + required
    ))
    gated_quality = quality is not None and quality.max_ratio is not None
    if not required_tier and not required and not gated_quality:
        return Gate(exit_code=int(ExitCode.OK), reason="no gate requested (use --require-tier or --require)")
    failed = [r for r in needed if results[r].status == Status.failed]
    unknown = [r for r in needed if results[r].status in (Status.not_measured, Status.error)]
    quality_note = ""
    if gated_quality:
        assert quality is not None
        if quality.met is False:
            failed.append(f"quality (perplexity ratio {quality.ratio:.3f} > {quality.max_ratio:.2f})")
        elif quality.met is None:
            unknown.append("quality (held-out perplexity)")
        else:
            quality_note = f"perplexity ratio {quality.ratio:.3f} ≤ {quality.max_ratio:.2f}"
    if failed:
        return Gate(required_tier=required_tier, required=needed, met=False, exit_code=int(ExitCode.NOT_MET),
                    reason=f"required {', '.join(failed)} failed")
    if unknown:
        return Gate(required_tier=required_tier, required=needed, met=None,
                    exit_code=int(ExitCode.NOT_EVALUATED),
                    reason=f"required {', '.join(unknown)} could not be evaluated")
    what = [f"tier '{required_tier}'" if required_tier else ", ".join(needed)] if needed else []
    what += [quality_note] if quality_note else []
    return Gate(required_tier=required_tier, required=needed, met=True, exit_code=int(ExitCode.OK),
                reason=f"{'; '.join(what)} met")


def check_model(
    model: str | ModelHandle,
    *,
    calibration: str | None = None,
    samples: int | None = None,
    max_tokens: int = 128,
    context: int = 4096,
    require_tier: str | None = None,
    require: list[str] | None = None,
    progress: Progress = no_progress,
    baseline: str | ModelHandle | None = None,
    max_ppl_ratio: float = DEFAULT_MAX_PPL_RATIO,
    full_calibration: bool = False,
) -> CheckReport:
    """Score ``model`` against R1–R5. Library entry point behind ``aios-contract check``.

    With ``baseline`` the held-out perplexity of both is measured and the gate also requires
    perplexity / baseline perplexity ≤ ``max_ppl_ratio`` (contract.quality). R1 on a GGUF stops
    once the calibration set's pass or fail is settled (runtime.measure); ``full_calibration``
    runs every text.
    """
    t0 = time.perf_counter()
    require = [r.strip().upper() for r in (require or []) if r.strip()]
    bad = [r for r in require if r not in REQUIREMENT_IDS]
    if bad:
        raise UsageError(f"Unknown requirement {', '.join(bad)}; choose from {', '.join(REQUIREMENT_IDS)}.")
    if require_tier is not None and require_tier not in TIER_IDS:
        raise UsageError(f"Unknown tier '{require_tier}'; choose from {', '.join(TIER_IDS)}.")
    for name, value in (("--context", context), ("--max-tokens", max_tokens), ("--samples", samples)):
        if value is not None and value <= 0:
            raise UsageError(f"{name} must be positive, not {value}.")
    if not max_ppl_ratio > 0:
        raise UsageError(f"--max-ppl-ratio must be positive, not {max_ppl_ratio}.")
    if isinstance(baseline, str) and not baseline.strip():
        raise UsageError("--baseline is empty; pass the source model the artifact was converted from.")
    handle = model if isinstance(model, ModelHandle) else resolve_model(model)
    base = None
    if baseline is not None:  # resolve it before measuring anything: a bad name fails fast
        base = baseline if isinstance(baseline, ModelHandle) else resolve_model(baseline)
    texts = load_texts(calibration, limit=samples)
    ctx = CheckContext(calibration_texts=texts, calibration_source=str(calibration or CALIBRATION_FILE.name),
                       max_tokens=max_tokens, context=context, progress=progress,
                       keep_model=base is not None, full_calibration=full_calibration)
    results: dict[str, RequirementResult] = {}
    for rid, fn in CHECKS:
        t = time.perf_counter()
        try:
            res = fn(handle, ctx)
        except AiosError:
            raise
        except Exception as e:  # a bug or an unexpected model quirk: report, don't crash the gate
            res = RequirementResult(
                id=rid, title=rid, status=Status.error, summary=f"{rid} check failed: {e.__class__.__name__}: {e}",
                criterion="", evidence=Evidence.declared, reason=str(e),
            )
        # each requirement's wall time, loading what it is the first to need included, so the slow
        # part of a check is visible (report JSON, JUnit, the terminal's last line)
        results[rid] = res.model_copy(update={"seconds": round(time.perf_counter() - t, 3)})
    if base is not None:
        model_tok = ctx.cache.pop("torch_model", (None, None))
        quality: Quality | None = measured_quality(
            handle, base, max_ppl_ratio, model=model_tok[0], tokenizer=model_tok[1],
            progress=lambda msg: progress(msg, 0, 1))
    else:
        quality = declared_quality(handle)
    ctx.cache.pop("torch_model", None)
    tier = assign_tier(results)
    stats = ctx.cache.get("ffn_activity")
    return CheckReport(
        tool_version=__version__,
        contract_version=CONTRACT_VERSION,
        created_utc=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        model=handle.describe(),
        calibration={
            "source": ctx.calibration_source,
            "samples": len(texts),
            "sha256": texts_sha256(texts),
            "max_tokens": max_tokens,
            "tokens": stats.tokens if stats else 0,
            "samples_measured": len(stats.text_tokens) if stats and stats.text_tokens else len(texts),
        },
        requirements=[results[r] for r in REQUIREMENT_IDS],
        tier=tier["id"],
        tier_name=tier["name"],
        projection=project(handle, results, context, tier["id"]),
        quality=quality,
        gate=gate(results, require_tier, require, quality),
        seconds=round(time.perf_counter() - t0, 3),
    )
