"""What each tensor type the runtime runs has and takes, one row per type (llama.cpp's
``type_traits[GGML_TYPE_…]``): its block geometry (gguf-py's table, through aios.quant), the
facts about its quants that the kernels branch on, the activation blocks its int8 dot takes,
the names of its kernels (``runtime.kernels.<name>``) and the many-token tile forms it runs in.

The kernel modules derive their type tuples and sets from this table (``names``): ``B32``,
``KQ_TYPES``, ``KQ_INT``, ``TILE_TYPES``, ``ROW_TYPES``, ``GGML_KQ_TYPES`` ... . A tuple's order
is the run-time ``kind`` integer its compiled kernel branches on (``B32_KIND = {fmt: i for i, fmt
in enumerate(B32)}``), so the row order is fixed: the row order within a family is the ``kind``
of the float kernels (``mm_b32``, ``mm_kq``) and of the sparse kernel (``SPARSE_B``); where
another kernel numbers the types otherwise the row gives its ``kind`` (``int8_kind``,
``ggml_kind``). The codegen of the kernels (their ``intrinsic`` typers) reads these facts when
numba compiles, so runtime.sources_key hashes this file with the compiled sources. Pure data:
no numba here. What is one kernel's own detail (a field's byte offset inside a block, which load
a codegen measured faster) stays in that kernel's module.

Adding a type: its row here, then its kernel code in the family's modules (docs/design.md, "How
to add a tensor type"); tests/runtime/test_type_traits.py checks every name a row gives exists.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

from aios.quant import block_size, qtype, type_size

Family = Literal["float", "b32", "kq"]
FAMILIES = ("float", "b32", "kq")  # element types; 32-value blocks; 256-value super-blocks
# the many-token int8 tiles: kq_tiles' lane layout, row_tiles, kq_row_tiles, amx
TILE_FORMS = ("lanes", "rows", "kq_rows", "amx")


@dataclass(frozen=True)
class TypeTraits:
    """One tensor type: gguf-py's name, what its quants are, and the kernels that run it."""

    gguf: str  # gguf-py's GGMLQuantizationType name ("Q4_0"); ``name`` is our spelling ("q4_0")
    family: Family
    signed: bool = False  # quants stored signed (Q8_0; IQ4_NL's and IQ4_XS's table values)
    affine: bool = False  # a minimum per (sub-)block: value = d·q − m
    offset: int = 0  # subtracted from the stored unsigned quants (Q4_0: q − 8)
    subblocks: int = 1  # scales per block, each over ``scale_values`` values
    activations: str | None = None  # its int8 dot's activation blocks: q8_0, q8_1, q8_k; None: none
    int8_kind: int | None = None  # the run-time kind of its int8 kernel (mm_b32_int8 / mm_kq_int8)
    blockwise: bool = False  # its int8 kernel sums as ggml's does, bit for bit (blocks32.BLOCKWISE)
    tiles: tuple[str, ...] = ()  # the many-token int8 tile forms it takes (TILE_FORMS)
    ggml_kind: int | None = None  # its kind among ggml_order's llama.cpp-order kernels; None: none
    block_values: int = field(init=False)  # values per block (1 for the float types)
    block_bytes: int = field(init=False)  # bytes per block, scales included

    def __post_init__(self) -> None:
        object.__setattr__(self, "block_values", block_size(self.gguf))
        object.__setattr__(self, "block_bytes", type_size(self.gguf))
        assert self.family in FAMILIES and set(self.tiles) <= set(TILE_FORMS), self
        assert (self.activations is None) == (self.int8_kind is None), self
        assert self.signed + self.affine + bool(self.offset) <= 1, self  # one way to sign quants

    @property
    def name(self) -> str:
        """Our lower-case spelling, the kernels' key ("q4_0")."""
        return self.gguf.lower()

    @property
    def scale_values(self) -> int:
        """Values sharing one scale (a sub-block): the tiles' G, the float path's values per Σx."""
        return self.block_values // self.subblocks

    @property
    def dot(self) -> str:
        """The float kernel's dot product of several rows with float activations."""
        return f"dot8_{self.name}" if self.family == "float" else f"dot4_{self.name}"

    @property
    def int8_dot(self) -> str | None:
        """The int8 kernel's dot product with int8 activation blocks; None: float only."""
        return None if self.activations is None else f"dot4i_{self.name}"

    @property
    def sparse_rows(self) -> str:
        """y = Σ a[j]·row_j over active rows (the sparse down projection)."""
        return f"sparse_rows_{self.name}"

    @property
    def axpy(self) -> str:
        """The decoder the sparse kernel adds each row with (also the block types' row decoder)."""
        return f"axpy4_{self.name}" if self.family == "float" else f"axpy_{self.name}"

    @property
    def kernels(self) -> tuple[str, ...]:
        """Every kernel name the row gives, each a ``runtime.kernels`` attribute."""
        return tuple(n for n in (self.dot, self.int8_dot, self.sparse_rows, self.axpy) if n)


_B32_TILES = ("lanes", "amx")  # the 32-value types that tile; the signed ones also take row tiles
_KQ_TILES = ("lanes", "kq_rows", "amx")
_SIGNED_B32_TILES = _B32_TILES + ("rows",)

_ROWS = (  # order within a family: the float kernels' and the sparse kernel's ``kind``
    TypeTraits("F32", "float"),
    TypeTraits("F16", "float"),
    TypeTraits("BF16", "float"),
    TypeTraits("Q8_0", "b32", signed=True, activations="q8_0", int8_kind=0, blockwise=True,
               tiles=_SIGNED_B32_TILES, ggml_kind=0),
    TypeTraits("Q4_0", "b32", offset=8, activations="q8_0", int8_kind=1,
               tiles=_SIGNED_B32_TILES, ggml_kind=1),
    TypeTraits("Q4_1", "b32", affine=True, activations="q8_1", int8_kind=2, tiles=_B32_TILES),
    TypeTraits("Q5_0", "b32", offset=16, activations="q8_0", int8_kind=3,
               tiles=_SIGNED_B32_TILES, ggml_kind=2),
    TypeTraits("Q5_1", "b32", affine=True, activations="q8_1", int8_kind=4, tiles=_B32_TILES),
    # many tokens of IQ4_NL (and of the K-quants without tiles): the float32 GEMM (kernels.gemm)
    TypeTraits("IQ4_NL", "b32", signed=True, activations="q8_0", int8_kind=5),
    TypeTraits("Q2_K", "kq", affine=True, subblocks=16, activations="q8_k", int8_kind=4),
    TypeTraits("Q3_K", "kq", offset=4, subblocks=16, activations="q8_k", int8_kind=5),
    TypeTraits("Q4_K", "kq", affine=True, subblocks=8, activations="q8_k", int8_kind=0,
               tiles=_KQ_TILES, ggml_kind=0),
    TypeTraits("Q5_K", "kq", affine=True, subblocks=8, activations="q8_k", int8_kind=1,
               tiles=_KQ_TILES, ggml_kind=2),
    TypeTraits("Q6_K", "kq", offset=32, subblocks=16, activations="q8_k", int8_kind=2,
               tiles=_KQ_TILES, ggml_kind=1),
    TypeTraits("IQ4_XS", "kq", signed=True, subblocks=8, activations="q8_k", int8_kind=3),
)
TYPE_TRAITS = MappingProxyType({t.name: t for t in _ROWS})  # our name -> its row, in row order


def names(family: str | tuple[str, ...] | None = None, *, tile: str | None = None,
          where: Callable[[TypeTraits], bool] | None = None,
          by: str | None = None) -> tuple[str, ...]:
    """Our names of the rows of ``family`` (one or several) that take the tile form ``tile`` and
    meet ``where``, in row order; with ``by`` ("int8_kind", "ggml_kind") only the rows that have
    that kind, family by family in the order of their kinds (a family's kinds are 0, 1, ...)."""
    fams = (family,) if isinstance(family, str) else family
    rows = [t for t in _ROWS if (fams is None or t.family in fams)
            and (tile is None or tile in t.tiles) and (where is None or where(t))]
    if by is not None:
        rows = sorted((t for t in rows if getattr(t, by) is not None),
                      key=lambda t: (FAMILIES.index(t.family), getattr(t, by)))
        for f in FAMILIES:
            kinds = [getattr(t, by) for t in rows if t.family == f]
            assert kinds == list(range(len(kinds))), (by, f, kinds)
    return tuple(t.name for t in rows)


# gguf-py's names of every type the runtime runs, as runtime.weights.SUPPORTED_TYPES lists them:
# the families in FAMILIES' order, each in gguf-py's enum order (GGMLQuantizationType's values)
GGUF_TYPES = tuple(t.gguf for t in sorted(_ROWS, key=lambda t: (FAMILIES.index(t.family),
                                                                  qtype(t.gguf).value)))
