"""A llama.cpp GGUF as the source of a conversion (aios.models.from_gguf): its dequantized HF
twin, made once into the cache, and the provenance that says the source was quantized."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from aios.models import ModelHandle, resolve_model
from aios.models.from_gguf import MARKER, gguf_source_of, hf_source


@pytest.fixture
def q8(tmp_path, monkeypatch):
    """tiny-llama exported as Q8_0, with the cache in tmp_path."""
    from convert.gguf import GGUFExportConfig, export_gguf

    monkeypatch.setenv("AIOS_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "src.q8_0.gguf"
    export_gguf("tiny-llama", path, GGUFExportConfig("q8_0"))
    return path


def test_a_gguf_becomes_its_dequantized_folder_once(q8, tmp_path, monkeypatch):
    from convert.gguf import GGUFExportConfig, export_gguf
    from runtime.model import Model

    src = resolve_model(str(q8))
    folder = hf_source(src)
    assert folder.kind != "gguf" and folder.path.parent == tmp_path / "cache" / "from-gguf"
    assert folder.path.name.startswith("src.q8_0-") and (folder.path / MARKER).is_file()
    record = gguf_source_of(folder.path)
    assert record["quantized"] and record["matrix_types"] == {"Q8_0": 44} and record["file"] == q8.name
    assert any("quantized: Q8_0 ×44" in n for n in folder.notes)
    # the twin holds the file's values: re-exported in f32, the same logits as the Q8_0 file
    back = tmp_path / "back.f32.gguf"
    export_gguf(str(q8), back, GGUFExportConfig("f32"))
    ids = list(range(5, 40))
    a, b = Model(q8, arithmetic="float").forward(ids, all_logits=True), Model(back, arithmetic="float").forward(ids, all_logits=True)
    assert np.abs(a - b).max() <= 1e-5 * np.abs(a).max()
    import gguf

    prov = json.loads(gguf.GGUFReader(str(back)).get_field("aios.provenance").contents())
    assert prov["source"]["gguf"]["sha256"] == record["sha256"]
    # made once: a second call reads the cache and loads nothing
    monkeypatch.setattr(ModelHandle, "load_torch", lambda *a, **k: pytest.fail("loaded again"))
    assert hf_source(resolve_model(str(q8))).path == folder.path
    assert hf_source(folder) is folder  # an HF folder is its own source


def test_a_failed_load_leaves_nothing_in_the_cache(q8, tmp_path, monkeypatch):
    from aios.models.handle import IncompleteWeightsError

    def refuse(*a, **k):
        raise IncompleteWeightsError("transformers did not load 1 weight(s)", ["x"])

    monkeypatch.setattr(ModelHandle, "load_torch", refuse)
    with pytest.raises(IncompleteWeightsError):
        hf_source(resolve_model(str(q8)))
    assert not any((tmp_path / "cache" / "from-gguf").iterdir())


def test_relufy_starts_from_a_gguf(q8, tmp_path):
    from convert.cli import main

    out = tmp_path / "relu"
    res = CliRunner().invoke(main, ["relufy", str(q8), "-o", str(out), "--steps", "2", "--batch", "2",
                                    "--seq-len", "16", "--l1", "0"])
    assert res.exit_code == 0, res.output
    assert "dequantizing src.q8_0.gguf" in res.stderr
    prov = json.loads((out / "aios_relufy.json").read_text())
    assert prov["source"]["gguf"]["file"] == q8.name and prov["source"]["gguf"]["quantized"]
    assert resolve_model(str(out)).facts.activation == "relu"


def test_a_tied_embedding_keeps_its_name_and_its_gguf_has_token_embd(tmp_path, monkeypatch):
    """A model whose head is its embedding (Gemma, Qwen2.5-1.5B): the twin stores the tensor as
    the embedding, so a GGUF exported from it has token_embd.weight (safetensors alone kept
    lm_head.weight, and the real Gemma 3 270M's svd-residual file could not load)."""
    import gguf
    from safetensors import safe_open

    from convert.gguf import GGUFExportConfig, export_gguf
    from tests.conftest import build_hf_model, with_tokenizer

    monkeypatch.setenv("AIOS_CACHE", str(tmp_path / "cache"))
    hf = with_tokenizer(build_hf_model("llama", tmp_path / "hf", tie_word_embeddings=True, vocab_size=2048))
    src = tmp_path / "tied.q8_0.gguf"
    export_gguf(str(hf), src, GGUFExportConfig("q8_0"))
    folder = hf_source(resolve_model(str(src)))
    with safe_open(str(folder.path / "model.safetensors"), "np") as f:
        keys = set(f.keys())
    assert "model.embed_tokens.weight" in keys and "lm_head.weight" not in keys
    back = tmp_path / "back.gguf"
    export_gguf(str(src), back, GGUFExportConfig("q8_0"))
    names = {t.name for t in gguf.GGUFReader(str(back)).tensors}
    assert "token_embd.weight" in names
