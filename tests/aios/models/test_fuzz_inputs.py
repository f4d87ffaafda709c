"""Bounded fuzzing of the model readers: any bytes give a handle or one clean AiosError."""

from __future__ import annotations

import json
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aios.errors import AiosError
from aios.models import resolve_model
from tests.conftest import build_hf_model, write_gguf

# Example counts come from the hypothesis profile (tests/conftest.py): "ci" by default
# (60 examples, derandomized so CI is reproducible); AIOS_FUZZ_PROFILE=long for long random runs.
SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def seed_gguf(tmp_path_factory):
    return write_gguf(tmp_path_factory.mktemp("seed") / "seed.gguf").read_bytes()


@pytest.fixture(scope="module")
def seed_st(tmp_path_factory):
    folder = build_hf_model("gpt2", tmp_path_factory.mktemp("seed-st") / "m", n_layer=1)
    return folder


def _resolve_and_touch(path):
    try:
        h = resolve_model(str(path))
        for t in h.tensor_inventory()[:3]:
            h.tensor(t.name)
    except AiosError:
        pass  # the documented clean failure


mutation = st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=8)


@settings(**SETTINGS)
@given(mutation, st.integers(min_value=0, max_value=100))
def test_gguf_byte_flips_and_truncation(tmp_path, seed_gguf, flips, cut_pct):
    data = bytearray(seed_gguf)
    for pos, val in flips:
        data[pos % len(data)] = val
    data = data[: max(4, len(data) * cut_pct // 100)] if cut_pct < 100 else data
    p = tmp_path / "f.gguf"
    p.write_bytes(bytes(data))
    _resolve_and_touch(p)


@settings(**SETTINGS)
@given(st.integers(0, 2**64 - 1), st.sampled_from([8, 16]))
def test_gguf_absurd_counts(tmp_path, seed_gguf, value, offset):
    """Tensor / KV counts (header offsets 8 and 16) set to anything, up to 2^64 − 1."""
    data = bytearray(seed_gguf)
    data[offset : offset + 8] = struct.pack("<Q", value)
    p = tmp_path / "c.gguf"
    p.write_bytes(bytes(data))
    _resolve_and_touch(p)


@settings(**SETTINGS)
@given(st.binary(min_size=0, max_size=200), st.integers(0, 2**64 - 1))
def test_safetensors_header(tmp_path, seed_st, header, declared_len):
    folder = tmp_path / "m"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_bytes((seed_st / "config.json").read_bytes())
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", declared_len) + header)
    _resolve_and_touch(folder)


@settings(**SETTINGS)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=20),
                    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=10), c, max_size=4),
                    max_leaves=12))
def test_config_and_index_json(tmp_path, seed_st, value):
    folder = tmp_path / "m"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(value))
    (folder / "model.safetensors").write_bytes((seed_st / "model.safetensors").read_bytes())
    _resolve_and_touch(folder)
    cfg = json.loads((seed_st / "config.json").read_text())
    if isinstance(value, dict):
        cfg.update({k: v for k, v in value.items() if k != "model_type"})
    (folder / "config.json").write_text(json.dumps(cfg))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": value}))
    _resolve_and_touch(folder)
