"""A GGUF's SentencePiece vocabulary (``tokenizer.ggml.model = "llama"``), tokenizing as llama.cpp.

The runtime's commands need a tokenizer in well under a second. The transformers tokenizer of the
real Gemma 3 270M (262,144 tokens, 514,906 merges rebuilt from them) takes 8 s and 0.9 GB to
build, and 1.2-1.7 s and ~380 MB to load back from its cache as a ``tokenizers`` object. This one
reads the vocabulary, scores and token types straight from the file (~0.25 s, ~40 MB) and
implements llama.cpp's own algorithm (``src/llama-vocab.cpp`` of the llama.cpp that
llama-cpp-python 0.3.36 vendors), which is the definition the runtime's ids must equal:

* ``tokenizer_st_partition``: the text is cut at special tokens, longest first, each matched at
  every occurrence left to right. Control and unknown tokens are matched only when special
  tokens are parsed (``split_special_tokens=False``, the default); user-defined tokens always.
  Phi-3 vocabularies (``general.name`` holding "phi-3" or "phi3", as llama.cpp tests) strip the
  whitespace after their control tokens and ``</s>``.
* each text fragment, with a space prepended when ``tokenizer.ggml.add_space_prefix`` (default
  true) and it follows BOS, a special token or the start, has its spaces written as "▁" and is
  merged by ``llm_tokenizer_spm_session``: the symbols are the fragment's characters; the
  adjacent pair whose concatenation is a token with the highest score merges first (ties: the
  leftmost), until no pair is a token; a symbol that is not a token is written as its bytes'
  ``<0xXX>`` tokens.
* BOS first when ``tokenizer.ggml.add_bos_token`` (default true), EOS last when
  ``tokenizer.ggml.add_eos_token`` (default false).

Decoding follows transformers' tokenizer of the same file (what :mod:`aios.models.light_tokenizer`
mirrors): the tokens' texts through the ``tokenizers`` decoders that tokenizer uses ("▁" to
space, ``<0xXX>`` runs to UTF-8, and the first space stripped for a vocabulary that prepends one,
Gemma's builders excepted), special tokens dropped on ``skip_special_tokens``. Anything else
(``apply_chat_template``, batches, padding) is the transformers tokenizer's, loaded on first use.
Tests hold it to llama.cpp's ids and to transformers' ids and text on llama.cpp's own SPM files.
"""

from __future__ import annotations

import heapq
from pathlib import Path

import numpy as np

from aios.models import chat_render

SPM = "llama"  # tokenizer.ggml.model of a SentencePiece vocabulary
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6  # gguf.TokenType
# transformers builds these architectures' SentencePiece tokenizers with GemmaTokenizer, whose
# decoder strips no leading space (gguf_tokenizer_mapping.GGUF_SENTENCEPIECE_BUILDERS)
NO_STRIP_ARCHITECTURES = ("gemma", "gemma2", "gemma3")
C_SPACE = " \t\n\v\f\r"  # C's isspace, which llama.cpp's lstrip / rstrip test
# llama-vocab.cpp gives Phi-3's control tokens rstrip when general.name (lower-cased) holds one of
# these: the model's name, not its architecture (Phi-4 rides on phi3 with a byte-level vocabulary)
PHI3_NAMES = ("phi-3", "phi3")


def load_spm_tokenizer(path: str | Path):
    """The :class:`SpmTokenizer` of the GGUF at ``path``, or None when its vocabulary is not
    SentencePiece (or lacks what llama.cpp needs: tokens; byte tokens or single-byte ones)."""
    from aios.models.gguf_reader import gguf_reader, scalar_array, string_array

    path = Path(path)
    r = gguf_reader(path)

    def get(key, default=None):
        f = r.get_field(key)
        return default if f is None else f.contents()

    if get("tokenizer.ggml.model") != SPM or r.get_field("tokenizer.ggml.tokens") is None:
        return None
    tokens = string_array(r.get_field("tokenizer.ggml.tokens"))
    n = len(tokens)
    f = r.get_field("tokenizer.ggml.scores")
    scores = scalar_array(f).astype(np.float32)[:n] if f is not None else np.zeros(n, np.float32)
    f = r.get_field("tokenizer.ggml.token_type")
    types = scalar_array(f).astype(np.int32)[:n] if f is not None else np.full(n, NORMAL, np.int32)
    if len(scores) < n or len(types) < n:
        return None
    special = {name: get(f"tokenizer.ggml.{name}_token_id", default)
               for name, default in (("bos", 1), ("eos", 2), ("unknown", 0), ("padding", None))}
    return SpmTokenizer(
        path, tokens, scores, types,
        bos=special["bos"], eos=special["eos"], unk=special["unknown"], pad=special["padding"],
        add_bos=bool(get("tokenizer.ggml.add_bos_token", True)),
        add_eos=bool(get("tokenizer.ggml.add_eos_token", False)),
        add_space_prefix=bool(get("tokenizer.ggml.add_space_prefix", True)),
        phi3=any(s in str(get("general.name", "")).lower() for s in PHI3_NAMES),
        strip_decoded=get("general.architecture") not in NO_STRIP_ARCHITECTURES,
        chat_template=get("tokenizer.chat_template"),
    )


class SpmTokenizer:
    """llama.cpp's SentencePiece tokenizer over a GGUF's vocabulary (see the module docstring),
    answering the calls the runtime makes of a transformers tokenizer."""

    def __init__(self, path: Path, tokens: list[str], scores: np.ndarray, types: np.ndarray, *, bos, eos, unk,
                 pad, add_bos: bool, add_eos: bool, add_space_prefix: bool, phi3: bool, strip_decoded: bool,
                 chat_template: str | None) -> None:
        self._path, self._full = path, None
        # llama.cpp names an empty token "[EMPTY_i]"; a later duplicate text wins the lookup
        self.tokens = [t if t else f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
        self.scores = scores.tolist()
        self.types = types.tolist()
        self.ids = {t: i for i, t in enumerate(self.tokens)}
        self.bos_token_id, self.eos_token_id, self.unk_token_id, self.pad_token_id = bos, eos, unk, pad
        self.add_bos_token, self.add_eos_token, self.add_space_prefix = add_bos, add_eos, add_space_prefix
        self.chat_template = chat_template
        self._strip_decoded = strip_decoded and add_space_prefix
        kinds = (CONTROL, USER_DEFINED, UNKNOWN)
        specials = [i for i, k in enumerate(self.types) if k in kinds]
        specials.sort(key=lambda i: -len(self.tokens[i].encode("utf-8")))  # longest first (llama.cpp)
        rstrip = set()
        if phi3:  # llama-vocab.cpp's per-model attributes
            rstrip = {i for i in specials} | ({self.ids["</s>"]} if "</s>" in self.ids else set())
            rstrip -= {self.ids[t] for t in ("<unk>", "<s>", "<|endoftext|>") if t in self.ids}
        self._specials = [(i, self.tokens[i], self.types[i], i in rstrip) for i in specials]
        self._bytes = [self.ids.get(f"<0x{b:02X}>", self.ids.get(chr(b))) for b in range(256)]

    # -- encoding --
    def __call__(self, text=None, *args, **kwargs):
        if args or not isinstance(text, str) or not set(kwargs) <= {"add_special_tokens", "split_special_tokens"}:
            return self.full_tokenizer()(text, *args, **kwargs)
        ids = self.tokenize(text, kwargs.get("add_special_tokens", True),
                            not kwargs.get("split_special_tokens", False))
        return {"input_ids": ids, "attention_mask": [1] * len(ids)}

    def encode(self, text, add_special_tokens: bool = True, **kwargs) -> list[int]:
        if kwargs:
            return self.full_tokenizer().encode(text, add_special_tokens=add_special_tokens, **kwargs)
        return self.tokenize(text, add_special_tokens, True)

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """llama.cpp's ``llama_vocab::impl::tokenize`` for an SPM vocabulary."""
        out: list[int] = []
        if add_special and self.add_bos_token:
            out.append(self.bos_token_id)
        prev_special = True
        for piece in self._partition(text, parse_special) if text else []:
            if isinstance(piece, int):
                out.append(piece)
                prev_special = True
                continue
            if self.add_space_prefix and prev_special:
                piece = " " + piece
            self._merge(piece.replace(" ", "\u2581"), out)
            prev_special = False
        if add_special and self.add_eos_token:
            out.append(self.eos_token_id)
        return out

    def _partition(self, text: str, parse_special: bool) -> list:
        """``tokenizer_st_partition``: text fragments (str) and special token ids (int)."""
        pieces: list = [text]
        for tid, tok, kind, rstrip in self._specials:
            if not parse_special and kind in (CONTROL, UNKNOWN):
                continue
            if not any(isinstance(p, str) and tok in p for p in pieces):
                continue
            cut: list = []
            for p in pieces:
                if isinstance(p, int) or tok not in p:
                    cut.append(p)
                    continue
                start = 0
                while True:
                    at = p.find(tok, start)
                    if at < 0:
                        if start < len(p):
                            cut.append(p[start:])
                        break
                    if at > start:
                        cut.append(p[start:at])
                    cut.append(tid)
                    start = at + len(tok)
                    if rstrip:
                        while start < len(p) and p[start] in C_SPACE:
                            start += 1
            pieces = cut
        return pieces

    def _merge(self, text: str, out: list[int]) -> None:
        """``llm_tokenizer_spm_session::tokenize`` on one fragment (spaces already "▁")."""
        n = len(text)
        if not n:
            return
        ids, scores = self.ids, self.scores
        start = list(range(n))
        size = [1] * n
        nxt = list(range(1, n)) + [-1]
        prev = list(range(-1, n - 1))
        heap: list = []

        def bigram(left: int, right: int) -> None:
            if left < 0 or right < 0:
                return
            t = ids.get(text[start[left]:start[right] + size[right]])
            if t is not None:
                heapq.heappush(heap, (-scores[t], left, right, size[left] + size[right]))

        for i in range(1, n):
            bigram(i - 1, i)
        while heap:
            _, left, right, total = heapq.heappop(heap)
            if not size[left] or not size[right] or size[left] + size[right] != total:
                continue  # a symbol of this pair was merged since it was queued
            size[left] += size[right]
            size[right] = 0
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prev[nxt[right]] = left
            bigram(prev[left], left)
            bigram(left, nxt[left])
        i = 0
        while i != -1:
            sym = text[start[i]:start[i] + size[i]]
            t = ids.get(sym)
            if t is not None:
                out.append(t)
            else:  # not a token (merges only ever make tokens): its bytes
                for b in sym.encode("utf-8"):
                    if self._bytes[b] is None:
                        from aios.errors import InvalidModelError

                        raise InvalidModelError(f"{self._path.name}'s vocabulary has no token for byte 0x{b:02X}.")
                    out.append(self._bytes[b])
            i = nxt[i]

    # -- decoding --
    def decode(self, token_ids, skip_special_tokens: bool = False, clean_up_tokenization_spaces: bool | None = None):
        if hasattr(token_ids, "tolist"):
            token_ids = token_ids.tolist()
        if isinstance(token_ids, dict):
            token_ids = token_ids["input_ids"]
        if isinstance(token_ids, (list, tuple)) and token_ids and isinstance(token_ids[0], (list, tuple)):
            return [self.decode(s, skip_special_tokens, clean_up_tokenization_spaces) for s in token_ids]
        ids = [int(token_ids)] if not isinstance(token_ids, (list, tuple)) else [int(i) for i in token_ids]
        skip = self._skipped() if skip_special_tokens else ()
        return self._decoder().decode([self.tokens[i] for i in ids if i not in skip])

    def batch_decode(self, sequences, skip_special_tokens: bool = False, clean_up_tokenization_spaces=None):
        return [self.decode(s, skip_special_tokens) for s in sequences]

    def _decoder(self):
        dec = self.__dict__.get("_dec")
        if dec is None:
            from tokenizers import decoders

            steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
            if self._strip_decoded:
                steps.append(decoders.Strip(content=" ", left=1))
            dec = self._dec = decoders.Sequence(steps)
        return dec

    # -- vocabulary and special tokens --
    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    def __bool__(self) -> bool:
        return True

    def __repr__(self) -> str:
        return f"SpmTokenizer({self._path.name!r}, {len(self)} tokens)"

    def get_vocab(self) -> dict[str, int]:
        return dict(self.ids)

    def convert_tokens_to_ids(self, tokens):
        if isinstance(tokens, str):
            return self.ids.get(tokens, self.unk_token_id)
        return [self.convert_tokens_to_ids(t) for t in tokens]

    def convert_ids_to_tokens(self, ids, skip_special_tokens: bool = False):
        if isinstance(ids, int):
            return self.tokens[ids]
        skip = self._skipped() if skip_special_tokens else ()
        return [self.tokens[int(i)] for i in ids if int(i) not in skip]

    def _named(self, i):
        return None if i is None or not 0 <= i < len(self.tokens) else self.tokens[i]

    @property
    def bos_token(self):
        return self._named(self.bos_token_id)

    @property
    def eos_token(self):
        return self._named(self.eos_token_id)

    @property
    def unk_token(self):
        return self._named(self.unk_token_id)

    @property
    def pad_token(self):
        return self._named(self.pad_token_id)

    @property
    def all_special_ids(self) -> list[int]:
        """The named special tokens (BOS, EOS, unknown, padding) the file gives."""
        return list(dict.fromkeys(i for i in (self.bos_token_id, self.eos_token_id, self.unk_token_id,
                                              self.pad_token_id) if i is not None and 0 <= i < len(self.tokens)))

    def _skipped(self) -> set[int]:
        """What ``skip_special_tokens`` drops: the named tokens and every control token (the
        ones transformers adds as special)."""
        skip = self.__dict__.get("_skip")
        if skip is None:
            skip = self._skip = set(self.all_special_ids) | {i for i, k in enumerate(self.types) if k == CONTROL}
        return skip

    @property
    def all_special_tokens(self) -> list[str]:
        return [self.tokens[i] for i in self.all_special_ids]

    # -- the transformers tokenizer, for anything not mirrored here --
    def full_tokenizer(self):
        """The transformers tokenizer of the same GGUF (imports transformers; loaded once)."""
        if self._full is None:
            from aios.models import gguf_tokenizer

            self._full = gguf_tokenizer.load_gguf_tokenizer(self._path)
        return self._full

    @property
    def special_tokens_map(self) -> dict[str, str]:
        """The named special tokens a chat template sees (bos_token, ...), as transformers passes them."""
        named = (("bos_token", self.bos_token), ("eos_token", self.eos_token), ("unk_token", self.unk_token),
                 ("pad_token", self.pad_token))
        return {k: v for k, v in named if v is not None}

    def apply_chat_template(self, *args, **kwargs):
        return chat_render.apply_chat_template(self, *args, **kwargs)

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.full_tokenizer(), name)
