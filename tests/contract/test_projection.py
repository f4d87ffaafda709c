"""The MB/token projection of a GGUF counts every stored weight in its role."""

from __future__ import annotations

import pytest

from aios.models import resolve_model
from aios.models.aliases import FIXTURES_DIR
from contract.checks import r1_sparsity
from contract.checks.base import CheckContext
from contract.projection import project, weight_bytes_by_role
from convert.gguf import GGUFExportConfig, export_gguf


def test_neuron_major_down_projection_is_the_ffn_down_role(tmp_path):
    """A --sparse-down file stores blk.N.ffn_down.t instead of blk.N.ffn_down.weight: the same
    bytes in the ffn_down role (which sparse execution skips), so the projected reduction equals the
    standard file's (it was 0 %: the bytes fell into 'other', read in full)."""
    from aios.data import load_texts

    src = str(FIXTURES_DIR / "tiny-falcon-relu")
    std, nm = tmp_path / "std.gguf", tmp_path / "nm.gguf"
    export_gguf(src, std, GGUFExportConfig("q8_0"))
    export_gguf(src, nm, GGUFExportConfig("q8_0", sparse_down=True))
    a, _ = weight_bytes_by_role(resolve_model(str(std)))
    b, _ = weight_bytes_by_role(resolve_model(str(nm)))
    assert b["ffn_down"] == pytest.approx(a["ffn_down"]) and b["ffn_down"] > 0
    assert b.get("other", 0.0) == pytest.approx(a.get("other", 0.0))
    proj = []
    for path in (std, nm):
        h = resolve_model(str(path))
        ctx = CheckContext(calibration_texts=load_texts(None, 4), max_tokens=32)
        proj.append(project(h, {"R1": r1_sparsity.check(h, ctx)}, 64, "optimized"))
    assert proj[1].projected_reduction == pytest.approx(proj[0].projected_reduction, rel=1e-3)
    assert proj[1].projected_reduction > 0.2
