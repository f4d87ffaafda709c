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


def test_neuron_major_low_rank_down_parts_are_the_ffn_down_role(tmp_path):
    """svd-residual --sparse-down: V transposed and the residual transposed have one row per
    neuron (skipped when it does not fire: ffn_down role); U is read whole (other). The same
    file in the standard layout keeps every part in 'other' (its sparse modes are refused)."""
    from dataclasses import replace

    import gguf

    from convert.svd_residual import SvdResidualConfig, svd_residual

    cfg = SvdResidualConfig(rank=8, method="plain", residual="q8_0", factor_type="f16", outtype="q8_0")
    src = str(FIXTURES_DIR / "tiny-falcon-relu")
    std = svd_residual(src, tmp_path / "std.gguf", cfg).output
    nm = svd_residual(src, tmp_path / "nm.gguf", replace(cfg, sparse_down=True)).output
    t = {x.name: int(x.n_bytes) for x in gguf.GGUFReader(str(nm)).tensors}
    rows = sum(v for k, v in t.items() if k.endswith(("ffn_down.lr_v.t", "ffn_down.residual.t")))
    u = sum(v for k, v in t.items() if k.endswith("ffn_down.lr_u"))
    a, _ = weight_bytes_by_role(resolve_model(str(std)))
    b, _ = weight_bytes_by_role(resolve_model(str(nm)))
    assert rows > 0 and u > 0
    assert b["ffn_down"] == pytest.approx(rows) and a.get("ffn_down", 0.0) == 0.0
    assert b["other"] == pytest.approx(a["other"] - rows)
