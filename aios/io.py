"""File I/O every package shares: atomic writes, file digests and the cache folder (bottom
layer: ``aios`` only).

Atomic writes: temp file in the destination folder, fsync, rename.

Temp names come from ``mkstemp`` (unique per writer), so two processes writing the same
output at once never share a temp file: each renames its own complete file into place and
the last rename wins. A full disk (or quota, or file-size limit) becomes one
:class:`DiskFullError` sentence; the temp file is removed and the final name is untouched.
"""

from __future__ import annotations

import errno
import hashlib
import mmap
import os
import re
import tempfile
from pathlib import Path
from typing import Protocol, TypeVar

from aios.errors import AiosError, ExitCode

DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
HASH_CHUNK = 1 << 20  # bytes read per step while hashing; the digest does not depend on it


class _Hasher(Protocol):
    def update(self, data: bytes, /) -> None: ...


H = TypeVar("H", bound=_Hasher)


class DiskFullError(AiosError):
    """No room to write an output (exit 3: the result could not be produced)."""

    exit_code = ExitCode.NOT_EVALUATED


def is_disk_full(e: BaseException) -> bool:
    """ENOSPC/EDQUOT/EFBIG, or numpy's ``tofile`` short write ("N requested and M written"),
    which is how a full disk surfaces through numpy (and so gguf-py): an OSError without errno."""
    if not isinstance(e, OSError):
        return False
    short_write = e.errno is None and re.search(r"\d+ requested and \d+ written", str(e)) is not None
    return e.errno in DISK_FULL_ERRNOS or short_write


def disk_full_message(where: str | os.PathLike | None, e: OSError) -> str:
    what = {errno.EDQUOT: "the disk quota is exhausted", errno.EFBIG: "the file size limit was reached"}.get(
        e.errno, "no space is left on the device")
    place = f" while writing {where}" if where else ""
    return (f"Could not finish{place}: {what}; nothing was written under the final name. "
            "Free space (or choose another output folder) and rerun.")


def write_atomic(path: str | Path, data: str | bytes) -> Path:
    """Write ``data`` to ``path`` so readers see the old file or the whole new one, never a part."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data.encode("utf-8") if isinstance(data, str) else data)
            fh.flush()
            os.fsync(fh.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; give the usual file mode
        os.replace(tmp, path)
    except BaseException as e:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if is_disk_full(e):
            raise DiskFullError(disk_full_message(path, e)) from None
        raise
    return path


def hash_file(h: H, path: str | Path) -> H:
    """Feed the bytes of ``path`` into ``h`` chunk by chunk (never the whole file); returns ``h``.

    For digests over several files (with their names in between); one file: :func:`sha256_file`.
    """
    with open(path, "rb") as fh:
        while chunk := fh.read(HASH_CHUNK):
            h.update(chunk)
    return h


def sha256_file(path: str | Path) -> str:
    """Hex SHA-256 of the file at ``path`` — the one file digest the toolchain's provenance uses."""
    return hash_file(hashlib.sha256(), path).hexdigest()


def cache_root() -> Path:
    """The toolchain's cache folder outside the repository: ``$AIOS_CACHE``, by default
    ``~/.cache/aios`` (fetched models, numba's compiled kernels)."""
    root = os.environ.get("AIOS_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "aios"


def sparse_zeros(shape: tuple[int, ...], dtype="float32"):
    """A zeroed array whose pages take memory only where written, one 4 KiB page at a time.

    np.zeros alone is lazy too (calloc), but NumPy advises MADV_HUGEPAGE on every allocation of
    4 MiB and more, so where transparent huge pages are on ``madvise`` (the common default) the
    first write into each 2 MiB stretch makes 2 MiB resident. A KV cache sized for the model's
    whole context is one such stretch per layer, head, K and V: 72 MiB of the real Gemma 3
    270M's after one token (18 layers), 1 GiB of a Llama-3.1-8B's. This maps anonymous memory
    itself (zeroed by the kernel) and advises MADV_NOHUGEPAGE where the OS has it."""
    import numpy as np  # here: the other helpers of this module run without NumPy

    dt = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    if n == 0:
        return np.zeros(shape, dt)
    buf = mmap.mmap(-1, n)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        buf.madvise(mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(buf, dt).reshape(shape)  # the array keeps the mapping alive
