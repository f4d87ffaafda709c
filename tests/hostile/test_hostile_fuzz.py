"""Bounded fuzzing of every reader that takes untrusted bytes: any input gives a result or our
documented clean error (an AiosError, exit 4), never another exception, a hang or a huge allocation.

Seeds are our own artifacts (a GGUF with strings and arrays, the fixtures' safetensors header, a
real R5 manifest, a sparsity map, a check report). Example counts come from the hypothesis profile
(tests/conftest.py): "ci" by default, derandomized; ``benchmarks/fuzz_long.py`` runs them long.
"""

from __future__ import annotations

import io
import json
import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aios.errors import AiosError
from aios.models import resolve_model
from aios.models.aliases import FIXTURES_DIR

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                      HealthCheck.too_slow, HealthCheck.data_too_large])
INTERESTING = [0, 1, 2, 3, 7, 8, 9, 12, 13, 31, 32, 255, 2**31 - 1, 2**31, 2**32 - 1, 2**32,
               2**40, 2**62, 2**63 - 1, 2**63, 2**64 - 1]
u64 = st.sampled_from(INTERESTING) | st.integers(0, 2**64 - 1)


def write_seed_gguf(path: Path) -> Path:
    """A small falcon GGUF the runtime runs, with string, array and nested-array metadata."""
    import gguf

    from tests.conftest import write_gguf

    write_gguf(path, activation="relu")
    r = gguf.GGUFReader(str(path))
    w = gguf.GGUFWriter(str(path) + ".tmp", "falcon")
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        w.add_key_value(key, f.contents(), gguf.GGUFValueType(f.types[0]))
    w.add_array("aios.fuzz.tokens", ["a", "bc", "def"])
    w.add_array("aios.fuzz.ints", [1, 2, 3])
    w.add_float32("falcon.attention.layer_norm_epsilon", 1e-5)
    w.add_string("aios.alias.groups", json.dumps([]))
    for t in r.tensors:
        w.add_tensor(t.name, np.array(t.data).reshape(tuple(reversed(t.shape.tolist()))))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    Path(str(path) + ".tmp").replace(path)
    return path


@pytest.fixture(scope="module")
def seed_gguf(tmp_path_factory) -> bytes:
    return write_seed_gguf(tmp_path_factory.mktemp("seed") / "seed.gguf").read_bytes()


def _header_end(data: bytes) -> int:
    """Where tensor data starts (the mutations below aim at the header)."""
    import tempfile

    import gguf

    with tempfile.NamedTemporaryFile(suffix=".gguf") as f:
        f.write(data)
        f.flush()
        r = gguf.GGUFReader(f.name)
        return min(t.data_offset for t in r.tensors)


def run_everything_on(path: Path) -> None:
    """Every consumer of a GGUF: resolution, metadata, tensors, the runtime. Clean errors only."""
    from runtime.model import Model

    try:
        h = resolve_model(str(path))
        h.store.metadata()  # type: ignore[union-attr]
        for t in h.tensor_inventory()[:4]:
            h.tensor(t.name)
    except AiosError:
        pass
    try:
        m = Model(path, n_ctx=8, arithmetic="float")
        m.forward([1, 2])
    except AiosError:
        pass


@settings(**SETTINGS)
@given(st.data())
def test_gguf_header_fields(tmp_path, seed_gguf, data):
    """Integers of width 1/4/8 written anywhere in the header: lengths, counts, types, dims, offsets."""
    buf = bytearray(seed_gguf)
    end = _HEADER_END.setdefault(len(seed_gguf), _header_end(seed_gguf))
    for _ in range(data.draw(st.integers(1, 4))):
        width = data.draw(st.sampled_from([1, 4, 8]))
        pos = data.draw(st.integers(4, end - width))
        value = data.draw(u64) % (1 << (8 * width))
        buf[pos:pos + width] = value.to_bytes(width, "little")
    p = tmp_path / "h.gguf"
    p.write_bytes(bytes(buf))
    run_everything_on(p)


_HEADER_END: dict[int, int] = {}


@settings(**SETTINGS)
@given(st.binary(min_size=0, max_size=64), st.integers(0, 100))
def test_gguf_truncated_and_spliced(tmp_path, seed_gguf, junk, cut_pct):
    buf = seed_gguf[: len(seed_gguf) * cut_pct // 100] + junk
    p = tmp_path / "t.gguf"
    p.write_bytes(buf)
    run_everything_on(p)


# --- safetensors: structured headers ----------------------------------------------------------

dtypes = st.sampled_from(["F32", "F16", "BF16", "I8", "U8", "BOOL", "F64", "X9", ""])
shapes = st.lists(st.sampled_from([0, 1, 2, 3, 64, 2**20, 2**32, 2**62]) | st.integers(-3, 10), max_size=4)
offsets = st.lists(u64 | st.integers(-5, 5), min_size=0, max_size=3)


@pytest.fixture(scope="module")
def falcon_config() -> bytes:
    return (FIXTURES_DIR / "tiny-falcon" / "config.json").read_bytes()


@settings(**SETTINGS)
@given(st.dictionaries(st.sampled_from(["transformer.word_embeddings.weight", "a", "b", "__metadata__"]),
                       st.fixed_dictionaries({"dtype": dtypes, "shape": shapes, "data_offsets": offsets}),
                       max_size=3),
       st.integers(0, 256), st.sampled_from([None, 0, 2**63, 2**64 - 1]))
def test_safetensors_structured_header(tmp_path, falcon_config, header, n_data, declared):
    raw = json.dumps(header).encode()
    n = len(raw) if declared is None else declared
    folder = tmp_path / "m"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_bytes(falcon_config)
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", n) + raw + b"\0" * n_data)
    try:
        h = resolve_model(str(folder))
        for t in h.tensor_inventory():
            h.tensor(t.name)
    except AiosError:
        pass


# --- R5 manifests --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def manifest_gguf(tmp_path_factory):
    path = write_seed_gguf(tmp_path_factory.mktemp("r5") / "m.gguf")
    import gguf

    r = gguf.GGUFReader(str(path))
    real = {"aios_contract_version": "1.0", "frequency_ordered": True,
            "layout": [{"block_id": t.name, "access_frequency": "high", "rws_tier": "HOT",
                        "offset_bytes": int(t.data_offset), "size_bytes": int(t.n_bytes)} for t in r.tensors]}
    return path, json.dumps(real)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=12),
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=16), c, max_size=4), max_leaves=16)


@settings(**SETTINGS)
@given(st.data())
def test_r5_manifest_sidecar(tmp_path, manifest_gguf, data):
    """A hostile sidecar manifest: R5 reports fail (or pass), it never raises."""
    from contract.checks import r5_layout
    from contract.checks.base import CheckContext
    from contract.result import Status

    path, real = manifest_gguf
    choice = data.draw(st.sampled_from(["mutate", "json", "bytes"]))
    if choice == "mutate":
        raw = bytearray(real.encode())
        for _ in range(data.draw(st.integers(1, 6))):
            raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.sampled_from(b'0123456789",:{}[]-eE.x '))
        raw = bytes(raw)
    elif choice == "json":
        doc = json.loads(real)
        doc[data.draw(st.sampled_from(list(doc) + ["extra"]))] = data.draw(json_values)
        raw = json.dumps(doc).encode()
    else:
        raw = data.draw(st.binary(max_size=300))
    folder = tmp_path / "f"
    folder.mkdir(exist_ok=True)
    (folder / "m.gguf").write_bytes(path.read_bytes())
    (folder / "aios_manifest.json").write_bytes(raw)
    res = r5_layout.check(resolve_model(str(folder / "m.gguf")), CheckContext(calibration_texts=["x"]))
    assert res.status in (Status.passed, Status.failed)


# --- sparsity-map sidecars --------------------------------------------------------------------


def _npz(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        for k, v in members.items():
            z.writestr(k, v)
    return buf.getvalue()


def _npy(a) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.asarray(a), allow_pickle=False)
    return buf.getvalue()


@pytest.fixture(scope="module")
def seed_map(tmp_path_factory) -> bytes:
    from convert.sparsity_map import write_sparsity_map

    p = write_sparsity_map(tmp_path_factory.mktemp("map") / "m.npz", np.ones((2, 64), bool), {"mode": "x"})
    return p.read_bytes()


def _read_map(p: Path) -> None:
    from convert.gguf.sparsity import check_masks, load_sparsity_map, sparsity_map_header

    for fn in (load_sparsity_map, sparsity_map_header):
        try:
            out = fn(p)
            if fn is load_sparsity_map:
                check_masks(out, 2, 64, str(p))
        except AiosError:
            pass


@settings(**SETTINGS)
@given(st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=8), st.integers(1, 100))
def test_sparsity_map_bytes(tmp_path, seed_map, flips, cut_pct):
    buf = bytearray(seed_map)
    for pos, val in flips:
        buf[pos % len(buf)] = val
    p = tmp_path / "m.npz"
    p.write_bytes(bytes(buf[: max(1, len(buf) * cut_pct // 100)]))
    _read_map(p)


arrays = st.one_of(
    st.builds(lambda n, d: np.zeros(n, d), st.integers(0, 70), st.sampled_from([bool, np.int8, np.int64, np.float32])),
    st.builds(lambda n: np.arange(n).reshape(-1, 1), st.integers(0, 5)),
    st.just(np.array("not json")), st.just(np.array('{"a": 1}')), st.just(np.array([[1, 2]], np.uint8)),
)


@settings(**SETTINGS)
@given(st.dictionaries(st.sampled_from(["layer_0", "layer_1", "layer_99", "layer_x", "header", "other"]),
                       arrays, max_size=4),
       st.sampled_from([None, 2**40, 2**20]))
def test_sparsity_map_arrays(tmp_path, members, huge_shape):
    raw = {f"{k}.npy": _npy(v) for k, v in members.items()}
    if huge_shape:  # an array header declaring far more entries than it stores
        hdr = "{'descr': '|b1', 'fortran_order': False, 'shape': (%d,), }" % huge_shape
        hdr = hdr.ljust(117) + "\n"
        raw["layer_0.npy"] = b"\x93NUMPY\x01\x00" + len(hdr).to_bytes(2, "little") + hdr.encode() + b"\x01" * 8
    p = tmp_path / "m.npz"
    p.write_bytes(_npz(raw))
    _read_map(p)


# --- reports, calibration texts, configs ---------------------------------------------------------


@pytest.fixture(scope="module")
def seed_report(tmp_path_factory) -> str:
    from contract.check import check_model

    return check_model("falcon-7b").model_dump_json()


@settings(**SETTINGS)
@given(st.data())
def test_report_json(tmp_path, seed_report, data):
    from reports.load import load_bench, load_check_report, load_report

    doc = json.loads(seed_report)
    kind = data.draw(st.sampled_from(["field", "bytes", "deep", "other-kind"]))
    if kind == "field":
        path = [data.draw(st.sampled_from(list(doc)))]
        node = doc
        while isinstance(node.get(path[-1]), dict) and data.draw(st.booleans()):
            node = node[path[-1]]
            path.append(data.draw(st.sampled_from(list(node) or ["k"])))
        node[path[-1]] = data.draw(json_values)
        raw = json.dumps(doc).encode()
    elif kind == "bytes":
        raw = data.draw(st.binary(max_size=200))
    elif kind == "deep":
        raw = ("[" * data.draw(st.integers(1, 100_000))).encode()
    else:
        raw = json.dumps(data.draw(st.dictionaries(st.sampled_from(["tool", "rows", "baseline", "curve", "changes",
                                                                    "a", "b", "requirements", "gate"]),
                                                   json_values, max_size=5))).encode()
    p = tmp_path / "r.json"
    p.write_bytes(raw)
    for fn in (load_report, load_check_report, load_bench):
        try:
            fn(p)
        except AiosError:
            pass


@settings(**SETTINGS)
@given(st.binary(max_size=300) | st.text(max_size=200).map(str.encode), st.sampled_from([".jsonl", ".txt"]))
def test_calibration_file(tmp_path, raw, suffix):
    from aios.data import load_texts

    p = tmp_path / f"c{suffix}"
    p.write_bytes(raw)
    try:
        texts = load_texts(p)
        assert texts and all(isinstance(t, str) for t in texts)
    except AiosError:
        pass


# --- the CLIs: exit 4 and one `error:` line -----------------------------------------------------


def _one_error_line(result, code: int = 4) -> None:
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), result.output


@pytest.mark.parametrize("corruption", ["array-2^62", "string-2^63", "tensor-terabytes", "dims-lie", "no-keys"])
def test_clis_on_hostile_gguf(tmp_path, seed_gguf, corruption):
    from contract.cli import main as contract_cli
    from runtime.cli import main as run_cli

    p = tmp_path / "bad.gguf"
    p.write_bytes(hostile_gguf(seed_gguf, corruption))
    runner = CliRunner()
    r = runner.invoke(contract_cli, ["inspect", str(p)])
    if not (corruption == "dims-lie" and r.exit_code == 0):  # overlapping tensors are legal GGUF
        _one_error_line(r)
    r = runner.invoke(contract_cli, ["check", str(p)])  # transformers may log before our error line
    assert "Traceback" not in r.output and r.exit_code in (0, 3, 4), r.output
    if r.exit_code == 4:
        assert [ln for ln in r.output.splitlines() if ln.strip()][-1].startswith("error:"), r.output
    _one_error_line(runner.invoke(run_cli, ["generate", str(p), "-p", "hello", "-n", "2"]))


def hostile_gguf(seed: bytes, corruption: str) -> bytes:
    """The seed GGUF with one hostile edit (also used by the memory test)."""
    buf = bytearray(seed)
    if corruption == "array-2^62":  # aios.fuzz.ints: 3 INT32s -> 2^62 items
        i = buf.index(b"aios.fuzz.ints") + len(b"aios.fuzz.ints") + 4 + 4
        buf[i:i + 8] = struct.pack("<Q", 2**62)
    elif corruption == "string-2^63":
        i = buf.index(b"aios.alias.groups") + len(b"aios.alias.groups") + 4
        buf[i:i + 8] = struct.pack("<Q", 2**63)
    elif corruption in ("tensor-terabytes", "dims-lie"):
        name = b"blk.0.ffn_up.weight"
        i = buf.index(name) + len(name)
        (n_dims,) = struct.unpack_from("<I", buf, i)
        dims = (2**20, 2**20) if corruption == "tensor-terabytes" else (32, 65)  # 4 TiB of F32 / a lie
        struct.pack_into("<QQ", buf, i + 4, *dims)
    elif corruption == "no-keys":
        struct.pack_into("<Q", buf, 16, 0)
    return bytes(buf)


# --- alias metadata (aios.alias.groups) through the runtime -------------------------------------

_NAMES = ["blk.0.ffn_up.weight", "blk.1.ffn_up.weight", "blk.0.attn_norm.weight", "output_norm.weight",
          "token_embd.weight", "nope", ""]
member = st.fixed_dictionaries({
    "layer": st.sampled_from([0, 1, 2, -1, 2**40, "0", None]),
    "weight": st.sampled_from(_NAMES + ["x"]),
    "delta": st.fixed_dictionaries({"encoding": st.sampled_from(["none", "dense", "lowrank", "q8_0", "zip"]),
                                    "tensors": st.lists(st.sampled_from(_NAMES), max_size=2)}) | json_values,
})
group = st.fixed_dictionaries({"type": st.text(max_size=5), "canonical": st.sampled_from(_NAMES),
                               "members": st.lists(member, max_size=3) | json_values})


@pytest.fixture(scope="module")
def plain_reader(tmp_path_factory):
    import gguf

    from tests.conftest import write_gguf

    return gguf.GGUFReader(str(write_gguf(tmp_path_factory.mktemp("al") / "p.gguf", activation="relu")))


@settings(**SETTINGS)
@given(st.lists(group, max_size=3).map(json.dumps) | json_values.map(json.dumps) | st.text(max_size=40))
def test_alias_groups_metadata(tmp_path, plain_reader, groups_text):
    import gguf

    p = tmp_path / "alias.gguf"
    w = gguf.GGUFWriter(str(p), "falcon")
    for key, f in plain_reader.fields.items():
        if not key.startswith("GGUF.") and key != "general.architecture":
            w.add_key_value(key, f.contents(), gguf.GGUFValueType(f.types[0]))
    w.add_string("aios.alias.groups", groups_text)
    for t in plain_reader.tensors:
        w.add_tensor(t.name, np.array(t.data).reshape(tuple(reversed(t.shape.tolist()))))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    run_everything_on(p)
