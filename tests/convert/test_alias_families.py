"""Aliased GGUFs (canonical + per-layer deltas) of the architectures added to the runtime run in
aios-run like their de-aliased standard export: the alias hook's composite operators work with
each family's graph (Phi-3's fused QKV and gate/up views, Gemma's norms, Qwen3's q/k norms)."""

from __future__ import annotations

import numpy as np
import pytest

from convert.alias.export import export_alias_gguf
from runtime.model import Model
from tests.conftest import build_hf_model
from tests.convert.test_alias import build_alias_folder

pytestmark = pytest.mark.usefixtures("one_thread")  # see tests/conftest.py


@pytest.mark.parametrize("kind", ["qwen3", "gemma3", "phi3"])
@pytest.mark.parametrize("delta", ["dense", "q8_0"])
def test_aliased_gguf_runs_like_its_dealiased_export(tmp_path, kind, delta):
    src = build_hf_model(kind, tmp_path / f"tiny-{kind[:3]}", vocab_size=256, num_hidden_layers=4)
    folder = build_alias_folder(src, tmp_path / "alias", delta=delta)
    aliased, flat = tmp_path / "a.gguf", tmp_path / "d.gguf"
    export_alias_gguf(folder, aliased)
    export_alias_gguf(folder, flat, dealias=True)
    m = Model(aliased, arithmetic="float")
    assert any(t.name.endswith(".canonical") for t in m.reader.tensors)
    ids = list(range(5, 30))
    a, b = m.forward(ids, all_logits=True), Model(flat, arithmetic="float").forward(ids, all_logits=True)
    assert np.abs(a - b).max() <= 1e-4 * max(1.0, np.abs(b).max())
