"""GGUFStore: metadata parsed fast, tensors read row by row as gguf-py dequantizes them."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import dequantize

from aios.models.aliases import FIXTURES_DIR
from aios.models.tensors import GGUFStore
from convert.gguf import GGUFExportConfig, export_gguf


@pytest.fixture(scope="module")
def q4_k(tmp_path_factory):
    out = tmp_path_factory.mktemp("store") / "tiny-falcon.q4_k.gguf"
    export_gguf(str(FIXTURES_DIR / "tiny-falcon"), out, GGUFExportConfig("q4_k"))  # Q4_K down, Q5_0/Q8_0... fallbacks
    return out


def test_rows_equal_the_whole_tensor_dequantized_in_every_stored_type(q4_k):
    store = GGUFStore(q4_k)
    kinds = set()
    for t in store.reader.tensors:
        if len(t.shape) != 2:
            continue
        whole = dequantize(t.data, t.tensor_type).reshape(int(t.shape[1]), int(t.shape[0]))
        for a, b in ((0, 1), (3, 17), (0, len(whole)), (len(whole) - 5, len(whole))):
            rows = store.get_rows(t.name, a, b)
            assert rows.dtype == np.float32 and rows.shape == (b - a, whole.shape[1])
            np.testing.assert_array_equal(rows, whole[a:b])
        kinds.add(t.tensor_type.name)
    assert "Q4_K" in kinds and len(kinds) >= 2  # a block type with rows of super-blocks, and another


def test_metadata_and_tensors_are_views_of_the_file(q4_k):
    store = GGUFStore(q4_k)
    assert len(store.field("tokenizer.ggml.tokens")) == 2048
    t = store.reader.tensors[0]
    assert np.shares_memory(np.asarray(t.data), store.reader.data)  # not a copy
    with pytest.raises(KeyError):
        store.get_rows("no.such.tensor", 0, 1)
