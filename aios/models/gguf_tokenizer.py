"""The tokenizer a GGUF stores, tokenizing as the model's own tokenizer and llama.cpp do.

transformers rebuilds it from the file's ``tokenizer.ggml.*`` keys (byte-level BPE, or a
SentencePiece vocabulary with its scores and token types). One property of Phi-3's tokenizer is
in no key: its chat tokens (``<|user|>``, ``<|assistant|>``, ``<|end|>``, ...) strip the
whitespace after them (``rstrip`` in Phi-3's ``tokenizer_config.json``), so ``"<|user|>\\nHi"``
is ``<|user|> ▁Hi``, not ``<|user|> ▁ \\n Hi``. llama.cpp restores it by name (``llama-vocab.cpp``:
every control token of a Phi-3 vocabulary but ``<unk>``, ``<s>`` and ``<|endoftext|>``, and
``</s>``); so do we, for a SentencePiece vocabulary of the phi3 architecture (Phi-3 and 3.5; Phi-4
rides on phi3 with a byte-level vocabulary, whose special tokens strip nothing).

A byte-level BPE vocabulary (``tokenizer.ggml.model = "gpt2"``) names its pre-tokenizer in
``tokenizer.ggml.pre``; transformers sets the split regex of the names llama.cpp knows, but not
the other property llama.cpp attaches to some names: ``ignore_merges`` (Llama 3's
``tokenizer.json`` has it too): a pre-tokenized word that is itself a token is that one token,
whatever its merges, applied in rank order, would make of it. Llama 3's vocabulary has words the
merges split otherwise, so without it ``" the"``-like words tokenize differently from llama.cpp
and the model's tokenizer. We set it for those names (``IGNORE_MERGES``).

Building it is slow for a large vocabulary (Gemma 3's 262,144 tokens: ~6.5 s reading the GGUF's
arrays and ~11 s of conversion, 0.9 GB), so the finished tokenizer (fix-ups included) is cached in
``$AIOS_CACHE/tokenizers`` (default ``~/.cache/aios/tokenizers``), one file per GGUF, keyed by the
file's resolved path, size and mtime (never its bytes) and by what built it (this module's source,
the transformers / tokenizers / gguf versions). A later load reads that entry and never opens the
GGUF: the backend from its own ``tokenizers`` JSON, the rest of the object's attributes restored
as they were (same class, special tokens, chat template, padding side). The entry is a pickle read
by an unpickler that refuses every global but ``tokenizers.AddedToken``, so it cannot run code;
one that does not read back (truncated, corrupt, other versions) is rebuilt and replaced, and a
cache that cannot be written only costs the next load its time.
"""

from __future__ import annotations

import hashlib
import io
import os
import pickle
from pathlib import Path

from aios.io import cache_root

PHI3_NO_RSTRIP = ("<unk>", "<s>", "<|endoftext|>")
SENTENCEPIECE = "llama"  # tokenizer.ggml.model of a SentencePiece vocabulary (llama.cpp's name)
CONTROL = 3  # gguf.TokenType.CONTROL
USER_DEFINED = 4  # gguf.TokenType.USER_DEFINED
BYTE_LEVEL = "gpt2"  # tokenizer.ggml.model of a byte-level BPE vocabulary (llama.cpp's name)
# tokenizer.ggml.pre names for which llama.cpp's llama_vocab::impl::load (src/llama-vocab.cpp,
# llama.cpp as vendored by llama-cpp-python 0.3.36) sets ignore_merges = true
IGNORE_MERGES = frozenset({
    "llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
    "jina-v5-nano", "minicpm5", "youtu", "glm4", "glm5", "tekken", "granite-embed-multi-97m"})


CACHE_FORMAT = 1
# attributes of a tokenizer that are only what its class's __init__ built the backend from (262,144
# vocabulary entries and 514,906 merges for Gemma 3: a second of unpickling); the backend holds them
BUILD_INPUTS = ("_vocab", "_merges")


def load_gguf_tokenizer(path: str | Path):
    """The transformers tokenizer of the GGUF at ``path`` (from the cache when it is there)."""
    path = Path(path)
    entry = _cache_entry(path)
    if entry is not None:
        tok = _read_cached(*entry)
        if tok is not None:
            return tok
    tok = _build(path)
    if entry is not None:
        _write_cached(tok, *entry)
    return tok


def _build(path: Path):
    from transformers import AutoTokenizer

    from aios.models.tensors import gguf_reader, transformers_reads_gguf_fast

    reader = gguf_reader(path)
    with transformers_reads_gguf_fast():
        tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    _phi3_chat_tokens_rstrip(tok, path)
    _user_defined_tokens_whole(tok, reader)
    _ignore_merges(tok, reader)
    return tok


def cache_dir() -> Path:
    """Where finished GGUF tokenizers are kept: ``$AIOS_CACHE/tokenizers``, default
    ``~/.cache/aios/tokenizers`` (the root ``aios.models.real`` and ``from_gguf`` use)."""
    return cache_root() / "tokenizers"


def _cache_entry(path: Path) -> tuple[Path, dict] | None:
    """The cache file for the GGUF at ``path`` as it is now, and the record it must carry; None
    when the file cannot be stat'ed (the build then fails as it would without a cache)."""
    try:
        resolved = path.resolve()
        st = os.stat(resolved)
    except (OSError, RuntimeError):
        return None
    record = {"format": CACHE_FORMAT, "source": {"path": str(resolved), "size": st.st_size,
                                                 "mtime_ns": st.st_mtime_ns}, "built_by": _built_by()}
    where = hashlib.sha256(str(resolved).encode("utf-8", "surrogateescape")).hexdigest()[:12]
    what = hashlib.sha256(repr(record).encode("utf-8", "surrogateescape")).hexdigest()[:12]
    return cache_dir() / f"{resolved.stem}-{where}-{what}.pkl", record


def _built_by() -> dict:
    """What the cached tokenizer depends on besides the file: a change rebuilds it."""
    import importlib.metadata

    from aios.models.architectures import ARCHITECTURES

    versions = {}
    for dist in ("transformers", "tokenizers", "gguf"):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = None
    return {"recipe": hashlib.sha256(Path(__file__).read_bytes()).hexdigest(), "versions": versions,
            "rstrip_architectures": sorted(a.gguf_arch.lower() for a in ARCHITECTURES if a.spm_control_tokens_rstrip)}


class _Unpickler(pickle.Unpickler):
    """Plain data and ``tokenizers.AddedToken`` only: any other global (a callable an edited
    file could name) is refused, so reading an entry runs no code."""

    def find_class(self, module, name):
        if (module, name) == ("tokenizers", "AddedToken"):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not allowed in a tokenizer cache entry")


def _read_cached(file: Path, record: dict):
    """The tokenizer cached in ``file`` if it carries ``record``; None when it is absent or does
    not read back (it is then rebuilt and replaced)."""
    try:
        data = file.read_bytes()
    except OSError:
        return None
    try:
        import importlib

        from tokenizers import Tokenizer
        from transformers import PreTrainedTokenizerBase

        entry = _Unpickler(io.BytesIO(data)).load()
        if not isinstance(entry, dict) or entry.get("record") != record:
            return None
        module, qualname = entry["class"]
        if not module.startswith("transformers."):
            return None
        cls = importlib.import_module(module)
        for part in qualname.split("."):
            cls = getattr(cls, part)
        if not (isinstance(cls, type) and issubclass(cls, PreTrainedTokenizerBase)):
            return None
        tok = cls.__new__(cls)
        tok.__dict__.update(entry["state"])
        backend = Tokenizer.from_str(entry["backend"])
        backend.encode_special_tokens = entry["encode_special_tokens"]  # not in the JSON
        tok._tokenizer = backend
        if len(tok) != entry["len"]:
            return None
        return tok
    except Exception:  # noqa: BLE001 -- a damaged entry is a cache miss, whatever it raises
        return None


def _write_cached(tok, file: Path, record: dict) -> None:
    """Cache ``tok`` in ``file`` (atomically; older entries for the same path removed). Best
    effort: a tokenizer that does not serialize as expected or a cache that cannot be written
    is left uncached."""
    from aios.io import write_atomic

    try:
        state = {k: v for k, v in vars(tok).items() if k != "_tokenizer" and k not in BUILD_INPUTS}
        backend = tok.backend_tokenizer
        entry = {"record": record, "class": (type(tok).__module__, type(tok).__qualname__), "state": state,
                 "backend": backend.to_str(), "encode_special_tokens": backend.encode_special_tokens,
                 "len": len(tok)}
        data = pickle.dumps(entry, protocol=pickle.HIGHEST_PROTOCOL)
        _Unpickler(io.BytesIO(data)).load()  # only what the reader accepts is written
        write_atomic(file, data)
        prefix = file.name.rsplit("-", 1)[0] + "-"
        for old in file.parent.glob("*.pkl"):
            if old.name.startswith(prefix) and old != file:
                old.unlink(missing_ok=True)
    except Exception:  # noqa: BLE001 -- a cache that fails to write is only a slower next load
        return


def _field(reader, key: str):
    f = reader.get_field(key)
    return None if f is None else f.contents()


def _phi3_chat_tokens_rstrip(tok, path: Path) -> None:
    from tokenizers import AddedToken

    from aios.models.architectures import ARCHITECTURES
    from aios.models.tensors import gguf_reader

    reader = gguf_reader(path)
    name = _field(reader, "general.architecture")
    rows = [a for a in ARCHITECTURES if a.gguf_arch.lower() == name]
    if not any(a.spm_control_tokens_rstrip for a in rows) or _field(reader, "tokenizer.ggml.model") != SENTENCEPIECE:
        return
    tokens = _field(reader, "tokenizer.ggml.tokens")
    types = _field(reader, "tokenizer.ggml.token_type")
    strip = [t for t, k in zip(tokens, types)
             if (k == CONTROL or t == "</s>") and t not in PHI3_NO_RSTRIP]
    if strip:
        added = [AddedToken(t, rstrip=True, normalized=False, special=True) for t in strip]
        tok.add_special_tokens({"additional_special_tokens": added}, replace_extra_special_tokens=False)


def _user_defined_tokens_whole(tok, reader) -> None:
    """Every user-defined token of a SentencePiece vocabulary is matched in the raw text before
    the model's merges, as llama.cpp's ``tokenizer_st_partition`` matches it. transformers' GGUF
    conversion leaves out the whitespace-only ones (Gemma 3's runs of 2-31 spaces or tabs), so a
    run of 33 spaces became merges 16 + 17 instead of llama.cpp's 31 + 2."""
    if _field(reader, "tokenizer.ggml.model") != SENTENCEPIECE:
        return
    tokens = _field(reader, "tokenizer.ggml.tokens")
    types = _field(reader, "tokenizer.ggml.token_type")
    have = {str(t) for t in tok.added_tokens_decoder.values()}
    vocab = tok.get_vocab()
    added = []
    for i, (t, k) in enumerate(zip(tokens, types)):
        if k != USER_DEFINED or t in have:
            continue
        from tokenizers import AddedToken

        # the converted vocabulary spells spaces as SentencePiece's "▁": such a token is matched
        # after the normalizer (which writes "▁" for " ") under its stored spelling, so it keeps its id
        piece = t.replace(" ", "\u2581")
        if vocab.get(t) == i:
            added.append(AddedToken(t, normalized=False, special=False))
        elif vocab.get(piece) == i:
            added.append(AddedToken(piece, normalized=True, special=False))
    if added:
        n = len(tok)
        tok.add_tokens(added)
        assert len(tok) == n, "a user-defined token must keep its vocabulary id"


def _ignore_merges(tok, reader) -> None:
    """Words that are tokens stay whole, as llama.cpp keeps them for this pre-tokenizer name."""
    if (_field(reader, "tokenizer.ggml.model") == BYTE_LEVEL
            and _field(reader, "tokenizer.ggml.pre") in IGNORE_MERGES):
        tok.backend_tokenizer.model.ignore_merges = True
