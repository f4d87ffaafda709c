"""Our GGUF reader (aios.models.gguf_reader) parses metadata as gguf-py's does: the same fields,
parts, types and data indices, with long arrays kept lazy."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from aios.models.gguf_reader import LazyParts, reader_class, scalar_array, string_array


def _write(path, n=300):
    w = gguf.GGUFWriter(str(path), "llama")
    rng = np.random.default_rng(0)
    w.add_array("t.tokens", ["", "a", "ü€", "<bos>"] + [f"tok{i}" * (i % 5) for i in range(n)])
    w.add_array("t.scores", [float(x) for x in rng.standard_normal(n)])
    w.add_array("t.types", [int(x) for x in rng.integers(0, 6, n)])
    w.add_array("t.flags", [bool(x) for x in rng.integers(0, 2, n)])
    w.add_array("t.short", [1, 2, 3])  # below the bulk path's length: gguf-py's own walk
    w.add_array("t.empty", [])
    w.add_uint32("t.scalar", 7)
    w.add_string("t.name", "x")
    w.add_tensor("w", np.ones((4, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _same(a, b):
    assert list(a.fields) == list(b.fields)
    for k in a.fields:
        fa, fb = a.fields[k], b.fields[k]
        assert (fa.types, list(fa.data), fa.offset, len(fa.parts)) == (fb.types, fb.data, fb.offset, len(fb.parts)), k
        for x, y in zip(fa.parts, fb.parts):
            assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes(), k
    assert [t.name for t in a.tensors] == [t.name for t in b.tensors]


def test_bulk_arrays_equal_gguf_py(tmp_path):
    path = _write(tmp_path / "m.gguf")
    ours, ref = reader_class()(str(path), "r"), gguf.GGUFReader(str(path), "r")
    _same(ours, ref)
    assert ours.fields["t.tokens"].contents()[:4] == ["", "a", "ü€", "<bos>"]
    for k in ("t.tokens", "t.scores", "t.types", "t.flags"):
        assert isinstance(ours.fields[k].parts, LazyParts), k  # the long arrays stayed lazy
        assert ours.fields[k].contents() == ref.fields[k].contents(), k
        assert ours.fields[k].contents(7) == ref.fields[k].contents(7), k
        assert ours.fields[k].contents(slice(3, 9)) == ref.fields[k].contents(slice(3, 9)), k
    assert string_array(ours.fields["t.tokens"]) == string_array(ref.fields["t.tokens"]) == ref.fields["t.tokens"].contents()
    for k in ("t.scores", "t.types", "t.flags", "t.short"):
        a, b = scalar_array(ours.fields[k]), scalar_array(ref.fields[k])
        assert a.dtype == b.dtype and a.tolist() == b.tolist() == ref.fields[k].contents(), k


def test_lazy_parts_index_as_a_list(tmp_path):
    path = _write(tmp_path / "m.gguf")
    ours, ref = reader_class()(str(path), "r"), gguf.GGUFReader(str(path), "r")
    for k in ("t.tokens", "t.scores"):
        lazy, parts = ours.fields[k].parts, ref.fields[k].parts
        for i in (0, 4, 5, 6, -1, -2, len(parts) - 3):
            assert lazy[i].tobytes() == parts[i].tobytes() and lazy[i].dtype == parts[i].dtype, (k, i)
        assert [x.tobytes() for x in lazy[2:11:3]] == [x.tobytes() for x in parts[2:11:3]]
        assert [x.tobytes() for x in lazy] == [x.tobytes() for x in parts]
        for bad in (len(parts), -len(parts) - 1):
            with pytest.raises(IndexError):
                lazy[bad]
    with pytest.raises(TypeError):
        ours.fields["t.tokens"].parts.values()
    with pytest.raises(TypeError):
        ours.fields["t.scores"].parts.strings()


@pytest.mark.parametrize("cut", [0.3, 0.6])
def test_truncated_arrays_fail_as_gguf_py_fails(tmp_path, cut):
    path = _write(tmp_path / "m.gguf")
    data = path.read_bytes()
    bad = tmp_path / "cut.gguf"
    bad.write_bytes(data[: int(len(data) * cut)])
    outcomes = []
    for make in (reader_class(), gguf.GGUFReader):
        try:
            outcomes.append(("ok", make(str(bad), "r")))
        except Exception as e:  # noqa: BLE001 - whatever gguf-py raises, ours must raise too
            outcomes.append((type(e), None))
    assert outcomes[0][0] == outcomes[1][0]
    if outcomes[0][0] == "ok":
        _same(outcomes[0][1], outcomes[1][1])
