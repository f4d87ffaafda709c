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


_VALGRIND_CPU: tuple[str, str] | None = None


def valgrind_cpu() -> tuple[str, str]:
    """The CPU name and LLVM feature string a program sees under valgrind (its CPUID emulation:
    no AVX-512 on this project's machines; "haswell" with AVX2 from valgrind 3.19 on an
    AVX-512 host). Probed once per process (valgrind --tool=none, a few seconds)."""
    global _VALGRIND_CPU
    if _VALGRIND_CPU is None:
        import sys

        probe = ("import llvmlite.binding as b; print(b.get_host_cpu_name()); "
                 "print(b.get_host_cpu_features().flatten())")
        out = subprocess.run(["valgrind", "--tool=none", "-q", sys.executable, "-c", probe],
                             capture_output=True, text=True, check=True).stdout.split()
        _VALGRIND_CPU = (out[-2], out[-1])
    return _VALGRIND_CPU


def cachegrind_env() -> dict:
    """The environment of every run of a cachegrind measurement, its native warm-up included.

    numba keys its on-disk cache by CPU name and features, and valgrind's emulated CPU is not
    the host's: without these variables the native warm-up fills entries valgrind never reads
    and the first run under valgrind compiles every kernel it calls (one Q8_0 int8 run here was
    still compiling after 24 minutes), so the two runs of the slope differ by a compilation, not
    only by decoded tokens (a Q8_0 --sparse-down file measured so: 0.009 MB/token dense against
    1.375 counted; 1.41 with the cache warm). With NUMBA_CPU_NAME/NUMBA_CPU_FEATURES set to valgrind's CPU,
    the warm-up compiles exactly the code valgrind runs (e.g. the int8 kernels' AVX2 pmaddubsw
    dot instead of the host's AVX-512 VNNI: same bytes read, other instructions)."""
    import os

    name, feats = valgrind_cpu()
    return dict(os.environ, PYTHONHASHSEED="0", OPENBLAS_NUM_THREADS="1", NUMBA_NUM_THREADS="1",
                NUMBA_CPU_NAME=name, NUMBA_CPU_FEATURES=feats)


def _cachegrind_cmd(cmd: list[str], out_file: Path, ll_bytes: int, ll_assoc: int, line: int) -> list[str]:
    return ["valgrind", "--tool=cachegrind", "--cache-sim=yes", f"--LL={ll_bytes},{ll_assoc},{line}",
            f"--cachegrind-out-file={out_file}", *cmd]


def _check_no_compile(proc: subprocess.CompletedProcess, what: str) -> None:
    # NUMBA_DEBUG_CACHE prints "[cache] index saved to ..." whenever a kernel is compiled
    if proc.returncode != 0:
        raise subprocess.CalledProcessError(proc.returncode, proc.args, proc.stdout, proc.stderr)
    if "index saved" in proc.stdout:
        raise RuntimeError(f"{what}: numba compiled a kernel under valgrind (its cache was not warm for "
                           "valgrind's CPU, e.g. a runtime/ source changed meanwhile); the LL misses of "
                           "the compilation would enter the slope. Run again.")


def cachegrind_run(cmd: list[str], out_file: Path, ll_bytes: int, ll_assoc: int = 16, line: int = 64) -> CachegrindSample:
    if not shutil.which("valgrind"):
        raise FileNotFoundError("valgrind is not installed (apt-get install valgrind)")
    proc = subprocess.run(_cachegrind_cmd(cmd, out_file, ll_bytes, ll_assoc, line), capture_output=True,
                          text=True, env=dict(cachegrind_env(), NUMBA_DEBUG_CACHE="1"))
    _check_no_compile(proc, " ".join(cmd))
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
                            prompt_tokens: int = 16, predictor: str | None = None,
                            arithmetic: str | None = None) -> dict:
    """Simulated DRAM traffic per decoded token: LL misses × line size, slope between n1 and n2.

    ``arithmetic`` (one of runtime.kernels.ARITHMETICS; None: the default; ``aios-run bench
    --arithmetic`` passes its own, so it reaches the traced runs) picks the block kernels' arithmetic.
    The two runs go side by side (each is one process)."""
    import sys

    if not shutil.which("valgrind"):
        raise FileNotFoundError("valgrind is not installed (apt-get install valgrind)")
    env = cachegrind_env()
    extra = [str(predictor)] if predictor else []
    from runtime.kernels import ARITHMETICS

    arithmetic = arithmetic or ARITHMETICS[0]
    arith = ["--arithmetic", arithmetic]
    tag = f"{mode}-{arithmetic}"
    # populate numba's on-disk cache natively for valgrind's CPU, so no run under valgrind compiles
    subprocess.run([sys.executable, "-m", "runtime.trace", *arith, model, mode, str(n1), str(prompt_tokens), *extra],
                   check=True, capture_output=True, env=env)
    procs, files = {}, {}
    for n in (n1, n2):
        cmd = [sys.executable, "-m", "runtime.trace", *arith, model, mode, str(n), str(prompt_tokens), *extra]
        files[n] = work / f"cg-{tag}-{n}.out"
        procs[n] = subprocess.Popen(_cachegrind_cmd(cmd, files[n], ll_bytes, 16, 64), stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, env=dict(env, NUMBA_DEBUG_CACHE="1"))
    samples = {}
    for n, p in procs.items():
        out, err = p.communicate()
        _check_no_compile(subprocess.CompletedProcess(p.args, p.returncode, out, err), f"{model} [{mode}] n={n}")
        samples[n] = parse_cachegrind_out(files[n].read_text(), 64)
    per_token = (samples[n2].dram_bytes - samples[n1].dram_bytes) / (n2 - n1)
    jit = (samples[n2].jit_dram_bytes - samples[n1].jit_dram_bytes) / (n2 - n1)
    return {"mb_per_token": per_token / 1e6, "kernel_mb_per_token": jit / 1e6,
            "ll_bytes": ll_bytes, "n1": n1, "n2": n2,
            "ll_misses": {n: s.ll_read_misses + s.ll_write_misses for n, s in samples.items()}}
