"""Bounds-check a GGUF header before ``gguf.GGUFReader`` sees it.

gguf-py trusts every length in the file: an array declaring 2^62 one-byte items makes its
reader loop (and allocate a numpy view per item) forever once it runs past the end, and a
tensor whose dimensions or offset point past the end is only noticed, if at all, when its
data is reshaped. Neither gguf-py nor llama-cpp-python offers a validating pass we can call
on untrusted bytes without loading the model, so this module walks the header itself with
``struct`` over a read-only mmap — no allocation proportional to any declared size — and
rejects, with one sentence, a file where:

- a count, string length or array length does not fit in the bytes that remain;
- an array holds more than ``MAX_ARRAY_ITEMS`` items, nests deeper than ``MAX_ARRAY_DEPTH``,
  or the file declares more than ``MAX_KV`` keys or ``MAX_TENSORS`` tensors (real models
  stay far below: vocabularies are < 300k tokens, files < 100 keys, < 50k tensors);
- a value or tensor type id is unknown;
- a tensor has more than 4 dimensions (GGML_MAX_DIMS), an element count that overflows
  int64, a first dimension that is not a multiple of its quantization block, an offset that
  is not aligned, or data that ends past the end of the file.

The layout follows the GGUF specification (ggml/docs/gguf.md); type sizes come from gguf-py.
"""

from __future__ import annotations

import mmap
import os
import struct
from pathlib import Path

from aios.errors import InvalidModelError

MAX_ARRAY_ITEMS = 1 << 22
MAX_ARRAY_DEPTH = 2
MAX_KV = 1 << 16
MAX_TENSORS = 1 << 20
MAX_DIMS = 4
INT64_MAX = (1 << 63) - 1
# GGUF value type id -> fixed size in bytes (STRING = 8 and ARRAY = 9 are variable)
SCALAR_SIZE = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
STRING, ARRAY = 8, 9
ALIGNMENT_KEY = "general.alignment"


class _Bad(Exception):
    """Internal: the first problem found (turned into an InvalidModelError naming the file)."""


class _Walker:
    def __init__(self, buf, endian: str) -> None:
        self.buf, self.end, self.pos, self.e = buf, len(buf), 0, endian

    def take(self, fmt: str, what: str):
        size = struct.calcsize(fmt)
        if self.pos + size > self.end:
            raise _Bad(f"the header ends inside {what} at byte {self.pos}")
        (v,) = struct.unpack_from(self.e + fmt, self.buf, self.pos)
        self.pos += size
        return v

    def skip(self, n: int, what: str) -> None:
        if n > self.end - self.pos:
            raise _Bad(f"{what} declares {n:,} bytes at byte {self.pos} but only "
                       f"{self.end - self.pos:,} remain in the file")
        self.pos += n

    def string(self, what: str) -> bytes:
        n = self.take("Q", f"the length of {what}")
        start = self.pos
        self.skip(n, what)
        return bytes(self.buf[start:self.pos])

    def strings(self, n: int, what: str) -> None:
        """Skip n strings: ``value(STRING)`` n times, in one loop (a 262k-token vocabulary took
        0.7 s through the calls), with the same checks and messages."""
        unpack, buf, end, pos = struct.Struct(self.e + "Q").unpack_from, self.buf, self.end, self.pos
        for _ in range(n):
            if pos + 8 > end:
                self.pos = pos
                raise _Bad(f"the header ends inside the length of {what} at byte {pos}")
            (length,) = unpack(buf, pos)
            pos += 8
            if length > end - pos:
                raise _Bad(f"{what} declares {length:,} bytes at byte {pos} but only {end - pos:,} remain in the file")
            pos += length
        self.pos = pos

    def value(self, vtype: int, what: str, depth: int = 0) -> int | None:
        """Skip one value; returns it for UINT32 scalars (general.alignment), else None."""
        if vtype in SCALAR_SIZE:
            if vtype == 4:
                return self.take("I", what)
            self.skip(SCALAR_SIZE[vtype], what)
        elif vtype == STRING:
            self.skip(self.take("Q", f"the length of {what}"), what)
        elif vtype == ARRAY:
            if depth >= MAX_ARRAY_DEPTH:
                raise _Bad(f"{what} nests arrays deeper than {MAX_ARRAY_DEPTH} levels")
            itype = self.take("I", f"the item type of {what}")
            n = self.take("Q", f"the length of {what}")
            if n > MAX_ARRAY_ITEMS:
                raise _Bad(f"{what} declares {n:,} items (at most {MAX_ARRAY_ITEMS:,} are accepted)")
            if itype in SCALAR_SIZE:
                self.skip(n * SCALAR_SIZE[itype], what)
            elif itype in (STRING, ARRAY):
                if n * (8 if itype == STRING else 12) > self.end - self.pos:
                    raise _Bad(f"{what} declares {n:,} items, more than the file can hold")
                if itype == STRING:
                    self.strings(n, what)
                else:
                    for _ in range(n):
                        self.value(itype, what, depth + 1)
            else:
                raise _Bad(f"{what} has unknown item type {itype}")
        else:
            raise _Bad(f"{what} has unknown value type {vtype}")
        return None


_CHECKED: set = set()  # (resolved path, inode, size, mtime) of files this process found sound


def check_gguf_bounds(path: str | Path) -> None:
    """Raise :class:`InvalidModelError` unless every size in the GGUF header fits the file. A file
    found sound is not walked again while unchanged (a command's argument check and its loader
    both ask: the real Gemma 3's vocabulary walk is 0.2 s)."""
    path = Path(path)
    try:
        st = os.stat(path)
        stamp = (str(path.resolve()), st.st_ino, st.st_size, st.st_mtime_ns)
    except (OSError, RuntimeError):
        stamp = None
    if stamp is not None and stamp in _CHECKED:
        return
    try:
        with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            _walk(buf)
    except _Bad as e:
        raise InvalidModelError(f"{path} is a truncated or corrupt GGUF file ({e}); re-export it.") from None
    except ValueError as e:  # mmap of an empty file
        raise InvalidModelError(f"{path} is not a GGUF file ({e}).") from None
    if stamp is not None:
        _CHECKED.add(stamp)


def _walk(buf) -> None:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    if len(buf) < 24 or buf[:4] != b"GGUF":
        raise _Bad("it is too short or lacks the GGUF magic")
    (v_le,) = struct.unpack_from("<I", buf, 4)
    w = _Walker(buf, ">" if v_le & 0xFFFF == 0 else "<")  # gguf-py's byte-order rule
    w.pos = 4
    version = w.take("I", "the version")
    if version not in (2, 3):
        raise _Bad(f"GGUF version {version} is not supported (2 and 3 are)")
    n_tensors = w.take("Q", "the tensor count")
    n_kv = w.take("Q", "the key count")
    if n_kv > MAX_KV or n_kv * 13 > w.end - w.pos:  # a key-value takes at least 13 bytes
        raise _Bad(f"it declares {n_kv:,} metadata keys, more than the file can hold")
    if n_tensors > MAX_TENSORS or n_tensors * 32 > w.end - w.pos:  # a tensor info: >= 32 bytes
        raise _Bad(f"it declares {n_tensors:,} tensors, more than the file can hold")
    alignment = 32
    for i in range(n_kv):
        key = w.string(f"key #{i}")
        vtype = w.take("I", f"the type of key #{i}")
        name = f"the value of '{key.decode('utf-8', 'replace')[:80]}'"
        v = w.value(vtype, name)
        if key == ALIGNMENT_KEY.encode() and v is not None:
            if v == 0 or v & (v - 1):
                raise _Bad(f"general.alignment {v} is not a power of two")
            alignment = v
    infos = []
    for i in range(n_tensors):
        name = w.string(f"the name of tensor #{i}").decode("utf-8", "replace")[:80]
        n_dims = w.take("I", f"the dimension count of '{name}'")
        if n_dims > MAX_DIMS:
            raise _Bad(f"tensor '{name}' declares {n_dims} dimensions (at most {MAX_DIMS})")
        dims = [w.take("Q", f"the dimensions of '{name}'") for _ in range(n_dims)]
        ttype = w.take("I", f"the type of '{name}'")
        offset = w.take("Q", f"the offset of '{name}'")
        infos.append((name, dims, ttype, offset))
    data_start = -(-w.pos // alignment) * alignment
    for name, dims, ttype, offset in infos:
        try:
            block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(ttype)]
        except (ValueError, KeyError):
            raise _Bad(f"tensor '{name}' has unknown type id {ttype}") from None
        n = 1
        for d in dims:
            if d > INT64_MAX or (d and n > INT64_MAX // d):
                raise _Bad(f"tensor '{name}' has dimensions {dims} whose element count overflows int64")
            n *= d
        if dims and dims[0] % block:
            raise _Bad(f"tensor '{name}' has a first dimension {dims[0]} that is not a multiple "
                       f"of its block size {block}")
        nbytes = n // block * type_size
        if offset % alignment:
            raise _Bad(f"tensor '{name}' has offset {offset}, not a multiple of the alignment {alignment}")
        if data_start + offset + nbytes > len(buf):
            raise _Bad(f"tensor '{name}' declares {nbytes:,} bytes at offset {offset:,}, past the "
                       f"end of the {len(buf):,}-byte file")
