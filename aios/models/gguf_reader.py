"""gguf-py's GGUF reader, parsing metadata in bulk and keeping long arrays lazy.

gguf-py's ``GGUFReader`` builds every metadata value as numpy views of the file: one view per
element of an array, two per string. The real Gemma 3 270M's 262,144-token vocabulary (tokens,
scores, types) became ~1.3 million views: 0.4-0.7 s and ~190 MB of every load, for values a
runtime command reads a handful of (or none). This reader keeps gguf-py's fields exactly (names,
offsets, types, ``parts`` and ``data`` indices, ``contents()``), but a long array's ``parts`` is
a :class:`LazyParts` sequence that makes each view when it is indexed, and its ``data`` a
``range``. Nothing is copied: values and tensors are still views of the mapped file.

Hand-written because gguf-py has no lazy mode; ``_build_fields`` mirrors gguf-py's loop (its
``parts += field_parts`` would materialise the lazy sequence).
"""

from __future__ import annotations

import os
import struct
import sys
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

import numpy as np

# arrays shorter than this go through gguf-py's own walk (element views cost nothing there)
BULK_MIN = 64


class LazyParts(Sequence):
    """gguf-py's ``ReaderField.parts`` of a long array: ``head`` (the key's and the array's
    header parts, as gguf-py builds them), then per element one view (scalars) or two (a string's
    u64 length and its bytes), made when indexed."""

    def __init__(self, head: list, plain: np.ndarray, offsets: np.ndarray, lengths: np.ndarray | None,
                 dtype: np.dtype) -> None:
        self.head, self.plain, self.offsets, self.lengths, self.dtype = head, plain, offsets, lengths, dtype
        self.per = 1 if lengths is None else 2

    def __len__(self) -> int:
        return len(self.head) + self.per * len(self.offsets)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self)
        i = int(i)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("parts index out of range")
        if i < len(self.head):
            return self.head[i]
        k, second = divmod(i - len(self.head), self.per)
        pos = int(self.offsets[k])
        if self.lengths is None:
            return self.plain[pos:pos + self.dtype.itemsize].view(self.dtype)
        if not second:
            return self.plain[pos:pos + 8].view(np.uint64)
        return self.plain[pos + 8:pos + 8 + int(self.lengths[k])]

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def strings(self) -> list[str]:
        """Every string of a string array, decoded as UTF-8 (one bytes copy of the region instead
        of two views per string; what a tokenizer reads)."""
        if self.lengths is None:
            raise TypeError("not a string array")
        if not len(self.offsets):
            return []
        start = int(self.offsets[0])
        blob = self.plain[start:int(self.offsets[-1]) + 8 + int(self.lengths[-1])].tobytes()
        return [blob[a + 8:a + 8 + n].decode("utf-8") for a, n in
                zip((self.offsets - start).tolist(), self.lengths.tolist())]

    def values(self) -> np.ndarray:
        """A scalar array's values (a view of the file)."""
        if self.lengths is not None:
            raise TypeError("a string array")
        start = int(self.offsets[0]) if len(self.offsets) else 0
        return self.plain[start:start + self.dtype.itemsize * len(self.offsets)].view(self.dtype)


_READER_CLASS = None


def reader_class():
    """gguf-py's ``GGUFReader`` with metadata parsed through a plain ndarray view of its memmap
    and long arrays kept lazy (:class:`LazyParts`).

    Slicing an ``np.memmap`` runs ``__array_finalize__`` for every field part: a 65k-token
    vocabulary took 3-4 s to open that way (llama.cpp: 0.1 s). Views of the same mapping as plain
    ndarrays are the same bytes without that cost.
    """
    global _READER_CLASS
    if _READER_CLASS is None:
        # the defining module's class: gguf.GGUFReader may be swapped (transformers_reads_gguf_fast)
        from gguf.gguf_reader import GGUFReader, ReaderField

        class Reader(GGUFReader):
            def _get(self, offset, dtype, count=1, override_order=None):
                plain = self.__dict__.get("_plain")
                if plain is None or plain.base is not self.data:
                    plain = self._plain = self.data.view(np.ndarray)
                count = int(count)
                arr = plain[offset:offset + np.dtype(dtype).itemsize * count].view(dtype=dtype)[:count]
                order = self.byte_order if override_order is None else override_order
                return arr.view(arr.dtype.newbyteorder(order))

            def _build_fields(self, offs: int, count: int) -> int:
                for _ in range(count):  # gguf-py's loop, a lazy array's parts kept lazy
                    orig_offs = offs
                    kv_klen, kv_kdata = self._get_str(offs)
                    offs += int(kv_klen.nbytes + kv_kdata.nbytes)
                    raw_kv_type = self._get(offs, np.uint32)
                    offs += int(raw_kv_type.nbytes)
                    head = [kv_klen, kv_kdata, raw_kv_type]
                    name = str(bytes(kv_kdata), encoding="utf-8")
                    bulk = _lazy_array(self, offs, raw_kv_type[0], head)
                    if bulk is not None:
                        size, parts, types = bulk
                        data = range(len(head) + 2 + parts.per - 1, len(parts), parts.per)
                        self._push_field(ReaderField(orig_offs, name, parts, data, types), skip_sum=True)
                    else:
                        size, field_parts, idxs, types = self._get_field_parts(offs, raw_kv_type[0])
                        self._push_field(ReaderField(orig_offs, name, head + field_parts,
                                                     [i + len(head) for i in idxs], types), skip_sum=True)
                    offs += size
                return offs

        _READER_CLASS = Reader
    return _READER_CLASS


def _lazy_array(r, orig: int, raw_type: int, head: list):
    """(size, LazyParts, types) of a long ARRAY of scalars or strings at ``orig``; None (gguf-py's
    own walk) for anything else, a file whose byte order is not this machine's, or an element that
    would run past the end of the file (where gguf-py's walk says what is wrong)."""
    from gguf import GGUFValueType

    if raw_type != GGUFValueType.ARRAY or r.byte_order != "I" or sys.byteorder != "little":
        return None
    plain = r.data.view(np.ndarray)
    end = plain.shape[0]
    if orig + 12 > end:
        return None
    raw_itype, alen = r._get(orig, np.uint32), r._get(orig + 4, np.uint64)
    n, offs = int(alen[0]), orig + 12
    try:
        etype = GGUFValueType(int(raw_itype[0]))
    except ValueError:
        return None
    if n < BULK_MIN:
        return None
    head = head + [raw_itype, alen]
    types = [GGUFValueType.ARRAY, etype]
    nptype = r.gguf_scalar_to_np.get(etype)
    if nptype is not None:
        dt = np.dtype(nptype)
        if offs + dt.itemsize * n > end:
            return None
        offsets = np.arange(offs, offs + dt.itemsize * n, dt.itemsize, dtype=np.int64)
        return dt.itemsize * n + 12, LazyParts(head, plain, offsets, None, dt), types
    if etype != GGUFValueType.STRING:
        return None
    unpack = struct.Struct("<Q").unpack_from
    starts, sizes = [], []
    pos = offs
    for _ in range(n):  # each string's offset depends on every length before it: one walk
        if pos + 8 > end:
            return None
        (slen,) = unpack(plain, pos)
        if pos + 8 + slen > end:
            return None
        starts.append(pos)
        sizes.append(slen)
        pos += 8 + slen
    return (pos - orig, LazyParts(head, plain, np.array(starts, np.int64), np.array(sizes, np.int64),
                                  np.dtype(np.uint8)), types)


def string_array(field) -> list[str]:
    """A string-array field's strings: in bulk from a lazy field, else through gguf-py."""
    parts = field.parts
    if isinstance(parts, LazyParts) and parts.lengths is not None:
        return parts.strings()
    return [str(bytes(field.parts[i]), encoding="utf-8") for i in field.data]


def scalar_array(field) -> np.ndarray:
    """A scalar-array field's values as one numpy array."""
    parts = field.parts
    if isinstance(parts, LazyParts) and parts.lengths is None:
        return parts.values()
    return np.array([field.parts[i][0] for i in field.data])


@lru_cache(maxsize=2)
def _cached_reader(path: str, stamp: tuple[int, int, int]):
    return reader_class()(path, "r")


def gguf_reader(path: str | Path):
    """The parsed GGUF at ``path``, shared by everything in this process that opens the same
    unchanged file (a check opens it for facts, the tokenizer and the runtime: one parse, not
    four). Keyed by inode, size and mtime, so a rewritten file is parsed again."""
    st = os.stat(path)
    return _cached_reader(str(Path(path).resolve()), (st.st_ino, st.st_size, st.st_mtime_ns))
