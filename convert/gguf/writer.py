"""Step 4 of the GGUF spine: the atomic writer.

Every GGUF this project writes goes through :func:`atomic_output`: the file is written to a
temp file beside the destination, fsynced, given normal permissions and renamed, so an
interrupted or failed conversion leaves nothing under the final name (docs/design.md,
"Atomic writes"). :func:`write_plan` writes an :class:`~convert.gguf.plan.ExportPlan` in
gguf-py's one explicit protocol: header, key/values (architecture keys, tokenizer, ``aios.*``),
tensor infos, then each tensor's data, encoded chunk by chunk as it is written.
:func:`rewrite_gguf` is the same protocol for a GGUF read back and rewritten (``layout``,
``sparsify``): the source's key/values, tensors copied byte for byte or re-encoded.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from aios.models import ModelHandle
from convert.gguf import tensors as gt
from convert.gguf.metadata import add_metadata, write_hparams
from convert.gguf.plan import ExportPlan

Progress = Callable[[int, int, str], None]


@dataclass(frozen=True)
class TensorOut:
    """One tensor of a GGUF being written: its header entry and a callable producing its data
    (an array, or a ``gt.EncodedTensor`` that encodes row chunks while it is written)."""

    name: str
    shape: tuple[int, ...]
    outtype: str
    nbytes: int
    data: Callable[[], object]


@contextlib.contextmanager
def atomic_output(out: Path) -> Iterator[Path]:
    """A temp path beside ``out``; renamed to ``out`` (after fsync) when the block succeeds,
    removed when it raises (including KeyboardInterrupt)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        finalize(Path(tmp), out)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def finalize(tmp: Path, out: Path) -> None:
    """fsync the finished temp file, give it normal permissions, rename it to ``out``."""
    with open(tmp, "rb+") as fh:
        os.fsync(fh.fileno())
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(tmp, 0o666 & ~mask)
    os.replace(tmp, out)


def write_gguf_file(out: Path, handle: ModelHandle, outtype: str, tok, metadata: dict[str, object],
                    tensors: list[TensorOut], progress: Progress | None = None,
                    file_type: int | None = None) -> None:
    """Hyperparameters, tokenizer, ``aios.*`` metadata and ``tensors`` written atomically."""
    import gguf

    with atomic_output(out) as tmp:
        w = gguf.GGUFWriter(str(tmp), gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH[handle.arch.gguf_arch]])
        write_hparams(w, handle, outtype, file_type)
        if tok is not None:
            tok.add_to(w)
        add_metadata(w, metadata)
        for t in tensors:
            w.add_tensor_info(t.name, t.shape, np.dtype(np.float32), t.nbytes, raw_dtype=gt.ggml_type(t.outtype))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        for k, t in enumerate(tensors):
            w.write_tensor_data(t.data())  # type: ignore[arg-type]
            if progress:
                progress(k + 1, len(tensors), t.name)
        w.close()


def write_plan(plan: ExportPlan, out: Path, progress: Progress | None = None) -> None:
    """Write ``plan`` to ``out`` atomically, tensors in the plan's order."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tensors = [TensorOut(p.name, p.shape, p.outtype, p.nbytes, gt.tensor_data(plan.handle, p))
               for p in plan.tensors]
    write_gguf_file(out, plan.handle, plan.outtype, plan.tokenizer, plan.metadata, tensors, progress,
                    plan.file_type)


# --- copying a GGUF (the converters that take a GGUF in and change only some of it) -----------

COPY_CHUNK = 16 << 20


@dataclass
class FileSlice:
    """Bytes of one tensor copied from a source file in chunks (the ``nbytes``/``tofile`` duck
    type gguf-py's ``write_tensor_data`` takes): a copied tensor is its source's bytes exactly."""

    path: Path
    offset: int
    nbytes: int

    def tofile(self, fout) -> None:
        from aios.errors import InvalidModelError

        with open(self.path, "rb") as src:
            src.seek(self.offset)
            left = self.nbytes
            while left:
                buf = src.read(min(COPY_CHUNK, left))
                if not buf:
                    raise InvalidModelError(f"{self.path} is truncated.")
                fout.write(buf)
                left -= len(buf)


def copy_fields(w, reader, skip: Callable[[str], bool] = lambda key: False) -> None:
    """Every key/value of ``reader`` (a gguf-py GGUFReader) into the writer ``w``, with its
    value type, except the header's own and the ones ``skip`` names."""
    import gguf

    from aios.errors import InvalidModelError

    for key, f in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or skip(key):
            continue
        if key == "general.alignment":
            w.add_custom_alignment(int(f.contents()))
            continue
        vtype = gguf.GGUFValueType(f.types[0])
        sub = gguf.GGUFValueType(f.types[1]) if vtype == gguf.GGUFValueType.ARRAY else None
        if sub == gguf.GGUFValueType.ARRAY:
            raise InvalidModelError(f"Key '{key}' holds nested arrays, which a GGUF rewrite does not copy.")
        w.add_key_value(key, f.contents(), vtype, sub_type=sub)


@dataclass(frozen=True)
class RawTensor:
    """One tensor of a rewritten GGUF: its header entry (numpy-order shape, gguf-py
    ``GGMLQuantizationType``) and its bytes (a :class:`FileSlice` or an encoded array)."""

    name: str
    shape: tuple[int, ...]
    raw_dtype: object
    data: object  # ``nbytes`` and ``tofile``, as gguf-py's ``write_tensor_data`` takes

    @classmethod
    def copied(cls, path: Path, t) -> RawTensor:
        """Tensor ``t`` of a gguf-py reader of ``path``, copied byte for byte."""
        return cls(t.name, tuple(int(d) for d in reversed(t.shape.tolist())), t.tensor_type,
                   FileSlice(path, int(t.data_offset), int(t.n_bytes)))


@dataclass(frozen=True)
class ReservedKey:
    """A last string key whose value depends on where the tensors land (``layout``'s manifest):
    ``width`` characters are reserved, then ``fill`` (the tensors' absolute data offsets, in
    order) gives the value, written space-padded into the reservation."""

    key: str
    width: int
    fill: Callable[[list[int]], str]


def rewrite_gguf(reader, out: Path, tensors: list[RawTensor], metadata: dict[str, object], *,
                 skip: Callable[[str], bool] = lambda key: False, reserved: ReservedKey | None = None,
                 check: Callable[[Path], None] | None = None) -> None:
    """A GGUF read by ``reader`` (gguf-py) rewritten atomically to ``out``: its key/values but
    the ones ``skip`` names, then ``metadata``, then ``reserved``; ``tensors`` in the given
    order. ``check`` runs on the finished temp file before it is renamed (raising keeps nothing).
    The converters that take a GGUF in and change only some of it (``layout``, ``sparsify``)."""
    import gguf

    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_output(out) as tmp:
        w = gguf.GGUFWriter(str(tmp), reader.fields["general.architecture"].contents())
        copy_fields(w, reader, skip=skip)
        add_metadata(w, metadata)
        if reserved is not None:
            w.add_string(reserved.key, " " * reserved.width)  # last key: its bytes end where tensor infos begin
        for t in tensors:
            w.add_tensor_info(t.name, t.shape, np.dtype(np.float32), int(t.data.nbytes),  # type: ignore[attr-defined]
                              raw_dtype=t.raw_dtype)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        kv_end = os.path.getsize(tmp)
        w.write_ti_data_to_file()
        if reserved is not None:
            offsets, pos = [], w.ggml_pad(os.path.getsize(tmp), w.data_alignment)
            for t in tensors:
                offsets.append(pos)
                pos += w.ggml_pad(int(t.data.nbytes), w.data_alignment)  # type: ignore[attr-defined]
            text = reserved.fill(offsets)
            assert len(text) <= reserved.width, (len(text), reserved.width)
            with open(tmp, "r+b") as fh:
                fh.seek(kv_end - reserved.width)
                fh.write(text.ljust(reserved.width).encode("ascii"))
        for t in tensors:
            w.write_tensor_data(t.data)  # type: ignore[arg-type]
        w.close()
        if check is not None:
            check(tmp)
