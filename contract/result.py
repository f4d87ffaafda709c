"""Result types shared by every check and every report (versioned JSON schema via pydantic)."""

from __future__ import annotations

from enum import Enum
from typing import Any

from pydantic import BaseModel, Field

REPORT_SCHEMA_VERSION = "1.0"


class Evidence(str, Enum):
    """How a number was obtained (docs/design.md, "Evidence classes"). Projections are never measurements."""

    measured = "measured"  # ran the model / artifact
    analytic = "analytic"  # arithmetic from config values
    declared = "declared"  # read from metadata / config
    projected = "projected"  # a model of savings


class Status(str, Enum):
    passed = "pass"
    failed = "fail"
    not_measured = "not_measured"
    error = "error"


class Metric(BaseModel):
    name: str
    value: float | int | str | bool | None
    unit: str = ""
    evidence: Evidence
    note: str = ""


class RequirementResult(BaseModel):
    id: str  # "R1".."R5"
    title: str
    status: Status
    summary: str  # one sentence a release engineer can act on
    criterion: str  # the pass criterion with its threshold
    evidence: Evidence  # the evidence class the status rests on
    metrics: list[Metric] = Field(default_factory=list)
    formula: str | None = None
    reason: str | None = None  # why not_measured / error
    command: str | None = None  # what would make it measurable (e.g. fetch weights)
    details: dict[str, Any] = Field(default_factory=dict)  # per-layer arrays etc.
    seconds: float = 0.0

    def metric(self, name: str) -> Metric | None:
        return next((m for m in self.metrics if m.name == name), None)


class ProjectionTerm(BaseModel):
    term: str
    baseline_bytes: float
    projected_bytes: float
    basis: str  # which measured/analytic inputs drove the projection


class Projection(BaseModel):
    evidence: Evidence = Evidence.projected
    context: int
    formula: str
    terms: list[ProjectionTerm]
    baseline_mb_per_token: float
    projected_mb_per_token: float
    projected_reduction: float
    spec_projected_reduction: list[float] | None = None  # the contract's claim for the tier
    note: str = ""


class Quality(BaseModel):
    """Held-out perplexity of the checked model beside its baseline (the quality gate).

    ``evidence`` is ``measured`` when both were run here (``check --baseline``), ``declared``
    when the numbers are the ones an artifact's provenance recorded at conversion.
    """

    evidence: Evidence
    metric: str = "heldout_perplexity"
    perplexity: float | None = None  # of the checked model
    baseline: str | None = None  # the baseline / source model's name
    baseline_perplexity: float | None = None
    ratio: float | None = None  # perplexity / baseline_perplexity
    max_ratio: float | None = None  # the gate's limit (--max-ppl-ratio); None: not gated
    met: bool | None = None  # None: not gated, or could not be evaluated
    heldout: dict[str, Any] = Field(default_factory=dict)  # text source, digest, tokens
    source: str = ""  # where the numbers come from
    reason: str | None = None  # why it could not be evaluated


class Gate(BaseModel):
    required_tier: str | None = None
    required: list[str] = Field(default_factory=list)
    met: bool | None = None  # None when no gate was requested
    exit_code: int
    reason: str


class CheckReport(BaseModel):
    schema_version: str = REPORT_SCHEMA_VERSION
    tool: str = "aios-contract"
    tool_version: str
    contract_version: str
    created_utc: str
    model: dict[str, Any]
    calibration: dict[str, Any] | None = None
    requirements: list[RequirementResult]
    tier: str
    tier_name: str
    projection: Projection | None = None
    quality: Quality | None = None
    gate: Gate
    seconds: float


def report_json_schema() -> dict[str, Any]:
    return CheckReport.model_json_schema()
