"""runtime.kernels.type_traits: one row per tensor type the runtime runs, and every type tuple of
the kernel modules derived from it in exactly the order the compiled kernels number their kinds."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

import runtime
from runtime import kernels as K
from runtime import weights
from runtime.kernels import (
    amx,
    dispatch,
    ggml_order,
    kq_lanes,
    kq_row_tiles,
    row_tiles,
    sparse,
    type_traits,
)
from runtime.kernels.type_traits import GGUF_TYPES, TYPE_TRAITS, TypeTraits, names

ROWS = list(TYPE_TRAITS.values())

# The values the modules held as literals before the table (tuple order = the numba ``kind`` of
# their kernels: a changed order changes compiled dispatch)
B32 = ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl")
KQ = ("q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_xs")
TODAY = {
    (K, "B32"): B32,
    (K, "B32_BYTES"): {"q8_0": 34, "q4_0": 18, "q4_1": 20, "q5_0": 22, "q5_1": 24, "iq4_nl": 18},
    (K, "B32_QS"): {"q8_0": 2, "q4_0": 2, "q4_1": 4, "q5_0": 6, "q5_1": 8, "iq4_nl": 2},
    (K, "B32_AFFINE"): {"q4_1", "q5_1"},
    (K, "B32_OFFSET"): {"q4_0": 8, "q5_0": 16},
    (K, "B32_SIGNED"): {"q8_0", "iq4_nl"},
    (K, "BLOCKWISE"): ("q8_0",),
    (K, "AFFINE_B32"): frozenset({"q4_1", "q5_1"}),
    (K, "QUAD_INSERT"): {"q5_0", "q5_1"},
    (K, "B32_KIND"): {t: i for i, t in enumerate(B32)},
    (K, "KQ_TYPES"): KQ,
    (K, "KQ_BYTES"): {"q2_k": 84, "q3_k": 110, "q4_k": 144, "q5_k": 176, "q6_k": 210, "iq4_xs": 136},
    (K, "KQ_KIND"): {t: i for i, t in enumerate(KQ)},
    (K, "KQ_XSUM"): {"q2_k": 16, "q4_k": 32, "q5_k": 32},
    (K, "KQ_INT"): ("q4_k", "q5_k", "q6_k", "iq4_xs", "q2_k", "q3_k"),
    (K, "KQ_INT_KIND"): {"q4_k": 0, "q5_k": 1, "q6_k": 2, "iq4_xs": 3, "q2_k": 4, "q3_k": 5},
    (dispatch, "INT8_TYPES"): B32,
    (dispatch, "INT8_ALL"): B32 + ("q4_k", "q5_k", "q6_k", "iq4_xs", "q2_k", "q3_k"),
    (dispatch, "INT8_DEFAULT"): frozenset(B32 + KQ),
    (dispatch, "BLOCK_TYPES"): B32 + KQ,
    (sparse, "SPARSE_B"): B32 + KQ,
    (sparse, "SPARSE_B_KIND"): {t: i for i, t in enumerate(B32 + KQ)},
    (kq_lanes, "KQ_TILES"): ("q4_k", "q5_k", "q6_k"),
    (kq_lanes, "B32_TILES"): ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1"),
    (kq_lanes, "TILE_TYPES"): ("q4_k", "q5_k", "q6_k", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1"),
    (kq_lanes, "TILE_KIND"): {"q4_k": 0, "q5_k": 1, "q6_k": 2, "q8_0": 3, "q4_0": 4, "q4_1": 5, "q5_0": 6, "q5_1": 7},
    (kq_lanes, "LANE_VALUES"): {"q4_k": 32, "q5_k": 32, "q6_k": 16, "q8_0": 32, "q4_0": 32, "q4_1": 32,
                                "q5_0": 32, "q5_1": 32},
    (kq_lanes, "TILE_BYTES"): {"q2_k": 84, "q3_k": 110, "q4_k": 144, "q5_k": 176, "q6_k": 210, "iq4_xs": 136,
                               "q8_0": 34, "q4_0": 18, "q4_1": 20, "q5_0": 22, "q5_1": 24, "iq4_nl": 18},
    (kq_lanes, "SIGNED"): frozenset({"q6_k", "q8_0", "q4_0", "q5_0"}),
    (amx, "AMX_TYPES"): ("q4_k", "q5_k", "q6_k", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1"),
    (kq_row_tiles, "KQ_ROW_TYPES"): ("q4_k", "q5_k", "q6_k"),
    (kq_row_tiles, "KQ_ROW_KIND"): {"q4_k": 0, "q5_k": 1, "q6_k": 2},
    (kq_row_tiles, "SUBBLOCKS"): (8, 8, 16),
    (row_tiles, "ROW_TYPES"): ("q8_0", "q4_0", "q5_0"),
    (ggml_order, "GGML_KQ_TYPES"): ("q4_k", "q6_k", "q5_k"),
    (ggml_order, "GGML_KQ_KIND"): {"q4_k": 0, "q6_k": 1, "q5_k": 2},
    (ggml_order, "GGML_B32_TYPES"): ("q8_0", "q4_0", "q5_0"),
    (ggml_order, "GGML_B32_KIND"): {"q8_0": 0, "q4_0": 1, "q5_0": 2},
    (weights, "SUPPORTED_TYPES"): ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "IQ4_NL",
                                   "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS"),
    (weights, "BLOCK_TYPES"): ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "IQ4_NL",
                               "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS"),
    (weights, "KQUANT_TYPES"): ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS"),
}


@pytest.mark.parametrize(("module", "name"), list(TODAY), ids=lambda v: getattr(v, "__name__", v))
def test_every_derived_constant_is_todays_value_in_todays_order(module, name):
    value, today = getattr(module, name), TODAY[module, name]
    assert type(value) is type(today) and value == today, (name, value)
    if isinstance(today, (tuple, dict)):  # order: the kinds the compiled kernels branch on
        assert list(value.items() if isinstance(today, dict) else value) == list(
            today.items() if isinstance(today, dict) else today), name


def test_sparse_block_values():
    assert sparse.SPARSE_B_VALUES.dtype == np.int64
    assert sparse.SPARSE_B_VALUES.tolist() == [32] * 6 + [256] * 6


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.gguf)
def test_a_rows_block_is_gguf_pys(row: TypeTraits):
    t = gguf.GGMLQuantizationType[row.gguf]
    assert (row.block_values, row.block_bytes) == gguf.GGML_QUANT_SIZES[t]
    assert row.name == row.gguf.lower() and TYPE_TRAITS[row.name] is row
    assert row.block_values % row.subblocks == 0
    assert (row.family == "float") == (row.block_values == 1)
    assert row.block_values == {"float": 1, "b32": 32, "kq": gguf.constants.QK_K}[row.family]


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.gguf)
def test_every_kernel_a_row_names_exists(row: TypeTraits):
    assert row.kernels, row
    for name in row.kernels:
        assert name in K.__all__ and callable(getattr(K, name)), (row.gguf, name)
    if row.family != "float":  # the block types' sparse kernels, by our name
        assert K.SPARSE_BLOCK_ROWS[row.name] is getattr(K, row.sparse_rows)


@pytest.mark.parametrize("row", [r for r in ROWS if r.activations], ids=lambda r: r.gguf)
def test_int8_activation_blocks_fit_the_weights_blocks(row: TypeTraits):
    """An int8 dot meets one weight block with activation blocks of the same length: Q8_0/Q8_1
    for the 32-value types (Q8_1, with its block sums, where the weights are affine), Q8_K for
    the K-quants."""
    assert gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[row.activations.upper()]][0] == row.block_values
    assert row.activations == ("q8_k" if row.family == "kq" else "q8_1" if row.affine else "q8_0")


def test_the_table_covers_exactly_the_supported_types():
    assert weights.SUPPORTED_TYPES == GGUF_TYPES
    assert set(weights.SUPPORTED_TYPES) == {r.gguf for r in ROWS} == set(weights.KERNELS)
    assert len(ROWS) == len(set(GGUF_TYPES))
    assert weights.BLOCK_TYPES == tuple(t for t in GGUF_TYPES if TYPE_TRAITS[t.lower()].family != "float")
    assert {t.upper() for t in dispatch.BLOCK_TYPES} == set(weights.BLOCK_TYPES)


def test_kinds_and_tiles_are_consistent():
    # the 32-value int8 kernel takes mm_b32's kinds; every int8 row takes part in int8 arithmetic
    assert names("b32", by="int8_kind") == names("b32")
    assert set(names(where=lambda t: t.int8_kind is not None)) == dispatch.INT8_DEFAULT
    # the tile forms: AMX and the row tiles reuse the lane layout's unpackers
    for row in ROWS:
        assert not row.tiles or "lanes" in row.tiles, row
        assert ("rows" in row.tiles) <= (row.family == "b32" and not row.affine), row
        assert ("kq_rows" in row.tiles) <= (row.family == "kq"), row
    assert K.TYPE_TRAITS is type_traits.TYPE_TRAITS


def test_the_numba_cache_key_hashes_the_table():
    """The kernels' codegen reads these rows: an edit to them must start a fresh numba cache."""
    data = Path(type_traits.__file__).read_bytes()
    assert any(m in data for m in runtime.COMPILED_MARKERS)
