"""``contract.checks.base``: the shared byte formatter and the default progress callback."""

from __future__ import annotations

import pytest

from contract.checks.base import CheckContext, fmt_bytes, no_progress


@pytest.mark.parametrize("n, grouped, plain", [
    (0, "0 B", "0 B"),
    (1000, "1,000 B", "1000 B"),  # the only place the two styles differ
    (1023, "1,023 B", "1023 B"),
    (1024, "1.00 KiB", "1.00 KiB"),
    (5 << 20, "5.00 MiB", "5.00 MiB"),
    (3 * (1 << 30) + (1 << 29), "3.50 GiB", "3.50 GiB"),
])
def test_fmt_bytes_units_and_grouping(n, grouped, plain):
    assert fmt_bytes(n) == grouped
    assert fmt_bytes(n, group_bytes=False) == plain


def test_fmt_bytes_scales_negative_differences_by_magnitude():
    assert fmt_bytes(-2048) == "-2.00 KiB"


def test_no_progress_is_the_context_default():
    assert CheckContext(calibration_texts=[]).progress is no_progress
    assert no_progress("task", 1, 2) is None
