"""The GGUF's tokenizer for the runtime's commands, without importing transformers.

``aios.models.gguf_tokenizer`` builds the transformers tokenizer of a GGUF once and caches it
(the ``tokenizers`` backend's JSON plus the transformers object's attributes). Rebuilding the
transformers object from that entry costs ``import transformers`` (~0.8 s), more than the rest of
the load; ``aios-run generate`` only encodes, decodes and reads a few attributes. So a
:class:`LightTokenizer` reads the same entry with the ``tokenizers`` library alone: the backend
from its JSON, the special tokens, ``clean_up_tokenization_spaces`` and the chat template from the
stored attributes, and does what transformers' ``TokenizersBackend`` (5.x) does with them for
``tok(text)``, ``tok.decode(ids)``, ``get_vocab``, ``convert_ids_to_tokens`` /
``convert_tokens_to_ids`` and the ``*_token`` / ``*_token_id`` attributes, to the same ids and
text, and renders a chat to text through transformers' renderer (``chat_render``). Everything else
(``apply_chat_template`` to ids, batches, padding, any other attribute or keyword)
is the full transformers tokenizer's, loaded the first time it is asked for.

The entry's class must be one of ``LIGHT_CLASSES``, transformers classes whose encode / decode
paths are ``TokenizersBackend``'s (only ``__init__`` differs; a test checks this against the
installed transformers); an entry of another class, a missing or damaged one, or a GGUF not yet
cached loads through ``load_gguf_tokenizer`` (which builds and caches it as before): the light
view of the result, or the transformers tokenizer itself for a class not in the list.
"""

from __future__ import annotations

import io
from pathlib import Path

from aios.models import chat_render, gguf_tokenizer

# (module, qualname) of the transformers tokenizer classes a LightTokenizer stands in for
LIGHT_CLASSES = frozenset({
    ("transformers.tokenization_utils_tokenizers", "TokenizersBackend"),
    ("transformers.models.gemma.tokenization_gemma", "GemmaTokenizer"),
    ("transformers.models.llama.tokenization_llama", "LlamaTokenizer"),
    ("transformers.models.qwen2.tokenization_qwen2", "Qwen2Tokenizer"),
    ("transformers.models.gpt2.tokenization_gpt2", "GPT2Tokenizer"),
})
# transformers' SPECIAL_TOKENS_ATTRIBUTES (an instance may extend it: then its state holds the list)
SPECIAL_TOKENS_ATTRIBUTES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                             "mask_token")
# what PreTrainedTokenizerBase.clean_up_tokenization replaces, in its order
CLEAN_UP = ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"), (" 'm", "'m"),
            (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"))
# keywords of tok(text, ...) a LightTokenizer answers itself; any other goes to transformers
CALL_KEYWORDS = frozenset({"add_special_tokens", "verbose", "split_special_tokens"})


def load_gguf_tokenizer_light(path: str | Path):
    """The tokenizer of the GGUF at ``path`` without importing transformers when it is cached: a
    :class:`LightTokenizer` (the transformers tokenizer for a class not in ``LIGHT_CLASSES``).
    Errors are ``load_gguf_tokenizer``'s."""
    path = Path(path)
    entry = gguf_tokenizer._cache_entry(path)
    if entry is not None:
        tok = _read_light(*entry, path)
        if tok is not None:
            return tok
    full = gguf_tokenizer.load_gguf_tokenizer(path)
    if (type(full).__module__, type(full).__qualname__) not in LIGHT_CLASSES:
        return full
    state = {k: v for k, v in vars(full).items() if k != "_tokenizer"}
    return LightTokenizer(full.backend_tokenizer, state, path, full=full)


def _read_light(file: Path, record: dict, path: Path):
    """The LightTokenizer of the entry in ``file`` if it carries ``record`` and a class in
    ``LIGHT_CLASSES``; None otherwise (the full path then reads, or rebuilds, it)."""
    try:
        data = file.read_bytes()
    except OSError:
        return None
    try:
        from tokenizers import Tokenizer

        entry = gguf_tokenizer._Unpickler(io.BytesIO(data)).load()
        if not isinstance(entry, dict) or entry.get("record") != record:
            return None
        if tuple(entry["class"]) not in LIGHT_CLASSES or not isinstance(entry["state"], dict):
            return None
        backend = Tokenizer.from_str(entry["backend"])
        backend.encode_special_tokens = entry["encode_special_tokens"]  # not in the JSON
        if backend.get_vocab_size(with_added_tokens=True) != entry["len"]:
            return None
        return LightTokenizer(backend, entry["state"], path)
    except Exception:  # noqa: BLE001 -- a damaged entry is a cache miss, whatever it raises
        return None


class LightTokenizer:
    """A ``tokenizers.Tokenizer`` with the attributes of the transformers tokenizer it was cached
    from, encoding and decoding as that one does (see the module docstring)."""

    def __init__(self, backend, state: dict, path: Path, full=None):
        self._tokenizer = backend
        self._state = dict(state)
        self._path = path
        self._full = full

    # -- the full transformers tokenizer, for anything not mirrored here --
    def full_tokenizer(self):
        """The transformers tokenizer of the same GGUF (imports transformers; loaded once)."""
        if self._full is None:
            self._full = gguf_tokenizer.load_gguf_tokenizer(self._path)
        return self._full

    def __getattr__(self, name: str):
        if name.startswith("__") or name in ("_tokenizer", "_state", "_path", "_full"):
            raise AttributeError(name)
        state = self.__dict__.get("_state", {})
        base = name.removesuffix("_ids").removesuffix("_id") if name.endswith(("_id", "_ids")) else name
        if base in state.get("SPECIAL_TOKENS_ATTRIBUTES", SPECIAL_TOKENS_ATTRIBUTES):
            value = state.get("_special_tokens_map", {}).get(base)
            if value is None:
                return None
            return str(value) if name == base else self.convert_tokens_to_ids(str(value))
        if base == "extra_special_tokens":
            tokens = [str(t) for t in state.get("_extra_special_tokens", [])]
            return tokens if name == base else self.convert_tokens_to_ids(tokens)
        if name in state:
            return state[name]
        return getattr(self.full_tokenizer(), name)

    def __repr__(self) -> str:
        return f"LightTokenizer({self._path.name!r}, {len(self)} tokens)"

    def __bool__(self) -> bool:
        return True

    # -- vocabulary --
    @property
    def backend_tokenizer(self):
        return self._tokenizer

    def __len__(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    @property
    def vocab_size(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=False)

    def get_vocab(self) -> dict[str, int]:
        return self._tokenizer.get_vocab(with_added_tokens=True)

    @property
    def chat_template(self):
        return self._state.get("chat_template")

    @property
    def add_bos_token(self) -> bool:
        return self._state.get("_add_bos_token", False)

    @property
    def add_eos_token(self) -> bool:
        return self._state.get("_add_eos_token", False)

    @property
    def special_tokens_map(self) -> dict[str, str]:
        named = self._state.get("_special_tokens_map", {})
        return {a: str(named[a]) for a in self._state.get("SPECIAL_TOKENS_ATTRIBUTES", SPECIAL_TOKENS_ATTRIBUTES)
                if named.get(a) is not None}

    @property
    def all_special_tokens(self) -> list[str]:
        named = self._state.get("_special_tokens_map", {})
        out: list[str] = []
        for value in [named.get(a) for a in self._state.get("SPECIAL_TOKENS_ATTRIBUTES", SPECIAL_TOKENS_ATTRIBUTES)] + list(
                self._state.get("_extra_special_tokens", [])):
            if value is not None and str(value) not in out:
                out.append(str(value))
        return out

    @property
    def all_special_ids(self) -> list[int]:
        return self.convert_tokens_to_ids(self.all_special_tokens)

    def convert_tokens_to_ids(self, tokens):
        if isinstance(tokens, str):
            index = self._tokenizer.token_to_id(tokens)
            return self.unk_token_id if index is None else index
        return [self.convert_tokens_to_ids(t) for t in tokens]

    def convert_ids_to_tokens(self, ids, skip_special_tokens: bool = False):
        if isinstance(ids, int):
            return self._tokenizer.id_to_token(ids)
        skip = set(self.all_special_ids) if skip_special_tokens else set()
        return [self._tokenizer.id_to_token(int(i)) for i in ids if int(i) not in skip]

    # -- encoding --
    def __call__(self, text=None, *args, **kwargs):
        if args or not isinstance(text, str) or not set(kwargs) <= CALL_KEYWORDS:
            return self.full_tokenizer()(text, *args, **kwargs)
        backend = self._tokenizer
        # transformers' call without truncation or padding clears what an earlier call left set
        if backend.truncation is not None:
            backend.no_truncation()
        if backend.padding is not None:
            backend.no_padding()
        split = kwargs.get("split_special_tokens", self._state.get("split_special_tokens", False))
        if backend.encode_special_tokens != split:
            backend.encode_special_tokens = split
        enc = backend.encode_batch([text], add_special_tokens=kwargs.get("add_special_tokens", True))[0]
        names = self._state.get("model_input_names", ["input_ids", "attention_mask"])
        out = {"input_ids": enc.ids}
        if "token_type_ids" in names:
            out["token_type_ids"] = enc.type_ids
        if "attention_mask" in names:
            out["attention_mask"] = enc.attention_mask
        return out

    def encode(self, text, add_special_tokens: bool = True, **kwargs) -> list[int]:
        if kwargs:
            return self.full_tokenizer().encode(text, add_special_tokens=add_special_tokens, **kwargs)
        return self(text, add_special_tokens=add_special_tokens)["input_ids"]

    # -- decoding --
    def decode(self, token_ids, skip_special_tokens: bool = False, clean_up_tokenization_spaces: bool | None = None):
        """``TokenizersBackend.decode``: the backend's decode, then ``clean_up_tokenization`` when
        ``clean_up_tokenization_spaces`` (the call's, else the tokenizer's) and the model is not BPE
        (or the tokenizer insists)."""
        if hasattr(token_ids, "tolist"):  # a numpy array or scalar, a torch tensor
            token_ids = token_ids.tolist()
        if isinstance(token_ids, (list, tuple)) and token_ids and isinstance(token_ids[0], (list, tuple)):
            return [self.decode(seq, skip_special_tokens, clean_up_tokenization_spaces) for seq in token_ids]
        if isinstance(token_ids, dict):
            token_ids = token_ids["input_ids"]
        ids = [int(token_ids)] if not isinstance(token_ids, (list, tuple)) else [int(i) for i in token_ids]
        text = self._tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
        clean = (clean_up_tokenization_spaces if clean_up_tokenization_spaces is not None
                 else self._state.get("clean_up_tokenization_spaces", False))
        if clean and (type(self._tokenizer.model).__name__ != "BPE" or self._state.get(
                "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output", False)):
            for old, new in CLEAN_UP:
                text = text.replace(old, new)
        return text

    def batch_decode(self, sequences, skip_special_tokens: bool = False, clean_up_tokenization_spaces: bool | None = None):
        return [self.decode(s, skip_special_tokens, clean_up_tokenization_spaces) for s in sequences]

    # -- chat: transformers' renderer (jinja2 in a sandbox, its own helpers), not its tokenizer --
    def apply_chat_template(self, *args, **kwargs):
        return chat_render.apply_chat_template(self, *args, **kwargs)
