"""Relufy on the gated families the runtime runs (ReLU on the gate of SwiGLU/GeGLU FFNs): a short
fine-tune of a tiny random model reaches >= 0.8 exact zeros (measured), aios-run's exact
sparse mode decodes the same text as dense on the exported file, and its R5 layout passes the
checker and decodes the same text."""

from __future__ import annotations

import shutil

import pytest

from aios.data import load_texts
from aios.models import resolve_model
from aios.models.aliases import FIXTURES_DIR
from contract.checks import r5_layout
from contract.checks.base import CheckContext
from contract.result import Status
from convert.gguf import GGUFExportConfig, export_gguf
from convert.layout import LayoutConfig, layout_gguf
from convert.relufy import RelufyConfig, relufy
from runtime.generate import generate
from runtime.model import Model
from tests.conftest import build_hf_model

pytestmark = pytest.mark.usefixtures("one_thread")  # see tests/conftest.py


@pytest.mark.parametrize("kind", ["qwen3", "gemma3", "phi3", "gemma2", "qwen2", "mistral"])
def test_relufied_family_is_sparse_and_exact(tmp_path, kind):
    src = build_hf_model(kind, tmp_path / f"tiny-{kind[:3]}", vocab_size=2048)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(FIXTURES_DIR / "tiny-falcon" / f, src / f)
    res = relufy(str(src), tmp_path / "relu", RelufyConfig(steps=60, batch=8, seq_len=64))
    after = res.provenance["metrics"]["after"]
    assert after["mean_exact_zero_fraction"] >= 0.8, after
    out = tmp_path / "relu.gguf"
    export_gguf(str(tmp_path / "relu"), out, GGUFExportConfig("f32"))
    ids = list(range(5, 30))
    dense, td = generate(Model(out, arithmetic="float"), ids, 12)
    sparse, ts = generate(Model(out, mode="sparse", arithmetic="float"), ids, 12)
    assert sparse == dense
    assert ts.decode_bytes["weights"] < 0.9 * td.decode_bytes["weights"]  # skipped rows were not read
    # R5 layout of the family's file (its own tensor set: fused QKV / gate_up, QK and post norms):
    # the checker's R5 passes on it and aios-run decodes the same text from the reordered bytes
    laid = layout_gguf(str(out), tmp_path / "laid.gguf", LayoutConfig(max_tokens=64),
                       calibration_texts=load_texts(limit=8))
    r5 = r5_layout.check(resolve_model(str(laid.output)), CheckContext(calibration_texts=load_texts(limit=1)))
    assert r5.status == Status.passed, r5.summary
    assert generate(Model(laid.output, mode="sparse", arithmetic="float"), ids, 12)[0] == dense
