"""Benchmark: decode with and without MADV_HUGEPAGE advice on the runtime's weight mapping.

Advising MADV_HUGEPAGE on a file mapping before its pages are read makes the kernel read them
into 2 MiB page-cache folios, which the process then maps with one page-table entry each
(fewer TLB misses for a decode step, which streams every weight). The runtime does not advise
it: measured with this script it did not pay (docs/benchmarks.md, "2 MiB pages for the weight
mapping"). The effect shows only on pages read from storage after the advice, so this script
makes two byte-identical copies of FILE in a scratch folder, drops both from the page cache
(POSIX_FADV_DONTNEED), loads each cold in one process, one with the advice on its reader's
mapping before any weight is read, and then alternates single decode steps between the two
models (plain, plain, advised, advised, ...) so both see the same machine. It prints the share
of each model's mapped pages that are PMD-mapped (/proc/self/smaps FilePmdMapped / Rss), the
cold load time, and the paired ratio plain step time / advised step time.

    python benchmarks/huge_pages_ab.py FILE [--steps 100] [--scratch DIR]

Needs twice FILE's size free in the scratch folder (default: the system temp folder), which it
removes afterwards. Linux only. Name the CPU (``lscpu``) and kernel beside any figure.
"""

from __future__ import annotations

import argparse
import mmap
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from page_cache_read import drop_cache  # noqa: E402


def pmd_share(path: Path) -> float:
    """FilePmdMapped / Rss over this process's mappings of ``path``."""
    pmd = rss = 0
    cur = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if head and "-" in head[0] and all(c in "0123456789abcdef-" for c in head[0]):
                cur = line.rstrip().endswith(str(path))
            elif cur and line.startswith("FilePmdMapped:"):
                pmd += int(head[1])
            elif cur and line.startswith("Rss:"):
                rss += int(head[1])
    return pmd / rss if rss else 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file", type=Path)
    ap.add_argument("--steps", type=int, default=100, help="Decode steps, both models together.")
    ap.add_argument("--scratch", type=Path, default=None, help="Folder for the two copies.")
    args = ap.parse_args()
    if not args.file.is_file():
        raise SystemExit(f"No such file: {args.file}.")
    if args.steps < 4:
        raise SystemExit("--steps must be at least 4.")
    if not Path("/proc/self/smaps").exists():
        raise SystemExit("This benchmark reads /proc/self/smaps: Linux only.")

    import numpy as np

    from runtime.model import Model

    with tempfile.TemporaryDirectory(dir=args.scratch) as tmp:
        paths = {k: Path(tmp) / f"{k}.gguf" for k in ("plain", "advised")}
        for p in paths.values():
            shutil.copyfile(args.file, p)
            drop_cache(p)
        models, load_s = {}, {}
        for k, p in paths.items():
            t = time.perf_counter()
            models[k] = Model(p)  # reads the header and the per-layer vectors, no matrix
            if k == "advised":
                models[k].reader.data._mmap.madvise(mmap.MADV_HUGEPAGE)  # np.memmap's mmap.mmap
            models[k].forward(list(range(1, 9)))  # the cold read: the first prompt touches every weight
            load_s[k] = time.perf_counter() - t
        print("PMD-mapped share of the mapped pages: "
              + ", ".join(f"{k} {pmd_share(p):.3f}" for k, p in paths.items()))
        print("cold load + 8-token prompt: " + ", ".join(f"{k} {s:.2f} s" for k, s in load_s.items()))
        for m in models.values():
            m.forward([5])  # warm both
        times = {k: [] for k in models}
        tok = 1
        for i in range(args.steps):
            k = "plain" if (i // 2) % 2 == 0 else "advised"
            m = models[k]
            t = time.perf_counter()
            tok = int(np.argmax(m.forward([tok])[-1])) % 1000
            times[k].append(time.perf_counter() - t)
            if m.pos > 200:
                m.reset()
                m.forward(list(range(1, 9)))
        paired = [a / b for a, b in zip(times["plain"], times["advised"])]
        q1, med, q3 = np.percentile(paired, [25, 50, 75])
        print(f"{args.file.name}: median step plain {1e3 * np.median(times['plain']):.2f} ms, advised "
              f"{1e3 * np.median(times['advised']):.2f} ms; plain / advised per step pair: "
              f"median {med:.3f} (quartiles {q1:.3f}-{q3:.3f}, {len(paired)} pairs)")


if __name__ == "__main__":
    main()
