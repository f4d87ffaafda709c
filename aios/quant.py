"""The single quant vocabulary: our type spellings, gguf-py's type enum and block geometry.

gguf-py is the reference for what a GGUF tensor type is: ``gguf.GGMLQuantizationType``
names it and ``gguf.GGML_QUANT_SIZES`` gives its block (values per block, bytes per block),
the same numbers llama.cpp's readers use. Everything in this project that needs a block
size, a bytes-per-block or the enum for a type asks here, so no module carries its own copy
of those numbers and they cannot drift from the files we write and read.

Spellings: our CLI options and metadata name types in lower case (``"q4_k"``, the outtype
strings written into files; they stay as they are), gguf-py in upper case (``Q4_K``).
:func:`qtype` accepts either (or the enum itself) and is the one place they are converted.

Lowest layer: depends on gguf and nothing else in the project.
"""

from __future__ import annotations

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.constants import QK_K

__all__ = ["QK_K", "GGMLQuantizationType", "QType", "UnknownQuantTypeError", "block_size",
           "outtype_name", "qtype", "row_bytes", "type_size"]

QType = GGMLQuantizationType | str  # the enum, or its name in either case ("q4_k", "Q4_K")


class UnknownQuantTypeError(KeyError):
    """A type name gguf-py does not know (a ``KeyError``, as the enum lookup it replaces)."""

    def __str__(self) -> str:  # KeyError would quote the whole sentence
        return str(self.args[0])


def qtype(t: QType) -> GGMLQuantizationType:
    """The gguf-py enum member for ``t``: the member itself, or its name in any case."""
    if isinstance(t, GGMLQuantizationType):
        return t
    try:
        return GGMLQuantizationType[t.upper()]
    except (KeyError, AttributeError):
        raise UnknownQuantTypeError(f"Unknown GGML tensor type {t!r}: not a member of gguf-py's "
                                    "GGMLQuantizationType.") from None


def outtype_name(t: QType) -> str:
    """Our lower-case spelling of ``t`` (``"q4_k"``), as CLI options and metadata write it."""
    return qtype(t).name.lower()


def block_size(t: QType) -> int:
    """Values per block of ``t`` (1 for the plain float types)."""
    return GGML_QUANT_SIZES[qtype(t)][0]


def type_size(t: QType) -> int:
    """Bytes per block of ``t``, scales included."""
    return GGML_QUANT_SIZES[qtype(t)][1]


def row_bytes(t: QType, n: int) -> int:
    """Bytes a row of ``n`` values takes in ``t``; ``n`` must be a whole number of blocks."""
    block, size = GGML_QUANT_SIZES[qtype(t)]
    if n % block:
        raise ValueError(f"a row of {n} values is not a whole number of {qtype(t).name} blocks "
                         f"({block})")
    return n // block * size
