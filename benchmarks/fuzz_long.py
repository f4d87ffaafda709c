"""A long, randomized fuzz run of every parser fuzz test (the CI run is short and derandomized).

    python benchmarks/fuzz_long.py [--examples 2000]

Runs tests/aios/models/test_fuzz_inputs.py under the hypothesis profile "long" with a fresh
random seed and prints inputs tried, failures and wall time as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=2000)
    args = ap.parse_args()
    env = dict(os.environ, AIOS_FUZZ_PROFILE="long", AIOS_FUZZ_EXAMPLES=str(args.examples))
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "--hypothesis-show-statistics", "tests/aios/models/test_fuzz_inputs.py"],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    tried = sum(int(n) for n in re.findall(r"(\d+) passing(?: examples)?,", proc.stdout))
    failed = re.findall(r"FAILED (\S+)", proc.stdout)
    print(json.dumps({"examples_per_test": args.examples, "passing_examples_total": tried,
                      "failed_tests": failed, "exit_code": proc.returncode,
                      "seconds": round(time.perf_counter() - t0, 1)}, indent=2))
    if proc.returncode:
        print(proc.stdout[-4000:], file=sys.stderr)


if __name__ == "__main__":
    main()
