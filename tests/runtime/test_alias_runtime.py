"""aios-run on aliased GGUFs: y = W_c x + δ_i x equals the de-aliased model, bytes counted honestly."""

from __future__ import annotations

import numpy as np
import pytest

from aios.models import alias_format as af
from aios.models import resolve_model
from aios.models.aliases import FIXTURES_DIR
from convert.alias_gguf import export_alias_gguf
from runtime.alias import AliasedLinear
from runtime.model import Model
from tests.convert.test_alias import build_alias_folder

TOKENS = [5, 17, 300, 42, 1024, 7, 99, 512, 3, 2000]


pytestmark = pytest.mark.usefixtures("one_thread")  # see tests/conftest.py


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(aliased, de-aliased) f32 GGUFs per (fixture, delta encoding), built once."""
    root = tmp_path_factory.mktemp("alias-rt")
    cache: dict = {}

    def make(fixture: str, delta: str, outtype: str = "f32"):
        key = (fixture, delta, outtype)
        if key not in cache:
            folder = build_alias_folder(FIXTURES_DIR / fixture, root / f"{fixture}-{delta.replace(':', '')}",
                                        delta=delta)
            a = export_alias_gguf(folder, root / f"{folder.name}-{outtype}.gguf", outtype=outtype).output
            d = export_alias_gguf(folder, root / f"{folder.name}-{outtype}-dense.gguf", outtype=outtype,
                                  dealias=True).output
            cache[key] = (a, d, folder)
        return cache[key]

    return make


@pytest.mark.parametrize("fixture, delta", [("tiny-falcon", "lowrank:8"), ("tiny-llama", "lowrank:8"),
                                            ("tiny-llama", "q8_0"), ("tiny-falcon", "none")])
def test_aliased_logits_equal_dealiased(pair, fixture, delta):
    a, d, _ = pair(fixture, delta)
    ma, md = Model(a, arithmetic="float"), Model(d, arithmetic="float")
    assert any(isinstance(op, AliasedLinear) for L in ma.layers for op in L.values())
    la, ld = ma.forward(TOKENS, all_logits=True), md.forward(TOKENS, all_logits=True)
    assert np.abs(la - ld).max() <= 1e-4
    # decode steps too (KV cache path)
    for t in (11, 12):
        assert np.abs(ma.forward([t]) - md.forward([t])).max() <= 1e-4


@pytest.mark.parametrize("fixture", ["tiny-falcon", "tiny-llama"])
def test_distinct_core_bytes_drop_by_the_reported_ratio(pair, fixture):
    a, d, _ = pair(fixture, "lowrank:8")
    reported = float(resolve_model(str(a)).store.field("aios.alias.core_aliasing_ratio"))
    ma, md = Model(a, arithmetic="float"), Model(d, arithmetic="float")
    ma.forward(TOKENS[:4])
    md.forward(TOKENS[:4])
    core = list(resolve_model(str(a)).facts.core_zone)
    for m in (ma, md):
        m.counter.reset()
        m.forward([9])  # one decode token
    distinct_a = ma.counter.distinct_weight_bytes(core)
    distinct_d = md.counter.distinct_weight_bytes(core)
    measured = 1 - distinct_a / distinct_d
    assert measured == pytest.approx(reported, abs=1e-5)
    assert reported > 0.7  # 6 layers share each canonical, rank-8 deltas
    # bytes read with re-reads: every layer still multiplies by the canonical, plus its delta
    reads_a = sum(ma.counter.per_layer[i]["weights"] for i in core)
    reads_d = sum(md.counter.per_layer[i]["weights"] for i in core)
    assert reads_a > reads_d
    # the stored canonical is one object: distinct parts equal the file's tensor bytes
    h = resolve_model(str(a))
    file_bytes = sum(t.nbytes for t in h.tensor_inventory() if len(t.shape) == 2)
    assert ma.weight_bytes == file_bytes
    assert ma.weight_bytes < md.weight_bytes


def test_dealiased_gguf_is_a_standard_file_llama_cpp_loads(pair):
    from aios.reference import llamacpp

    a, d, folder = pair("tiny-llama", "lowrank:8")
    hd = resolve_model(str(d))
    names = {t.name for t in hd.tensor_inventory()}
    assert not any(".delta" in n or n.endswith(".canonical") for n in names)
    assert hd.store.field("aios.alias.groups") is None
    theirs = llamacpp.logits(d, TOKENS, n_ctx=64).value
    ours = Model(d, arithmetic="float").forward(TOKENS, all_logits=True)
    # a load-and-agree check (exporter parity itself is tested in tests/convert): same top-1, close logits
    assert (ours.argmax(1) == theirs.argmax(1)).all() and np.abs(ours - theirs).max() < 1e-2


def test_aliased_gguf_metadata_and_names(pair):
    a, _, folder = pair("tiny-falcon", "lowrank:8")
    h = resolve_model(str(a))
    groups = af.groups_of(h)
    names = {t.name for t in h.tensor_inventory()}
    assert {g.canonical for g in groups} == {"blk.0.attn_qkv.canonical", "blk.0.attn_output.canonical",
                                             "blk.0.ffn_up.canonical", "blk.0.ffn_down.canonical"}
    assert "blk.3.ffn_up.delta.lr_u" in names and "blk.3.ffn_up.delta.lr_v" in names
    assert "blk.3.ffn_up.weight" not in names
    assert h.store.field("aios.alias.perplexity_delta") == pytest.approx(0.5)
    # the ratio the GGUF declares is the shared definition applied to its own tensors
    assert h.store.field("aios.alias.core_aliasing_ratio") == pytest.approx(af.ratio_of(h).core_ratio, abs=1e-6)


def test_bench_reports_distinct_weight_bytes(pair):
    """aios-run bench's distinct-weights figure: equal to the bytes read when nothing is
    shared, and the aliased file's shared canonicals counted once."""
    from runtime.bench import bench

    a, d, _ = pair("tiny-falcon", "lowrank:8")
    rows = bench([str(d), str(a)], prompt_tokens=8, n=4, project=None)["rows"]
    plain, aliased = rows
    assert plain["distinct_weight_mb_per_token"] == pytest.approx(plain["decode_mb_per_token"]["weights"], rel=1e-3)
    assert aliased["distinct_weight_mb_per_token"] < 0.5 * plain["distinct_weight_mb_per_token"]
    assert aliased["decode_mb_per_token"]["weights"] > plain["decode_mb_per_token"]["weights"]  # re-reads
