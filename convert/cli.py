"""``aios-convert``: turn models into contract-satisfying artifacts."""

from __future__ import annotations

import click

from aios.cli_common import EXIT_CODES_HELP, AiosGroup, version_option


@click.group(cls=AiosGroup, epilog=EXIT_CODES_HELP)
@version_option()
def main() -> None:
    """Convert models: relufy, sparsity maps, aliasing, low-rank + residual, GGUF export."""
