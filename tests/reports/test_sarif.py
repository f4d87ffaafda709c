"""SARIF 2.1.0 output validated against the official schema (fetched by scripts/test.sh)."""

from __future__ import annotations

import json

from contract.result import Status
from reports.sarif import RULE_IDS, sarif_dict, to_sarif


def test_check_sarif_validates_and_has_one_result_per_non_pass(falcon_report, sarif_validator, tmp_path):
    log = json.loads(to_sarif(falcon_report))
    sarif_validator.validate(log)
    assert log["version"] == "2.1.0" and log["$schema"].endswith("sarif-2.1.0.json")
    run = log["runs"][0]
    driver = run["tool"]["driver"]
    assert driver["name"] == "aios-contract" and driver["version"] == falcon_report.tool_version
    assert [r["id"] for r in driver["rules"]] == list(RULE_IDS)
    assert all(r["shortDescription"]["text"] and r["fullDescription"]["text"] for r in driver["rules"])
    status = {r.id: r.status for r in falcon_report.requirements}
    assert [r["ruleId"] for r in run["results"]] == [k for k, s in status.items() if s != Status.passed]
    for res in run["results"]:
        assert res["level"] == {"fail": "error", "error": "warning", "not_measured": "note"}[status[res["ruleId"]].value]
        assert driver["rules"][res["ruleIndex"]]["id"] == res["ruleId"]
        assert res["locations"][0]["physicalLocation"]["artifactLocation"]["uri"].endswith("config.json")
        assert all(m["evidence"] for m in res["properties"]["metrics"])
    assert run["invocations"][0]["exitCode"] == falcon_report.gate.exit_code
    # under a repository root the location is relative, as code scanning needs
    from aios.models.aliases import FIXTURES_DIR

    rel = sarif_dict(falcon_report, base=FIXTURES_DIR.parent.parent)
    art = rel["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["artifactLocation"]
    assert art == {"uri": "aios/fixtures/tiny-falcon/config.json", "uriBaseId": "%SRCROOT%"}
    sarif_validator.validate(rel)


def test_not_measured_is_a_note(sarif_validator):
    from contract.check import check_model

    rep = check_model("relullama-7b", samples=1, max_tokens=8)  # alias without weights
    log = sarif_dict(rep)
    sarif_validator.validate(log)
    levels = {r["ruleId"]: r["level"] for r in log["runs"][0]["results"]}
    assert levels["R1"] == "note" and "fetch" in log["runs"][0]["results"][0]["message"]["text"]
    assert "R2" not in levels or levels["R2"] == "error"
