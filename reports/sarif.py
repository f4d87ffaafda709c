"""SARIF 2.1.0 for ``aios-contract check`` (GitHub code scanning and other SARIF viewers).

One rule per requirement with stable ids R1–R5. Results are written only for requirements
that did not pass, with these levels:

* ``fail`` → ``error``: the model does not meet the requirement.
* ``error`` → ``warning``: the checker itself could not finish this requirement; look at it.
* ``not_measured`` → ``note``: a known gap with a reason (e.g. no weights) and the command
  that would make it measurable. A gate that requires it still exits 3.

Each result points at the model (its ``config.json`` for a folder, else the file), relative
to the current directory when the model lies under it, so code scanning can attach it to a
file of the repository. Metrics travel in ``properties`` with their evidence class.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from contract.result import CheckReport, RequirementResult, Status
from contract.spec import load_spec

SARIF_SCHEMA_URI = "https://json.schemastore.org/sarif-2.1.0.json"
RULE_IDS = ("R1", "R2", "R3", "R4", "R5")
LEVEL = {Status.failed: "error", Status.error: "warning", Status.not_measured: "note"}


def _name(title: str) -> str:
    return "".join(w[:1].upper() + w[1:] for w in re.split(r"[^A-Za-z0-9]+", title) if w)


def rules(contract_version: str, criteria: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """reportingDescriptors for R1–R5 from the contract spec; ``criteria`` adds the pass criterion."""
    reqs = load_spec(contract_version)["requirements"]
    out = []
    for rid in RULE_IDS:
        r = reqs[rid]
        full = r["statement"] + (f" Pass criterion: {criteria[rid]}." if criteria and criteria.get(rid) else "")
        out.append({
            "id": rid,
            "name": _name(r["title"]),
            "shortDescription": {"text": f"{rid}: {r['title']}"},
            "fullDescription": {"text": full},
            "defaultConfiguration": {"level": "error"},
            "properties": {"tags": ["aios-contract", f"contract-{contract_version}"]},
        })
    return out


def model_location(model: dict[str, Any], base: Path | None = None) -> dict[str, Any]:
    """physicalLocation of the model: repository-relative when it lies under ``base``."""
    path = model.get("path")
    if not path:
        return {"physicalLocation": {"artifactLocation": {"uri": str(model.get("spec", "model"))}},
                "message": {"text": f"model {model.get('spec')} (no local files)"}}
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    base = (base or Path.cwd()).resolve()
    try:
        rel = p.resolve().relative_to(base)
        art = {"uri": rel.as_posix(), "uriBaseId": "%SRCROOT%"}
    except ValueError:
        art = {"uri": p.resolve().as_uri()}
    return {"physicalLocation": {"artifactLocation": art}, "message": {"text": f"model {model.get('spec')}"}}


def _properties(r: RequirementResult) -> dict[str, Any]:
    props: dict[str, Any] = {"status": r.status.value, "evidence": r.evidence.value, "criterion": r.criterion,
                             "metrics": [m.model_dump(mode="json") for m in r.metrics]}
    if r.formula:
        props["formula"] = r.formula
    if r.reason:
        props["reason"] = r.reason
    if r.command:
        props["command"] = r.command
    return props


def result(r: RequirementResult, location: dict[str, Any], spec: str) -> dict[str, Any]:
    text = f"{r.id} {r.status.value}: {r.summary}"
    if r.command:
        text += f" To measure: {r.command}"
    return {
        "ruleId": r.id,
        "ruleIndex": RULE_IDS.index(r.id),
        "level": LEVEL[r.status],
        "message": {"text": text},
        "locations": [location],
        "partialFingerprints": {"aiosRequirement/v1": f"{r.id}:{spec}"},
        "properties": _properties(r),
    }


def sarif_log(driver_version: str, contract_version: str, results: list[dict[str, Any]],
              criteria: dict[str, str] | None = None, run_props: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "$schema": SARIF_SCHEMA_URI,
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {"name": "aios-contract", "version": driver_version,
                                "semanticVersion": driver_version,
                                "rules": rules(contract_version, criteria)}},
            "results": results,
            "columnKind": "unicodeCodePoints",
            "properties": run_props or {},
        }],
    }


def sarif_dict(report: CheckReport, base: Path | None = None) -> dict[str, Any]:
    loc = model_location(report.model, base)
    res = [result(r, loc, report.model["spec"]) for r in report.requirements if r.status != Status.passed]
    log = sarif_log(report.tool_version, report.contract_version, res,
                    {r.id: r.criterion for r in report.requirements},
                    {"model": report.model["spec"], "tier": report.tier, "tier_name": report.tier_name,
                     "contract_version": report.contract_version, "gate": report.gate.model_dump(mode="json")})
    log["runs"][0]["invocations"] = [{"executionSuccessful": True, "exitCode": report.gate.exit_code,
                                      "exitCodeDescription": report.gate.reason}]
    return log


def to_sarif(report: CheckReport) -> str:
    return json.dumps(sarif_dict(report), indent=2, ensure_ascii=False) + "\n"


__all__ = ["LEVEL", "RULE_IDS", "model_location", "result", "rules", "sarif_dict", "sarif_log", "to_sarif"]
