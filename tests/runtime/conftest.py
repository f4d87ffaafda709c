"""GGUF exports of the bundled fixtures, made once per test session with our exporter."""

from __future__ import annotations

import json
import shutil

import pytest

from aios.models.aliases import FIXTURES_DIR


@pytest.fixture(scope="session")
def exported(tmp_path_factory):
    """Factory: ``exported("tiny-falcon", "f32", relu=False)`` -> path of a cached export."""
    from convert.gguf import GGUFExportConfig, export_gguf

    root = tmp_path_factory.mktemp("gguf")
    cache: dict = {}

    def make(fixture: str, outtype: str = "f32", relu: bool = False):
        key = (fixture, outtype, relu)
        if key not in cache:
            src = FIXTURES_DIR / fixture
            if relu:  # the trained weights with the activation switched (no training)
                src = root / f"{fixture}-relu-src"
                if not src.exists():
                    shutil.copytree(FIXTURES_DIR / fixture, src)
                    cfg = json.loads((src / "config.json").read_text())
                    cfg["activation" if "activation" in cfg else "hidden_act"] = "relu"
                    (src / "config.json").write_text(json.dumps(cfg))
            out = root / f"{fixture}-{outtype}{'-relu' if relu else ''}.gguf"
            export_gguf(str(src), out, GGUFExportConfig(outtype=outtype))
            cache[key] = (out, src)
        return cache[key]

    return make


@pytest.fixture
def no_amx(monkeypatch):
    """The register tiles, also on a CPU with AMX (test_row_tiles.py, test_kq_row_tiles.py)."""
    from runtime.kernels import amx

    monkeypatch.setitem(amx._STATE, "ok", False)
    yield
