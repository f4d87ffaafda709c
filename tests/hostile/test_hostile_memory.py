"""Bounds: headers declaring terabytes, or a 2^63-byte string, are refused before any allocation.

One fresh interpreter imports everything, then reads each hostile file in turn and reports how
much its peak RSS (``ru_maxrss``) grew; every read must be refused and grow it by < 32 MiB.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from aios.models.aliases import FIXTURES_DIR
from tests.hostile.test_hostile_fuzz import hostile_gguf, write_seed_gguf

ROOT = Path(__file__).resolve().parents[2]
LIMIT_KIB = 32 * 1024

PROBE = """
import json, resource, sys
from aios.errors import AiosError
from aios.models import resolve_model
from runtime.model import Model
import gguf, safetensors, torch  # noqa: F401  (imported before the baseline)
out = {}
for case in json.loads(sys.argv[1]):
    kind, path = case.split(":", 1)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        if kind == "runtime":
            Model(path)
        else:
            h = resolve_model(path)
            [h.tensor(t.name) for t in h.tensor_inventory()]
        outcome = "accepted"
    except AiosError as e:
        outcome = "refused: " + e.message
    out[case] = {"outcome": outcome, "grown_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before}
print(json.dumps(out))
"""
GGUF_CASES = ["tensor-terabytes", "string-2^63", "array-2^62", "context-2^32"]
ST_CASES = ["header-length-2^63", "tensor-terabytes", "offsets-past-end"]


def _gguf(folder: Path, seed: bytes, case: str) -> Path:
    p = folder / f"{case}.gguf"
    if case == "context-2^32":  # a KV cache of terabytes
        buf = bytearray(seed)
        i = buf.index(b"falcon.context_length") + len(b"falcon.context_length")
        assert struct.unpack_from("<I", buf, i)[0] == 4  # UINT32
        struct.pack_into("<I", buf, i + 4, 2**32 - 1)
        p.write_bytes(bytes(buf))
    else:
        p.write_bytes(hostile_gguf(seed, case))
    return p


def _safetensors(folder: Path, case: str) -> Path:
    m = folder / f"st-{case}"
    m.mkdir()
    (m / "config.json").write_bytes((FIXTURES_DIR / "tiny-falcon" / "config.json").read_bytes())
    header = {"transformer.word_embeddings.weight": {"dtype": "F32", "shape": [2**20, 2**20],
                                                     "data_offsets": [0, 2**42]}}
    if case == "offsets-past-end":
        header = {"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                  "x": {"dtype": "F32", "shape": [2**18], "data_offsets": [16, 16 + 2**20]}}
    raw = json.dumps(header).encode()
    n = 2**63 if case == "header-length-2^63" else len(raw)
    (m / "model.safetensors").write_bytes(struct.pack("<Q", n) + raw + b"\0" * 16)
    return m


@pytest.fixture(scope="module")
def probed(tmp_path_factory) -> dict:
    d = tmp_path_factory.mktemp("hostile")
    seed = write_seed_gguf(d / "seed.gguf").read_bytes()
    cases = {}
    for c in GGUF_CASES:
        p = _gguf(d, seed, c)
        cases[f"gguf/{c}/runtime"] = f"runtime:{p}"
        if c != "context-2^32":
            cases[f"gguf/{c}/resolve"] = f"resolve:{p}"
    for c in ST_CASES:
        cases[f"safetensors/{c}"] = f"resolve:{_safetensors(d, c)}"
    r = subprocess.run([sys.executable, "-c", PROBE, json.dumps(list(cases.values()))], cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    return {name: out[case] for name, case in cases.items()}


@pytest.mark.parametrize("name", [f"gguf/{c}/{k}" for c in GGUF_CASES for k in ("runtime", "resolve")
                                  if not (c == "context-2^32" and k == "resolve")]
                         + [f"safetensors/{c}" for c in ST_CASES])
def test_refused_before_allocation(probed, name):
    res = probed[name]
    assert res["outcome"].startswith("refused"), res
    assert res["grown_kib"] < LIMIT_KIB, res
    if name.startswith("gguf/context"):
        assert "KV cache" in res["outcome"]
