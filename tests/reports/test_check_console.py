"""The terminal scorecard of ``aios-contract check`` and the spec claim every renderer quotes."""

from __future__ import annotations

from rich.console import Console

from reports.check_reports import print_check, to_markdown
from reports.html import check_html
from reports.measured import spec_range


def test_spec_range_formats_the_claim_or_says_n_a(falcon_report):
    p = falcon_report.projection
    assert spec_range(None) == "n/a"
    assert spec_range(p.model_copy(update={"spec_projected_reduction": None})) == "n/a"
    assert spec_range(p.model_copy(update={"spec_projected_reduction": [0.45, 0.55]})) == "45%–55%"


def test_console_markdown_and_html_quote_the_same_claim(falcon_report):
    console = Console(record=True, width=400, highlight=False)
    print_check(falcon_report, console)
    text = console.export_text()
    claim = spec_range(falcon_report.projection)
    assert f"the contract claims {claim} for {falcon_report.tier_name}" in text
    assert f"Tier: {falcon_report.tier_name} · gate: {falcon_report.gate.reason}" in text
    assert all(f"{r.id} {r.title}" in text for r in falcon_report.requirements)
    assert f"{falcon_report.tier_name}: {claim})" in to_markdown(falcon_report)
    assert f"{claim} reduction" in check_html(falcon_report)


def test_a_claim_the_model_does_not_reach_is_said_so(falcon_report):
    """"AIOS Compatible … the contract claims 45–55 %" beside a 0 % projection read as a promise
    (issue 19.9): the line says the model's own projection does not reach the tier-wide claim."""
    p = falcon_report.projection.model_copy(update={"projected_reduction": 0.0,
                                                    "spec_projected_reduction": [0.45, 0.55]})
    console = Console(record=True, width=400, highlight=False)
    print_check(falcon_report.model_copy(update={"projection": p}), console)
    assert "does not reach" in console.export_text()


def test_check_json_prints_the_report(lm):
    import json

    from click.testing import CliRunner

    from contract.cli import main

    res = CliRunner().invoke(main, ["check", str(lm("falcon")), "--samples", "2", "--max-tokens", "8", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["model"]["architecture"] == "falcon"


def test_the_last_line_names_the_requirements_that_took_time(tmp_path):
    """`check` says where its time went: each requirement's wall time is in the report (JSON,
    JUnit) and the terminal's last line names those that took 0.1 s or more."""
    from contract.check import check_model
    from reports.check_reports import time_split

    report = check_model("tiny-falcon", samples=2, max_tokens=32)
    assert all(r.seconds >= 0 for r in report.requirements)
    r1 = next(r for r in report.requirements if r.id == "R1")
    assert r1.seconds > 0  # R1 runs the model
    assert sum(r.seconds for r in report.requirements) <= report.seconds
    assert "R2" not in time_split(report)  # R2 is arithmetic from the config
    # which requirements the line names depends only on their recorded seconds (not on how fast
    # this machine ran them): a slow R1 is named, the fast rest summed up
    slow = report.model_copy(deep=True)
    for r in slow.requirements:
        r.seconds = 1.234 if r.id == "R1" else 0.01
    assert time_split(slow) == "Time: R1 1.2 s; the others < 0.1 s each"
    for r in slow.requirements:
        r.seconds = 0.01
    assert time_split(slow) == "Time: every requirement < 0.1 s"
