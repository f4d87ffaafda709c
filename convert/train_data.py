"""Training text for the fine-tunes (relufy, trained alias): token windows, sharded across ranks.

Two sources, one interface (``next_batch(n)`` → this rank's ``(n, seq_len)`` windows of the next
optimisation step; ``state_dict()`` / ``load_state_dict()`` for exact resume):

* :class:`RandomWindows`: an in-memory token stream (the fixtures' pydoc train split, or a
  small file). Every rank draws the same *global* batch of random windows from one seeded
  generator and keeps its slice, so the data of a step does not depend on the process count
  (a one-process run and a two-process run with the same global batch see the same windows).
* :class:`StreamedWindows`: a corpus on disk (JSONL ``text`` field, TXT paragraphs, Parquet
  ``text`` column; a file, a folder, a glob, or a hub dataset id whose snapshot is in the local
  hub cache — nothing is downloaded) read *streaming* by the ``datasets`` library,
  so memory does not grow with the corpus. Documents are sharded across ranks by
  ``datasets.distributed.split_dataset_by_node`` (whole files when their count divides by the
  number of processes, else every n-th document), each rank tokenizes only its own documents,
  joins them EOS-separated and cuts the stream into contiguous ``seq_len`` windows, which pass
  through a seeded shuffle buffer. When the corpus ends the next epoch starts (the epoch count
  is in the provenance). The windows of a rank depend on the process count here: resume with
  the same count.

:class:`Prefetcher` runs a source in a background thread (tokenization and packing off the
training step's critical path) and snapshots the source state at checkpoint steps.
"""

from __future__ import annotations

import glob as globlib
import hashlib
import queue
import threading
from collections import deque
from pathlib import Path
from typing import Any, Protocol

import torch

from aios.data import BadTextFileError
from aios.errors import ModelNotFoundError, UsageError
from aios.evaluation import TokenSet
from aios.models.hub import find_dataset_in_cache, hub_cache_dir, looks_like_hub_id

# file suffix -> datasets builder; one format per corpus
BUILDERS = {".jsonl": "json", ".ndjson": "json", ".json": "json", ".txt": "text",
            ".parquet": "parquet"}
# JSON files of datasets' own bookkeeping, never corpus text (hub snapshots, save_to_disk)
METADATA_FILES = {"dataset_infos.json", "dataset_info.json", "dataset_dict.json", "state.json"}
TEXT_COLUMN = "text"
TOKENIZE_DOCS = 256  # documents tokenized per batched tokenizer call
SHUFFLE_WINDOWS = 256  # windows in the seeded shuffle buffer of a streamed corpus


class WindowSource(Protocol):
    def next_batch(self, n: int) -> torch.Tensor: ...  # (n, seq_len) long

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def describe(self) -> dict[str, Any]: ...


class RandomWindows:
    """Random contiguous windows of an in-memory stream; the global batch is drawn on every rank."""

    def __init__(self, tokens: TokenSet, seq_len: int, seed: int, rank: int = 0, world: int = 1):
        if len(tokens.ids) <= seq_len:
            raise BadTextFileError(f"Training text {tokens.source} has {len(tokens.ids)} tokens; at "
                                   f"least {seq_len + 1} are needed (or lower --seq-len).")
        self.tokens, self.seq_len, self.rank, self.world = tokens, seq_len, rank, world
        self.gen = torch.Generator().manual_seed(seed)

    def next_batch(self, n: int) -> torch.Tensor:
        ids, T = self.tokens.ids, self.seq_len
        starts = torch.randint(0, len(ids) - T + 1, (n * self.world,), generator=self.gen)
        mine = starts[self.rank * n:(self.rank + 1) * n]
        return ids[mine[:, None] + torch.arange(T)]

    def state_dict(self) -> dict[str, Any]:
        return {"generator": self.gen.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.gen.set_state(state["generator"])

    def describe(self) -> dict[str, Any]:
        return {**self.tokens.describe(), "sampling": "random windows (seeded, global batch)"}


def resolve_files(spec: str | Path) -> tuple[list[Path], str]:
    """Files of a corpus given as a file, a folder (searched recursively) or a glob, and
    their ``datasets`` builder. One clear sentence when nothing usable matches."""
    text = str(spec)
    p = Path(text).expanduser()
    if not p.exists() and looks_like_hub_id(text):  # a hub dataset, if the cache has it
        snap = find_dataset_in_cache(text)
        if snap is None:
            raise ModelNotFoundError(
                f"Training data '{text}' is not a local path and not a dataset in the hub cache "
                f"({hub_cache_dir()}); fetch it first (`huggingface-cli download --repo-type "
                f"dataset {text}`).")
        p = snap
    if p.is_file():
        files = [p]
    elif p.is_dir():
        files = sorted(f for f in p.rglob("*") if f.is_file() and f.suffix.lower() in BUILDERS
                       and f.name not in METADATA_FILES and not f.name.startswith("."))
        if not files:
            raise ModelNotFoundError(f"Training data folder {p} holds no {', '.join(BUILDERS)} "
                                     "files (not found).")
    elif any(c in text for c in "*?["):
        files = sorted(Path(f) for f in globlib.glob(str(p), recursive=True) if Path(f).is_file())
        if not files:
            raise ModelNotFoundError(f"Training data pattern {text} matches no file (not found).")
    else:
        raise ModelNotFoundError(f"Training data not found: {p}.")
    kinds = {f.suffix.lower() for f in files}
    unknown = sorted(k for k in kinds if k not in BUILDERS)
    if unknown:
        raise UsageError(f"Training data {text} holds {unknown[0] or 'extension-less'} files; "
                         f"use {', '.join(BUILDERS)}.")
    builders = {BUILDERS[k] for k in kinds}
    if len(builders) > 1:
        raise UsageError(f"Training data {text} mixes formats ({', '.join(sorted(kinds))}); "
                         "give one format per corpus.")
    return files, builders.pop()


def corpus_fingerprint(files: list[Path]) -> str:
    """Identity of a corpus for resume checks: names, sizes and modification times (reading
    terabytes to hash them is not an option at scale)."""
    h = hashlib.sha256()
    for f in files:
        st = f.stat()
        h.update(f"{f.resolve()}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


class StreamedWindows:
    """Packed windows of a streamed on-disk corpus (see the module docstring)."""

    def __init__(self, spec: str | Path, tokenizer, seq_len: int, seed: int, rank: int = 0,
                 world: int = 1, shuffle_windows: int = SHUFFLE_WINDOWS) -> None:
        self.spec = str(spec)
        self.files, self.builder = resolve_files(spec)
        self.tokenizer, self.seq_len, self.rank, self.world = tokenizer, seq_len, rank, world
        self.shuffle_windows = max(1, shuffle_windows)
        self.gen = torch.Generator().manual_seed(seed + 7919 * rank)
        self.epoch = 0
        self.windows_out = 0
        self.windows_made = 0  # windows cut from the token stream so far (all epochs)
        self.carry: list[int] = []  # tokens after the last full window
        self.buffer: deque[torch.Tensor] = deque()
        self._dataset = self._open()
        self._docs = None  # iterator over the dataset, opened lazily

    def _open(self):
        import datasets
        from datasets import load_dataset
        from datasets.distributed import split_dataset_by_node

        # a parse error becomes our one sentence (BadTextFileError); datasets would also log it
        datasets.logging.set_verbosity(datasets.logging.CRITICAL)
        datasets.disable_progress_bars()

        kwargs = {"sample_by": "paragraph"} if self.builder == "text" else {}
        try:  # Parquet footers are read here already (schema inference)
            ds = load_dataset(self.builder, data_files=[str(f) for f in self.files], split="train",
                              streaming=True, **kwargs)
        except Exception as e:
            raise self._unreadable(e) from None
        if self.world > 1:
            ds = split_dataset_by_node(ds, rank=self.rank, world_size=self.world)
        return ds

    def _unreadable(self, e: Exception) -> BadTextFileError:
        first = str(e).splitlines()[0].rstrip(".") if str(e) else type(e).__name__
        return BadTextFileError(f"Training data {self.spec} cannot be read: {first}.")

    def _read_docs(self, n: int) -> list[str]:
        """Up to ``n`` non-empty documents; starts the next epoch at the end of the corpus."""
        docs: list[str] = []
        restarted = False
        while len(docs) < n:
            if self._docs is None:
                self._dataset.set_epoch(self.epoch)
                self._docs = iter(self._dataset)
            try:
                row = next(self._docs)
            except StopIteration:
                if restarted and not docs:
                    raise BadTextFileError(f"Training data {self.spec} has no text for process "
                                           f"{self.rank} of {self.world}.") from None
                self.epoch += 1
                self._docs, restarted = None, True
                if docs:
                    break
                continue
            except Exception as e:  # pyarrow / json parse errors: one sentence, exit 4
                raise self._unreadable(e) from None
            text = row.get(TEXT_COLUMN)
            if text is None:
                raise BadTextFileError(f"Training data {self.spec} has no '{TEXT_COLUMN}' field "
                                       f"(it has {', '.join(map(str, row)) or 'no columns'}).")
            if isinstance(text, str) and text.strip():
                docs.append(text)
        return docs

    def _fill(self) -> None:
        """Tokenize documents until the shuffle buffer is full."""
        T, eos = self.seq_len, self.tokenizer.eos_token_id
        while len(self.buffer) < self.shuffle_windows:
            docs = self._read_docs(TOKENIZE_DOCS)
            for ids in self.tokenizer(docs, add_special_tokens=False, verbose=False)["input_ids"]:
                self.carry.extend(([eos] if eos is not None else []) + ids)
            full = len(self.carry) // T
            if full:
                block = torch.tensor(self.carry[:full * T], dtype=torch.long).view(full, T)
                self.buffer.extend(block)
                self.windows_made += full
                del self.carry[:full * T]
            if self.epoch > 0 and self.windows_made == 0:  # a whole pass gave no window
                raise BadTextFileError(
                    f"Training data {self.spec} has {len(self.carry)} tokens for process "
                    f"{self.rank} of {self.world}; at least {T} are needed (or lower --seq-len).")

    def next_batch(self, n: int) -> torch.Tensor:
        out = []
        for _ in range(n):
            self._fill()
            # draw among the oldest ``shuffle_windows`` (a tokenizer call may cut more)
            k = min(len(self.buffer), self.shuffle_windows)
            j = int(torch.randint(0, k, (1,), generator=self.gen)) if k > 1 else 0
            self.buffer.rotate(-j)
            out.append(self.buffer.popleft())
            self.buffer.rotate(j)
        self.windows_out += n
        return torch.stack(out)

    def state_dict(self) -> dict[str, Any]:
        return {"dataset": self._dataset.state_dict() if self._docs is not None else None,
                "epoch": self.epoch, "carry": list(self.carry), "windows_out": self.windows_out,
                "windows_made": self.windows_made,
                "buffer": torch.stack(list(self.buffer)) if self.buffer else None,
                "generator": self.gen.get_state(), "world": self.world}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["world"] != self.world:
            raise UsageError(f"The checkpoint's streamed data was sharded over {state['world']} "
                             f"processes; resume it with {state['world']}, not {self.world}.")
        self.epoch, self.carry = state["epoch"], list(state["carry"])
        self.windows_out, self.windows_made = state["windows_out"], state["windows_made"]
        self.buffer = deque(state["buffer"]) if state["buffer"] is not None else deque()
        self.gen.set_state(state["generator"])
        self._dataset = self._open()
        self._docs = None
        if state["dataset"] is not None:
            self._dataset.set_epoch(self.epoch)
            self._dataset.load_state_dict(state["dataset"])
            self._docs = iter(self._dataset)

    def describe(self) -> dict[str, Any]:
        return {"source": self.spec, "format": self.builder, "files": len(self.files),
                "bytes": sum(f.stat().st_size for f in self.files),
                "fingerprint": corpus_fingerprint(self.files),
                "sampling": f"streamed, packed {self.seq_len}-token windows, shuffle buffer "
                            f"{self.shuffle_windows}, sharded by datasets.split_dataset_by_node",
                "epochs_started": self.epoch + 1}


class Prefetcher:
    """Produces each step's windows in a background thread; snapshots the source state after
    the steps in ``snapshot_at`` so a checkpoint records exactly the data position it reached."""

    def __init__(self, source: WindowSource, per_step: int, first: int, last: int,
                 snapshot_every: int, depth: int = 2) -> None:
        self.source = source
        self._q: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._args = (per_step, first, last, snapshot_every)
        self._thread = threading.Thread(target=self._run, name="aios-data", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        per_step, first, last, every = self._args
        try:
            for step in range(first, last):
                batch = self.source.next_batch(per_step)
                snap = self.source.state_dict() if every and (step + 1) % every == 0 else None
                while not self._stop.is_set():
                    try:
                        self._q.put((step, batch, snap, None), timeout=0.2)
                        break
                    except queue.Full:
                        continue
                if self._stop.is_set():
                    return
        except BaseException as e:  # re-raised in the training thread
            self._q.put((None, None, None, e))

    def get(self, step: int) -> tuple[torch.Tensor, dict | None]:
        got, batch, snap, err = self._q.get()
        if err is not None:
            raise err
        assert got == step, f"data for step {got} arrived at step {step}"
        return batch, snap

    def close(self) -> None:
        self._stop.set()
        while self._thread.is_alive():
            try:
                self._q.get_nowait()
            except queue.Empty:
                pass
            self._thread.join(timeout=0.1)


__all__ = ["BUILDERS", "Prefetcher", "RandomWindows", "StreamedWindows", "WindowSource",
           "corpus_fingerprint", "resolve_files"]
