"""svd-residual on the architectures added to the runtime: the factorized file (U·V + residual,
no ``.weight`` for block matrices) runs in aios-run through the low-rank hook together with each
family's graph features (Phi-3's fused gate/up views over a low-rank operator, Gemma's norms,
Qwen3's q/k norms). With an F16 residual the factorization is exact up to F16 rounding, so the
logits match the plain F32 export's."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from aios.models.aliases import FIXTURES_DIR
from convert.gguf import GGUFExportConfig, export_gguf
from convert.svd_residual import SvdResidualConfig, svd_residual
from runtime.model import Model
from tests.conftest import build_hf_model

pytestmark = pytest.mark.usefixtures("one_thread")  # see tests/conftest.py


@pytest.mark.parametrize("kind", ["qwen3", "gemma3", "gemma2", "phi3"])
def test_factorized_file_runs_like_the_plain_export(tmp_path, kind):
    src = build_hf_model(kind, tmp_path / f"tiny-{kind[:3]}", vocab_size=2048)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(FIXTURES_DIR / "tiny-falcon" / f, src / f)
    plain, lr = tmp_path / "plain.gguf", tmp_path / "lr.gguf"
    export_gguf(str(src), plain, GGUFExportConfig("f32"))
    svd_residual(str(src), lr, SvdResidualConfig(rank=4, method="plain", residual="f16", factor_type="f32",
                                                 outtype="f32"))
    ids = list(range(5, 30))
    a = Model(plain, arithmetic="float").forward(ids, all_logits=True)
    m = Model(lr, arithmetic="float")
    assert "blk.0.ffn_down.lr_u" in {t.name for t in m.reader.tensors}
    b = m.forward(ids, all_logits=True)
    assert np.abs(a - b).max() <= 1e-2 * max(1.0, np.abs(a).max())
