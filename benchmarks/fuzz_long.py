"""A long, randomized run of every parser fuzz test (the CI run is short and derandomized).

    python benchmarks/fuzz_long.py [--examples 2000] [--atheris-seconds 0]

Runs tests/aios/models/test_fuzz_inputs.py and tests/hostile/test_hostile_fuzz.py under the
hypothesis profile "long" (a fresh random seed, ``--examples`` per test) and prints, as JSON,
the inputs tried per fuzz test (hypothesis' own statistics), failures and wall time. With
``--atheris-seconds N`` it then runs the coverage-guided atheris harness on GGUF bytes
(benchmarks/fuzz_atheris_gguf.py) for N seconds, when atheris is installed.
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
FUZZ_FILES = ["tests/aios/models/test_fuzz_inputs.py", "tests/hostile/test_hostile_fuzz.py"]


def per_test_counts(stdout: str) -> dict[str, int]:
    """{test id: passing examples} from pytest's --hypothesis-show-statistics block."""
    counts: dict[str, int] = {}
    current = None
    for line in stdout.splitlines():
        m = re.match(r"^(\S+::\S+):\s*$", line.strip())
        if m:
            current = m.group(1)
            continue
        m = re.search(r"(\d+) passing(?: examples)?,", line)
        if m and current:
            counts[current] = counts.get(current, 0) + int(m.group(1))
    return counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=2000)
    ap.add_argument("--atheris-seconds", type=int, default=0)
    args = ap.parse_args()
    env = dict(os.environ, AIOS_FUZZ_PROFILE="long", AIOS_FUZZ_EXAMPLES=str(args.examples))
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "--hypothesis-show-statistics", "-k", "not clis", *FUZZ_FILES],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    counts = per_test_counts(proc.stdout)
    result = {"examples_per_test": args.examples, "passing_examples_per_test": counts,
              "passing_examples_total": sum(counts.values()),
              "failed_tests": re.findall(r"FAILED (\S+)", proc.stdout), "exit_code": proc.returncode,
              "seconds": round(time.perf_counter() - t0, 1)}
    if args.atheris_seconds:
        a = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "fuzz_atheris_gguf.py"),
                            f"-max_total_time={args.atheris_seconds}", "-rss_limit_mb=4096"],
                           cwd=ROOT, capture_output=True, text=True)
        runs = re.findall(r"#(\d+)\s+(?:DONE|pulse|NEW|REDUCE|INITED)", a.stderr)
        result["atheris"] = {"exit_code": a.returncode, "executions": int(runs[-1]) if runs else None,
                             "tail": a.stderr.strip().splitlines()[-3:]}
    print(json.dumps(result, indent=2))
    if proc.returncode:
        print(proc.stdout[-4000:], file=sys.stderr)


if __name__ == "__main__":
    main()
