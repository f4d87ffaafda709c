"""Benchmark: how fast a file's page-cache pages read, against fresh anonymous memory.

The runtime reads weights in place (mmap of the GGUF file), so its ceiling is the read speed of
the pages the kernel's page cache holds for that file, not that of a freshly allocated array.
On a VM the two differ, and by how much depends on where the pages sit physically (measured
here: 0.80-1.00). This script reads up to ``--gib`` GiB of FILE through a read-only mapping and
as many bytes of a fresh anonymous array, alternately for ``--rounds`` rounds, with the stream
probe's kernel (``runtime_vs_llamacpp.read_rows``: rows of 8 KiB read as integers, four at a time, each
prefetched ahead), and prints the medians, their ratio, and how much of the mapping is
PMD-mapped (2 MiB pages) according to /proc/self/smaps_rollup.

    python benchmarks/page_cache_read.py FILE [--gib 1] [--rounds 10] [--drop]

``--drop`` first writes back and drops the file's page cache (fdatasync + POSIX_FADV_DONTNEED)
so the pages are read back from storage as a fresh load would place them. Name the CPU
(``lscpu``) beside any figure.
"""

from __future__ import annotations

import argparse
import mmap
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

ROW = 2048 * 4  # bytes per probe row
GROUP = 4 * ROW  # the kernel reads whole groups of four rows


def drop_cache(path) -> None:
    """Write back and drop ``path``'s page cache (fdatasync + POSIX_FADV_DONTNEED): its pages
    are then read back from storage as a fresh load would place them."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def pmd_mapped_kib() -> int | None:
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
        if line.startswith("FilePmdMapped:"):
            return int(line.split()[1])
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file", type=Path)
    ap.add_argument("--gib", type=float, default=1.0, help="Bytes to read, in GiB (at most the file).")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--drop", action="store_true", help="Drop the file's page cache first.")
    args = ap.parse_args()
    if not args.file.is_file():
        raise SystemExit(f"No such file: {args.file}.")
    size = args.file.stat().st_size
    n = min(int(args.gib * 2**30), size) // GROUP * GROUP
    if n == 0:
        raise SystemExit(f"{args.file} is smaller than one {GROUP}-byte read group.")
    if args.rounds < 1:
        raise SystemExit("--rounds must be at least 1.")

    import numpy as np

    from runtime import kernels
    from runtime_vs_llamacpp import read_rows

    kernels.set_threads()
    if args.drop:
        drop_cache(args.file)
    fd = os.open(args.file, os.O_RDONLY)
    try:
        mapped = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
    finally:
        os.close(fd)
    pages = np.frombuffer(mapped, np.uint8, count=n).view(np.float32).reshape(-1, 2048)
    fresh = np.ones(n // 4, np.float32).reshape(-1, 2048)

    def gb_s(a) -> float:
        t = time.perf_counter()
        read_rows(a)
        return n / (time.perf_counter() - t) / 1e9

    t = time.perf_counter()
    gb_s(pages)  # first touch: faults the pages in (from storage after --drop)
    first = time.perf_counter() - t
    gb_s(fresh)
    file_rates, anon_rates = [], []
    for _ in range(args.rounds):
        file_rates.append(gb_s(pages))
        anon_rates.append(gb_s(fresh))
    f, a = statistics.median(file_rates), statistics.median(anon_rates)
    print(f"{args.file.name}: {n / 2**30:.2f} GiB, threads {kernels.set_threads()}, first read {first:.2f} s"
          f"{' after dropping its page cache' if args.drop else ''}")
    print(f"file pages {f:.1f} GB/s, anonymous array {a:.1f} GB/s (medians of {args.rounds} alternated "
          f"rounds): ratio {f / a:.3f}; file PMD-mapped {pmd_mapped_kib()} KiB")
    del pages
    mapped.close()


if __name__ == "__main__":
    main()
