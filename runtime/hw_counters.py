"""Hardware DRAM-traffic paths: perf uncore IMC counters and cachegrind's simulated LL misses.

Both take the *slope* between two generation lengths, so model load and prefill cancel:
    MB/token = (bytes(n2) − bytes(n1)) / (n2 − n1)
For perf, idle traffic (measured over a ``sleep`` of the same duration) is subtracted and
every IMC box is summed: counting one box of a two-channel machine halves the figure,
the pitfall behind the only published AIOS number (docs/design.md, "Reference numbers").
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

_UNITS = {"B": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3, "KB": 1e3, "MB": 1e6, "GB": 1e9}
IMC_EVENT = re.compile(r"uncore_imc(_free_running)?_\d+/(data_read|data_write|cas_count_read|cas_count_write)/")


@dataclass(frozen=True)
class ImcSample:
    read_bytes: float
    write_bytes: float
    seconds: float
    boxes: int


def parse_perf_stat(text: str) -> ImcSample:
    """Sum every IMC box in ``perf stat`` output (CSV ``-x,`` or the default table).

    ``cas_count_*`` events count 64-byte lines; the ``data_*`` free-running counters are
    printed already scaled (MiB). Elapsed seconds come from the ``seconds time elapsed`` line.
    """
    read = write = 0.0
    boxes: set[str] = set()
    seconds = 0.0
    for line in text.splitlines():
        line = line.strip()
        m = re.search(r"([\d.,]+)\s+seconds time elapsed", line)
        if m:
            seconds = float(m.group(1).replace(",", ""))
            continue
        ev = IMC_EVENT.search(line)
        if not ev:
            continue
        if "," in line and line.count(",") >= 2 and not re.match(r"^\s*[\d,]+\.\d+\s", line):
            parts = line.split(",")  # -x, : value,unit,event,...
            value_s, unit = parts[0], parts[1].strip()
        else:
            m = re.match(r"^\s*([\d,.]+)\s+(\S+)?\s*uncore", line)
            if not m:
                continue
            value_s, unit = m.group(1), (m.group(2) or "").strip()
        if value_s.strip() in ("<not counted>", "<not supported>", ""):
            continue
        value = float(value_s.replace(",", ""))
        if ev.group(2).startswith("cas_count"):
            nbytes = value * 64 if unit in ("", "cas_count_read", "cas_count_write") else value * _UNITS.get(unit, 1)
        else:
            nbytes = value * _UNITS.get(unit, 1)
        boxes.add(ev.group(0).split("/")[0])
        if "read" in ev.group(2):
            read += nbytes
        else:
            write += nbytes
    return ImcSample(read, write, seconds, len(boxes))


def slope_mb_per_token(n1: int, s1: ImcSample, n2: int, s2: ImcSample, idle: ImcSample | None) -> float:
    """DRAM read MB per generated token from two runs and an idle sample."""
    if n2 == n1:
        raise ValueError("the two generation lengths must differ")

    def net(s: ImcSample) -> float:
        if idle is None or idle.seconds == 0:
            return s.read_bytes
        return s.read_bytes - idle.read_bytes / idle.seconds * s.seconds

    return (net(s2) - net(s1)) / (n2 - n1) / 1e6


def imc_events() -> list[str]:
    """IMC read/write events this machine's perf knows (empty when perf or counters are absent)."""
    if not shutil.which("perf"):
        return []
    try:
        out = subprocess.run(["perf", "list", "--no-desc"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return sorted({m.group(0) for m in IMC_EVENT.finditer(out)})


def perf_run(cmd: list[str], events: list[str]) -> ImcSample:
    proc = subprocess.run(["perf", "stat", "-a", "-x,", "-e", ",".join(events), "--", *cmd],
                          capture_output=True, text=True)
    return parse_perf_stat(proc.stderr)


# --- cachegrind -------------------------------------------------------------------------


@dataclass(frozen=True)
class CachegrindSample:
    ll_read_misses: int
    ll_write_misses: int
    line_bytes: int
    # LL data misses in code without symbols (``fl=??? fn=???``): numba's JIT-compiled
    # kernels, i.e. the weight reads; the rest is the interpreter, libc and numpy
    jit_misses: int = 0

    @property
    def dram_bytes(self) -> int:
        return (self.ll_read_misses + self.ll_write_misses) * self.line_bytes

    @property
    def jit_dram_bytes(self) -> int:
        return self.jit_misses * self.line_bytes


def parse_cachegrind_out(text: str, line_bytes: int = 64) -> CachegrindSample:
    """LL data misses from a ``cachegrind.out`` file: the ``summary:`` totals, and the misses
    of cost lines under ``fl=???``/``fn=???`` (code valgrind has no symbols for — JIT code)."""
    events = summary = None
    cols: list[int] = []
    jit = 0
    fl = fn = ""
    for line in text.splitlines():
        if line.startswith("events:"):
            events = line.split()[1:]
            cols = [events.index(e) for e in ("DLmr", "DLmw") if e in events]
        elif line.startswith("summary:"):
            summary = [int(x) for x in line.split()[1:]]
        elif line.startswith("fl="):
            fl = re.sub(r"^\(\d+\)\s*", "", line[3:].strip())
        elif line.startswith("fn="):
            fn = re.sub(r"^\(\d+\)\s*", "", line[3:].strip())
        elif cols and fl == "???" and fn == "???" and line[:1].isdigit():
            vals = line.split()[1:]  # first field is the line number
            jit += sum(int(vals[c]) for c in cols if c < len(vals))
    if not events or not summary:
        raise ValueError("not a cachegrind output file (no events/summary lines)")
    vals = dict(zip(events, summary))
    if "DLmr" not in vals:
        raise ValueError("cachegrind ran without --cache-sim=yes (no DLmr/DLmw events)")
    return CachegrindSample(vals["DLmr"], vals.get("DLmw", 0), line_bytes, jit)


def cachegrind_run(cmd: list[str], out_file: Path, ll_bytes: int, ll_assoc: int = 16, line: int = 64) -> CachegrindSample:
    if not shutil.which("valgrind"):
        raise FileNotFoundError("valgrind is not installed (apt-get install valgrind)")
    import os

    env = dict(os.environ, PYTHONHASHSEED="0", OPENBLAS_NUM_THREADS="1", NUMBA_NUM_THREADS="1")
    subprocess.run(
        ["valgrind", "--tool=cachegrind", "--cache-sim=yes", f"--LL={ll_bytes},{ll_assoc},{line}",
         f"--cachegrind-out-file={out_file}", *cmd],
        capture_output=True, text=True, check=True, env=env,
    )
    return parse_cachegrind_out(out_file.read_text(), line)


def default_ll_bytes() -> int:
    """This machine's last-level cache size (sysfs), else 32 MiB."""
    for idx in (3, 2):
        f = Path(f"/sys/devices/system/cpu/cpu0/cache/index{idx}/size")
        try:
            v = f.read_text().strip()
        except OSError:
            continue
        m = re.match(r"(\d+)([KMG]?)", v)
        if m:
            return int(m.group(1)) * {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}[m.group(2)]
    return 32 << 20


def cachegrind_mb_per_token(model: str, mode: str, n1: int, n2: int, ll_bytes: int, work: Path,
                            prompt_tokens: int = 16, predictor: str | None = None) -> dict:
    """Simulated DRAM traffic per decoded token: LL misses × line size, slope between n1 and n2."""
    import sys

    extra = [str(predictor)] if predictor else []
    # populate numba's on-disk cache natively first, so no run under valgrind compiles kernels
    subprocess.run([sys.executable, "-m", "runtime.trace", model, mode, "1", "2", *extra], check=True,
                   capture_output=True)
    samples = {}
    for n in (n1, n2):
        cmd = [sys.executable, "-m", "runtime.trace", model, mode, str(n), str(prompt_tokens), *extra]
        samples[n] = cachegrind_run(cmd, work / f"cg-{mode}-{n}.out", ll_bytes)
    per_token = (samples[n2].dram_bytes - samples[n1].dram_bytes) / (n2 - n1)
    jit = (samples[n2].jit_dram_bytes - samples[n1].jit_dram_bytes) / (n2 - n1)
    return {"mb_per_token": per_token / 1e6, "kernel_mb_per_token": jit / 1e6,
            "ll_bytes": ll_bytes, "n1": n1, "n2": n2,
            "ll_misses": {n: s.ll_read_misses + s.ll_write_misses for n, s in samples.items()}}
