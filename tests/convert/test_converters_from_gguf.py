"""The converters that train or factorize take a llama.cpp GGUF in, as relufy and gguf do: the
file is dequantized once into an HF twin ($AIOS_CACHE/from-gguf, aios/models/from_gguf.py), and
the output's provenance names the GGUF it came from."""

from __future__ import annotations

import json

import pytest

from aios.models.aliases import FIXTURES_DIR
from convert.gguf import GGUFExportConfig, export_gguf

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def ggufs(tmp_path_factory):
    root = tmp_path_factory.mktemp("from-gguf")
    llama = export_gguf(str(FIXTURES_DIR / "tiny-llama"), root / "tiny-llama.q8_0.gguf",
                        GGUFExportConfig("q8_0")).output
    relu = export_gguf(str(FIXTURES_DIR / "tiny-falcon-relu"), root / "falcon-relu.f32.gguf",
                       GGUFExportConfig("f32")).output
    return llama, relu


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("AIOS_CACHE", str(tmp_path / "cache"))  # the twins go here, not to ~/.cache


def test_alias_from_a_quantized_gguf(ggufs, tmp_path):
    from convert.alias import posthoc as A

    res = A.alias(str(ggufs[0]), tmp_path / "aliased",
                  A.AliasConfig(zones="all", delta="lowrank:8", min_cosine=0.0, require_bytes_saved=False))
    prov = json.loads((tmp_path / "aliased" / "aios_alias.json").read_text())["provenance"]
    assert prov["source"]["gguf"]["file"] == "tiny-llama.q8_0.gguf"
    assert prov["source"]["gguf"]["quantized"] is True
    assert res.output.is_dir() and (tmp_path / "cache" / "from-gguf").is_dir()


def test_svd_residual_from_a_quantized_gguf(ggufs, tmp_path):
    import gguf

    from convert.svd_residual import SvdResidualConfig, svd_residual

    out = tmp_path / "lr.gguf"
    svd_residual(str(ggufs[0]), out, SvdResidualConfig(rank=8, method="plain", residual="q4_0",
                                                       factor_type="q8_0", seed=1))
    prov = json.loads(gguf.GGUFReader(str(out)).get_field("aios.provenance").contents())
    assert prov["source"]["gguf"]["file"] == "tiny-llama.q8_0.gguf"


def test_sparsity_map_from_a_gguf(ggufs, tmp_path):
    from aios.data import load_texts
    from convert.sparsity_map import SparsityMapConfig, sparsity_map

    cal = tmp_path / "cal.jsonl"
    cal.write_text("".join(json.dumps({"text": t}) + "\n" for t in load_texts(limit=24)))
    res = sparsity_map(str(ggufs[1]), tmp_path / "map.npz",
                       SparsityMapConfig(mode="conservative", resolution=256), calibration=cal)
    assert res.header["n_layers"] == 6 and res.header["skip_fraction"] > 0
