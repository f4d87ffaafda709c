"""``aios-run``: run converted artifacts and measure MB/token."""

from __future__ import annotations

import click

from aios.cli_common import EXIT_CODES_HELP, AiosGroup, version_option


@click.group(cls=AiosGroup, epilog=EXIT_CODES_HELP)
@version_option()
def main() -> None:
    """Run GGUF artifacts on the CPU and measure bytes read per token."""
