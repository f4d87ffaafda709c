"""R3 on explicit canonical + delta structure: the bundled trained-alias fixture passes, measured."""

from __future__ import annotations

import json

import pytest

from aios.data import load_texts
from aios.models import alias_format as af
from aios.models import resolve_model
from aios.models.aliases import FIXTURES_DIR
from contract.checks import r3_aliasing
from contract.checks.base import CheckContext
from contract.result import Evidence, Status

FIXTURE = FIXTURES_DIR / "tiny-falcon-alias"


pytestmark = pytest.mark.usefixtures("one_thread")  # see tests/conftest.py


def ctx() -> CheckContext:
    return CheckContext(calibration_texts=load_texts(limit=1))


def test_r3_passes_on_the_trained_alias_fixture():
    r = r3_aliasing.check(resolve_model(str(FIXTURE)), ctx())
    assert r.status == Status.passed, r.summary
    m = {x.name: x for x in r.metrics}
    assert m["aliasing_ratio"].value >= 0.70 and m["aliasing_ratio"].evidence == Evidence.measured
    assert m["max_rel_delta_norm"].value < 0.10 and m["max_rel_delta_norm"].evidence == Evidence.measured
    assert m["max_rel_delta_spectral"].value < 0.10  # trained with the spectral projection: both readings hold
    assert m["perplexity_delta"].value < 1.0 and m["perplexity_delta"].evidence == Evidence.declared
    card = json.loads((FIXTURE / "aios_fixture.json").read_text())
    assert card["core_aliasing_ratio"] == pytest.approx(m["aliasing_ratio"].value, abs=1e-6)


def test_declared_perplexity_change_is_reproduced_by_measurement():
    """The declared number is not taken on trust: held-out perplexity of the materialized
    aliased model and of the independent-weight source, measured here."""
    from aios.evaluation import pydoc_split
    from convert import evaluation as ev

    h, src = resolve_model(str(FIXTURE)), resolve_model("tiny-falcon")
    tok = h.load_tokenizer()
    heldout = pydoc_split(tok, "heldout")
    ppl = ev.heldout_perplexity(h.load_torch(dtype="float32"), heldout)
    base = ev.heldout_perplexity(src.load_torch(dtype="float32"), heldout)
    declared = r3_aliasing.declared_perplexity(h)
    assert ppl - base == pytest.approx(declared["perplexity_delta"], abs=2e-3)
    assert ppl - base < 1.0


def test_r3_passes_on_the_fixtures_aliased_gguf(tmp_path):
    from convert.alias.export import export_alias_gguf

    out = export_alias_gguf(FIXTURE, tmp_path / "alias.gguf", outtype="f32").output
    r = r3_aliasing.check(resolve_model(str(out)), ctx())
    assert r.status == Status.passed, r.summary
    folder = af.ratio_of(resolve_model(str(FIXTURE))).core_ratio
    assert r.metric("aliasing_ratio").value == pytest.approx(folder, abs=1e-6)  # f32 both: same bytes


def test_alias_tensors_without_records_are_not_measured(tmp_path):
    from safetensors.torch import load_file, save_file

    bad = tmp_path / "bad"
    bad.mkdir()
    for p in FIXTURE.iterdir():
        if p.name != af.SIDECAR:
            (bad / p.name).write_bytes(p.read_bytes())
    save_file(load_file(bad / "model.safetensors"), bad / "model.safetensors", metadata={"format": "pt"})
    r = r3_aliasing.check(resolve_model(str(bad)), ctx())
    assert r.status == Status.not_measured and "no alias group records" in r.summary


def test_projection_baselines_an_aliased_model_on_its_de_aliased_bytes():
    """The aliased fixture projects from the bytes its source stores (not its own, already
    shared bytes, which would project 0 %) down to what it stores itself."""
    from contract.projection import project, weight_bytes_by_role

    h, src = resolve_model(str(FIXTURE)), resolve_model("tiny-falcon")
    mine, _ = weight_bytes_by_role(h)
    theirs, _ = weight_bytes_by_role(src)
    for role in ("embedding_row", "head", "other", "ffn_up", "ffn_down", "core_shareable"):
        assert mine.get(role, 0.0) == pytest.approx(theirs.get(role, 0.0)), role
    p = project(h, {"R3": r3_aliasing.check(h, ctx())}, 4096, "compatible")
    base = project(src, {}, 4096, "compatible")
    assert p.baseline_mb_per_token == pytest.approx(base.baseline_mb_per_token)
    stored_block_bytes = sum(t.nbytes for t in h.tensor_inventory() if not ("word_embeddings" in t.name or "lm_head" in t.name))
    weights = sum(t.projected_bytes for t in p.terms if t.term.startswith("weights"))
    embed_row_and_head = mine["embedding_row"] + mine["head"]
    assert weights - embed_row_and_head == pytest.approx(stored_block_bytes, rel=1e-6)
    assert p.projected_reduction > 0.3
