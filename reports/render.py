"""``aios-contract report FILE.json``: render any of the toolchain's JSON results again.

The kind is detected from the JSON (reports/load.py), so the HTML/Markdown reports of
``aios-contract check``, ``aios-run bench`` and ``aios-convert relufy`` all come from one
command, even where the producing command has no ``--format html`` of its own.
"""

from __future__ import annotations

from pathlib import Path

from aios.errors import UsageError
from aios.io import write_atomic
from reports import check_reports, compare, runs
from reports.load import InvalidReportError, load_report


def bench_markdown(result: dict) -> str:
    from runtime.bench import to_markdown  # the runtime's own Markdown; imported late (numba)

    return to_markdown(result)


RUN_RENDERERS = {
    "bench": {"html": runs.bench_html, "md": bench_markdown},
    "relufy": {"html": runs.relufy_html, "md": runs.relufy_markdown},
}
RUN_FILE_STEMS = {"bench": "aios-bench", "relufy": "aios-relufy"}
SUFFIX = {"html": ".html", "md": ".md"}


def formats_for(kind: str) -> tuple[str, ...]:
    if kind == "check":
        return check_reports.FORMATS
    if kind == "compare":
        return compare.FORMATS
    return tuple(RUN_RENDERERS[kind])


def render_file(path: str | Path, formats: list[str], out_dir: str | Path | None = None,
                bench: dict | None = None) -> tuple[str, list[Path]]:
    """Write ``formats`` of the JSON result at ``path`` into ``out_dir`` (default: beside it)."""
    kind, content = load_report(path)
    allowed = formats_for(kind)
    bad = [f for f in formats if f not in allowed]
    if bad:
        raise UsageError(f"A {kind} result renders to {', '.join(allowed)}, not {', '.join(bad)}.")
    if bench is not None and kind != "check":
        raise UsageError("--bench adds measured MB/token to a check report; this file is a " + kind + " result.")
    out = Path(out_dir) if out_dir else Path(path).parent
    if kind == "check":
        return kind, check_reports.write_reports(content, out, formats, bench=bench)
    if kind == "compare":
        try:
            comparison = compare.Comparison.model_validate(content)
        except ValueError as e:
            raise InvalidReportError(f"{path} is not a valid compare result: {str(e).splitlines()[0]}.") from None
        return kind, compare.write_comparison(comparison, out, formats)
    stem = RUN_FILE_STEMS[kind]
    return kind, [write_atomic(out / f"{stem}{SUFFIX[f]}", RUN_RENDERERS[kind][f](content)) for f in formats]
