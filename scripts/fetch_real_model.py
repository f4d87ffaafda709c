#!/usr/bin/env python3
"""Fetch (or find cached) a real released model and print its path.

    python scripts/fetch_real_model.py [gemma3-270m-q4_k_m | qwen2.5-coder-1.5b-q4_k_m]

The file lands in $AIOS_CACHE/models (default ~/.cache/aios/models); see aios/models/real.py.
"""

from __future__ import annotations

import sys

from aios.errors import AiosError
from aios.models import real


def main(argv: list[str]) -> int:
    name = argv[0] if argv else "gemma3-270m-q4_k_m"
    if name not in real.REAL_MODELS:
        print(f"error: unknown model '{name}'; known: {', '.join(real.REAL_MODELS)}", file=sys.stderr)
        return 2
    try:
        print(real.fetch(real.REAL_MODELS[name]))
    except AiosError as e:
        print(f"error: {e.message}", file=sys.stderr)
        return int(e.exit_code)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
