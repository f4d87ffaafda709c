"""Lazy tensor access: inventories from headers, one tensor at a time on demand.

Nothing here loads a whole model. Safetensors are opened with ``safe_open`` (mmap);
GGUF files with ``gguf.GGUFReader`` (mmap). Every library error on a bad file becomes
one :class:`InvalidModelError` sentence naming the file.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Iterator

import numpy as np

from aios.errors import InvalidModelError
from aios.models.gguf_reader import gguf_reader  # (re-exported: callers open GGUFs through here)

# bytes per element of safetensors dtype codes
SAFETENSORS_ITEMSIZE = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
    "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1,
}  # fmt: skip


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # logical shape in the file's own convention
    dtype: str  # "F32", "BF16", "Q4_0", ...
    nbytes: int  # bytes stored in the file
    file: str  # file name holding it (shard or GGUF)

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1


class SafetensorsStore:
    """Tensors of an HF folder: ``model.safetensors`` or a sharded index."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        index = folder / "model.safetensors.index.json"
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
                if not isinstance(weight_map, dict):
                    raise TypeError("weight_map is not an object")
            except (ValueError, KeyError, TypeError, UnicodeDecodeError, RecursionError) as e:
                raise InvalidModelError(
                    f"{index} is not a valid safetensors index ({e}); re-download or rewrite it."
                ) from e
            bad = [v for v in weight_map.values() if not _plain_shard_name(v)]
            if bad:
                raise InvalidModelError(
                    f"{index} names an invalid shard {bad[0]!r}; shards must be .safetensors "
                    "files in the model folder."
                )
            self._shards = sorted(set(weight_map.values()))
            for shard in self._shards:
                if not (folder / shard).is_file():
                    raise InvalidModelError(
                        f"Shard '{shard}' listed in {index.name} is missing from {folder}; "
                        "the download is incomplete."
                    )
        else:
            self._shards = sorted(p.name for p in folder.glob("*.safetensors"))
        if not self._shards:
            raise InvalidModelError(f"{folder} has no .safetensors weights.")

    def _open(self, shard: str):
        from safetensors import safe_open

        path = self.folder / shard
        try:
            return safe_open(str(path), framework="pt")
        except Exception as e:  # SafetensorError has no stable import path
            raise InvalidModelError(
                f"{path} is not a readable safetensors file ({_short(e)}); it may be truncated "
                "or corrupt: re-download or re-export it."
            ) from e

    def shard_metadata(self) -> list[dict[str, str]]:
        """Each shard's ``__metadata__`` (``{}`` when absent), in shard order.

        Formats that keep records in the header (the alias groups) read them here.
        """
        out = []
        for shard in self._shards:
            with self._open(shard) as f:
                out.append(f.metadata() or {})
        return out

    @cached_property
    def inventory(self) -> dict[str, TensorInfo]:
        out: dict[str, TensorInfo] = {}
        for shard in self._shards:
            with self._open(shard) as f:
                for name in f.keys():
                    sl = f.get_slice(name)
                    shape = tuple(int(d) for d in sl.get_shape())
                    dtype = str(sl.get_dtype())
                    n = int(np.prod(shape, dtype=np.int64)) if shape else 1
                    out[name] = TensorInfo(
                        name, shape, dtype, n * SAFETENSORS_ITEMSIZE.get(dtype, 0), shard
                    )
        return out

    def get_rows(self, name: str, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` of a 2-D tensor as float32 numpy, reading only those rows."""
        info = self.inventory[name]
        with self._open(info.file) as f:
            t = f.get_slice(name)[start:stop]
        return t.float().numpy()

    def get(self, name: str):
        """One tensor as a torch tensor (read through mmap; only this tensor is copied)."""
        info = self.inventory.get(name)
        if info is None:
            raise KeyError(name)
        with self._open(info.file) as f:
            return f.get_tensor(name)


class PickleStore:
    """Tensors of a folder holding only pickled PyTorch weights (opt-in: ``--allow-pickle``).

    Each ``.bin``/``.pt``/``.pth`` file is read with ``torch.load(weights_only=True)``: torch's
    restricted unpickler accepts tensors and plain containers only, so a pickle whose
    ``__reduce__`` names any other callable (``os.system``, ``builtins.exec``, ...) is refused
    before anything runs. Files are memory-mapped where the format allows (zip checkpoints).
    """

    SUFFIXES = (".bin", ".pt", ".pth")

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        index = folder / "pytorch_model.bin.index.json"
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
                if not isinstance(weight_map, dict):
                    raise TypeError("weight_map is not an object")
            except (ValueError, KeyError, TypeError, UnicodeDecodeError, RecursionError) as e:
                raise InvalidModelError(f"{index} is not a valid weight index ({_short(e)}).") from e
            bad = [v for v in weight_map.values() if not _plain_shard_name(v, self.SUFFIXES)]
            if bad:
                raise InvalidModelError(f"{index} names an invalid shard {bad[0]!r}; shards must be "
                                        "pickle files in the model folder.")
            self._shards = sorted(set(weight_map.values()))
        else:
            self._shards = sorted(p.name for p in folder.iterdir() if p.suffix in self.SUFFIXES
                                  and p.name != "training_args.bin")
        if not self._shards:
            raise InvalidModelError(f"{folder} has no pickled weight files.")
        self._state: dict[str, object] = {}
        for shard in self._shards:
            self._state.update({k: (shard, v) for k, v in self._load(shard).items()})

    def _load(self, shard: str) -> dict:
        import pickle
        import zipfile

        import torch

        path = self.folder / shard
        if not path.is_file():
            raise InvalidModelError(f"Shard '{shard}' is missing from {self.folder}; the download is incomplete.")
        try:
            try:
                sd = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError as e:  # legacy (non-zip) checkpoints cannot be memory-mapped
                if "mmap" not in str(e):
                    raise
                sd = torch.load(path, map_location="cpu", weights_only=True)
        except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, TypeError,
                AttributeError, ImportError, IndexError, KeyError, OSError, zipfile.BadZipFile) as e:
            raise InvalidModelError(
                f"{path} was refused by torch's weights-only loader ({_short(e)}); it holds "
                "something other than plain tensors, which could execute code. Nothing from it was run."
            ) from None
        if isinstance(sd, dict) and isinstance(sd.get("state_dict"), dict):
            sd = sd["state_dict"]
        if not isinstance(sd, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                               for k, v in sd.items()):
            raise InvalidModelError(f"{path} does not hold a mapping of tensor names to tensors.")
        return sd

    @cached_property
    def inventory(self) -> dict[str, TensorInfo]:
        out = {}
        for name, (shard, t) in self._state.items():
            shape = tuple(int(d) for d in t.shape)
            out[name] = TensorInfo(name, shape, _TORCH_DTYPE.get(str(t.dtype), str(t.dtype)),
                                   t.numel() * t.element_size(), shard)
        return out

    def get(self, name: str):
        if name not in self._state:
            raise KeyError(name)
        return self._state[name][1]

    def get_rows(self, name: str, start: int, stop: int) -> np.ndarray:
        return self.get(name)[start:stop].float().numpy()


_TORCH_DTYPE = {"torch.float32": "F32", "torch.float16": "F16", "torch.bfloat16": "BF16",
                "torch.float64": "F64", "torch.int64": "I64", "torch.int32": "I32",
                "torch.int8": "I8", "torch.uint8": "U8", "torch.bool": "BOOL"}


@contextmanager
def transformers_reads_gguf_fast():
    """Within the block, ``gguf.GGUFReader`` (which transformers' GGUF tokenizer and config
    loaders import at call time) is :func:`gguf_reader`. A scoped patch of a third-party name:
    transformers has no hook for its reader, and its own parse of a 65k vocabulary took 12 s."""
    import gguf

    original = gguf.GGUFReader
    gguf.GGUFReader = lambda path, mode="r": gguf_reader(path)
    try:
        yield
    finally:
        gguf.GGUFReader = original


class GGUFStore:
    """Tensors and metadata of a GGUF file, read with ``gguf.GGUFReader``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with open(path, "rb") as fh:
            magic = fh.read(4)
        if magic != b"GGUF":
            raise InvalidModelError(
                f"{path} is not a GGUF file (its first bytes are not the GGUF magic)."
            )
        from aios.models.gguf_bounds import check_gguf_bounds

        check_gguf_bounds(path)  # lengths and offsets fit the file before gguf-py trusts them
        try:
            self.reader = gguf_reader(path)
        except Exception as e:  # the reader raises ValueError/IndexError/... on bad bytes
            raise InvalidModelError(
                f"{path} is a truncated or corrupt GGUF file ({_short(e)}); re-export it."
            ) from e

    def field(self, key: str):
        """A metadata value decoded to Python (str, int, float, list), or None."""
        f = self.reader.get_field(key)
        if f is None:
            return None
        try:
            return f.contents()
        except Exception as e:  # bad UTF-8, wrong sizes: decoding happens lazily, per field
            raise InvalidModelError(
                f"{self.path} has an unreadable value for '{key}' ({_short(e)}); the file is corrupt."
            ) from e

    def metadata(self) -> dict[str, object]:
        out: dict[str, object] = {}
        for key in self.reader.fields:
            if key.startswith("GGUF.") or key.startswith("tokenizer.ggml."):
                continue
            out[key] = self.field(key)
        return out

    @cached_property
    def inventory(self) -> dict[str, TensorInfo]:
        out: dict[str, TensorInfo] = {}
        for t in self.reader.tensors:
            # GGUF lists dims fastest-first; report the numpy (row-major) shape
            shape = tuple(int(d) for d in reversed(t.shape.tolist()))
            out[t.name] = TensorInfo(
                t.name, shape, t.tensor_type.name, int(t.n_bytes), self.path.name
            )
        return out

    @cached_property
    def _by_name(self) -> dict:
        return {t.name: t for t in self.reader.tensors}

    def get(self, name: str) -> np.ndarray:
        """One tensor, dequantized to float32 by gguf-py."""
        from gguf import dequantize

        t = self._by_name.get(name)
        if t is None:
            raise KeyError(name)
        return dequantize(t.data, t.tensor_type).reshape(tuple(reversed(t.shape.tolist())))

    def get_rows(self, name: str, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` of a 2-D tensor as float32: only those rows' blocks are decoded
        (a streaming reader calls this block by block; decoding the whole tensor per call made
        R3 on a one-layer Falcon-7B-dimension Q4_K_M file take 120 s and 3x its RSS)."""
        from gguf import dequantize

        t = self._by_name.get(name)
        if t is None:
            raise KeyError(name)
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        if len(shape) != 2:
            return self.get(name)[start:stop]
        rows = np.asarray(t.data).reshape(shape[0], -1)[start:stop]  # stored rows: elements or blocks
        return dequantize(rows, t.tensor_type).astype(np.float32, copy=False).reshape(len(rows), shape[1])

    def iter_names(self) -> Iterator[str]:
        return (t.name for t in self.reader.tensors)


def _plain_shard_name(v: object, suffixes: tuple[str, ...] = (".safetensors",)) -> bool:
    """A shard is a bare file name in the model folder (no paths, no traversal)."""
    return (
        isinstance(v, str) and v.endswith(suffixes) and "/" not in v and "\\" not in v
        and v not in (".", "..") and not v.startswith(".")
    )


def _short(e: Exception) -> str:
    msg = str(e).strip().splitlines()[0] if str(e).strip() else e.__class__.__name__
    return msg[:160]
