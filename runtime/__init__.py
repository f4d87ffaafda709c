"""numpy/numba engine for converted artifacts, with byte accounting (MB/token).

Importing it points numba's on-disk cache (every ``cache=True`` function) at a folder named by a
hash of this package's sources and one of the machine (CPU features, numba/llvmlite/Python
versions), ``$AIOS_CACHE/numba/<hash>-<machine>`` (``numba_cache_dir``; AIOS_CACHE defaults to
``~/.cache/aios``). numba checks only the source of the file that defines a compiled
function, while a kernel inlines intrinsics from other files of runtime/kernels and
runtime.ops / runtime.decode_block compile calls into the kernels: under one folder for all
sources, an edit to one file could leave another file's cached kernel running the old code.
Keyed by the sources of the files that hold compiled code, an edit to any of them starts a
fresh folder (everything compiles again once; an edit to model.py or a CLI does not), and the
same sources, reinstalled too, find theirs again.

A NUMBA_CACHE_DIR the user set is left as it is (then clear it after editing a kernel). The one
chosen here is exported with AIOS_NUMBA_CACHE_DIR beside it, so a child process that imports
``runtime`` chooses again for its own sources. Folders of other sources are removed once they
are neither among the KEEP most recently used nor used for KEEP_DAYS (a process still running
on a removed folder loses nothing it needs: numba reads a missing file as a cache miss and
creates the folder again when it saves). Where no folder can be made (a read-only home),
numba's default, ``__pycache__`` beside each file, stays.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import time
from pathlib import Path

from aios.io import cache_root

CHOSEN_ENV = "AIOS_NUMBA_CACHE_DIR"  # the NUMBA_CACHE_DIR chosen here (not the user's)
KEEP = 8  # the most recently used cache folders, always kept
KEEP_DAYS = 7  # the others are kept while used within this many days


# a file holding any of these compiles code numba caches (or code a cached kernel inlines)
COMPILED_MARKERS = (b"njit", b"intrinsic", b"numba.extending", b"cfunc", b"vectorize")


def sources_key(root: Path | None = None) -> str:
    """16 hex digits of a SHA-256 over the .py files under ``root`` (this package) that hold
    compiled code (COMPILED_MARKERS): each file's relative path, size and bytes, in sorted order
    (``__pycache__`` and dot files skipped). An edit to model.py or a CLI keeps the kernels'
    cache; an edit to any kernel, op or block starts a fresh one."""
    root = Path(__file__).resolve().parent if root is None else root
    h = hashlib.sha256()
    for folder, subfolders, names in os.walk(root):
        subfolders[:] = sorted(d for d in subfolders if d != "__pycache__" and not d.startswith("."))
        for name in sorted(n for n in names if n.endswith(".py") and not n.startswith(".")):
            path = Path(folder, name)
            data = path.read_bytes()
            if not any(m in data for m in COMPILED_MARKERS):
                continue
            h.update(f"{path.relative_to(root).as_posix()}\0{len(data)}\0".encode())
            h.update(data)
    return h.hexdigest()[:16]


def cpu_description() -> str:
    """The CPU the kernels compile for: its model name and feature flags (/proc/cpuinfo's first
    processor; the platform's machine and processor names elsewhere)."""
    import platform

    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        text = ""
    first = text.split("\n\n", 1)[0]
    keep = [ln for ln in first.splitlines() if ln.split(":", 1)[0].strip() in ("vendor_id", "model name", "flags")]
    return "\n".join([platform.machine(), platform.processor(), *keep])


def machine_key() -> str:
    """8 hex digits over what else a compiled kernel depends on: the CPU (its features pick the
    kernels' instructions: AMX, VNNI, AVX-512, AVX2), the numba and llvmlite versions and the
    Python version. numba's own index checks some of these; keyed here too, a cache written on
    another CPU or by another version is never the folder this process opens."""
    from importlib.metadata import PackageNotFoundError, version

    def ver(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "-"

    h = hashlib.sha256("\0".join([cpu_description(), ver("numba"), ver("llvmlite"),
                                  "%d.%d" % sys.version_info[:2]]).encode())
    return h.hexdigest()[:8]


def numba_cache_dir() -> Path:
    """Where numba caches the kernels of these sources on this machine:
    ``$AIOS_CACHE/numba/<sources_key>-<machine_key>``."""
    return cache_root() / "numba" / f"{sources_key()}-{machine_key()}"


def compile_notice(kinds) -> str | None:
    """The line to show before a model's first pass when numba's cache for these sources is empty
    (a fresh install or an edited kernel: every kernel compiles, tens of seconds on 2 cores), None
    when kernels are cached. ``kinds``: the model's stored types (gguf-py names)."""
    folder = numba_cache_dir()
    try:
        cached = folder.is_dir() and any(folder.rglob("*.nbi"))  # numba's index files
    except OSError:
        cached = False
    if cached:
        return None
    names = "/".join(sorted({str(k).upper() for k in kinds}))
    return (f"compiling kernels{' for ' + names if names else ''} (first run of these sources on this machine; "
            f"cached in {folder}, so later runs start in seconds)")


def _is_key(name: str) -> bool:
    """A cache folder's name: ``<sources_key>-<machine_key>`` (or an older ``<sources_key>``)."""
    hexa = lambda t: all(c in "0123456789abcdef" for c in t)  # noqa: E731
    src, _, mach = name.partition("-")
    return len(src) == 16 and hexa(src) and (not _ or (len(mach) == 8 and hexa(mach)))


def prune(folder: Path, keep: Path) -> None:
    """Remove the cache folders in ``folder`` other than ``keep`` past the KEEP most recently
    used (a folder's modification time: ``_use_numba_cache`` touches it) unused for KEEP_DAYS."""
    used = []
    for p in folder.iterdir():
        if p != keep and _is_key(p.name) and p.is_dir():
            used.append((p.stat().st_mtime, p))
    used.sort(reverse=True)
    cutoff = time.time() - KEEP_DAYS * 86400
    for mtime, p in used[KEEP - 1:]:
        if mtime < cutoff:
            shutil.rmtree(p, ignore_errors=True)


def _use_numba_cache() -> None:
    chosen, user = os.environ.get(CHOSEN_ENV), os.environ.get("NUMBA_CACHE_DIR")
    if user and user != chosen:
        return  # the user's folder
    config = sys.modules.get("numba.core.config")  # numba imported already: its config read the environment
    try:
        path = numba_cache_dir()
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        if user:  # a parent's choice, for other sources maybe: numba's default instead
            os.environ.pop("NUMBA_CACHE_DIR")
            os.environ.pop(CHOSEN_ENV, None)
            if config is not None:
                config.CACHE_DIR = ""
        return
    os.environ["NUMBA_CACHE_DIR"] = os.environ[CHOSEN_ENV] = str(path)
    if config is not None:
        config.CACHE_DIR = str(path)
    try:
        os.utime(path)  # its last use, for prune
        prune(path.parent, path)
    except OSError:
        pass  # another process pruning at the same time, say: the next import tries again


_use_numba_cache()
