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
    assert f"the contract claims {claim} for this tier" in text
    assert f"Tier: {falcon_report.tier_name} · gate: {falcon_report.gate.reason}" in text
    assert all(f"{r.id} {r.title}" in text for r in falcon_report.requirements)
    assert f"{falcon_report.tier_name}: {claim})" in to_markdown(falcon_report)
    assert f"{claim} reduction" in check_html(falcon_report)
