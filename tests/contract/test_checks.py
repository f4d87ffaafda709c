"""Each requirement check on tiny models, against independent computations."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from aios.data import load_texts
from aios.measure.similarity import cosine_from_gram, rel_delta_from_gram, rel_delta_to_mean, streamed_gram
from aios.models import resolve_model
from contract.check import assign_tier, check_model
from contract.checks.base import CheckContext
from contract.checks import r1_sparsity, r2_kv_cache, r3_aliasing, r4_activation_footprint, r5_layout
from contract.spec.manifest import real_layout
from contract.result import Status


def ctx(n: int = 12) -> CheckContext:
    return CheckContext(calibration_texts=load_texts(limit=n), max_tokens=32)


def _independent_zero_fraction(folder, texts, max_tokens=32) -> float:
    """Count zeros at the activation module's *output* with our own hooks (not the checker's)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    tok = AutoTokenizer.from_pretrained(folder)
    per_layer: dict[int, list[int]] = {}
    hooks = []
    for i, layer in enumerate(model.transformer.h):
        def hook(_m, _inp, out, i=i):
            z, n = per_layer.setdefault(i, [0, 0]), out.numel()
            z[0] += int((out == 0).sum())
            z[1] += n
        hooks.append(layer.mlp.act.register_forward_hook(hook))
    with torch.no_grad():
        for t in texts:
            ids = tok(t, return_tensors="pt", truncation=True, max_length=max_tokens)["input_ids"]
            model(input_ids=ids)
    return float(np.mean([z / n for z, n in per_layer.values()]))


def test_r1_gelu_fails_with_near_zero_info(lm):
    h = resolve_model(str(lm("falcon")))
    r = r1_sparsity.check(h, ctx())
    assert r.status == Status.failed and r.evidence.value == "measured"
    assert r.metric("mean_exact_zero_fraction").value < 0.01
    assert r.metric("mean_near_zero_fraction") is not None
    assert len(r.details["per_layer_exact_zero_fraction"]) == h.facts.n_layers


def test_r1_relu_switch_matches_independent_hook_count(lm):
    folder = lm("falcon", activation="relu")
    h = resolve_model(str(folder))
    c = ctx()
    r = r1_sparsity.check(h, c)
    ours = r.metric("mean_exact_zero_fraction").value
    theirs = _independent_zero_fraction(folder, c.calibration_texts)
    assert abs(ours - theirs) < 0.01
    assert 0.2 < ours < 0.8  # random-init ReLU: about half the activations are zero
    freq = c.cache["ffn_activity"].neuron_frequency
    assert freq.shape == (h.facts.n_layers, h.facts.d_ffn) and ((0 <= freq) & (freq <= 1)).all()


def test_r1_gated_relu_zeros_of_product(lm):
    h = resolve_model(str(lm("llama", hidden_act="relu")))
    r = r1_sparsity.check(h, ctx(6))
    assert r.metric("mean_exact_zero_fraction").value > 0.3


def test_r1_alias_declared():
    assert r1_sparsity.check(resolve_model("falcon-7b"), ctx(1)).status == Status.failed
    r = r1_sparsity.check(resolve_model("relullama-7b"), ctx(1))
    assert r.status == Status.not_measured and "fetch SparseLLM/ReluLLaMA-7B" in r.command


@pytest.mark.parametrize("name, kv_mib, status", [
    ("falcon-7b", 32.0, Status.passed), ("falcon-40b", 480.0, Status.failed),
    ("llama-2-7b", 2048.0, Status.failed), ("llama-3.1-8b", 512.0, Status.failed),
])
def test_r2_formula(name, kv_mib, status):
    r = r2_kv_cache.check(resolve_model(name), ctx(1))
    assert r.metric("kv_mib_at_4096").value == kv_mib and r.status == status
    assert "L × H_kv × d_head × C × 4" in r.formula


def test_r4_formula_falcon_and_gated():
    r = r4_activation_footprint.check(resolve_model("falcon-7b"), ctx(1))
    assert r.metric("footprint_bytes").value == (2 * 4544 + 4 * 18176) * 2 == 163_584
    assert r.status == Status.passed
    g = r4_activation_footprint.check(resolve_model("llama-2-7b"), ctx(1))
    assert g.metric("footprint_bytes_spec_formula").value == (2 * 4096 + 4 * 11008) * 2
    assert g.metric("footprint_bytes").value == (2 * 4096 + 5 * 11008) * 2


@settings(max_examples=25, deadline=None)
@given(st.integers(2, 6), st.integers(1, 9), st.integers(1, 7), st.integers(1, 50))
def test_streamed_gram_matches_dense(L, rows, cols, budget):
    rng = np.random.default_rng(L * 100 + rows * 10 + cols)
    W = {f"w{i}": rng.standard_normal((rows, cols)).astype(np.float32) for i in range(L)}
    names = list(W)
    G = streamed_gram(lambda n, a, b: W[n][a:b], names, rows, cols, budget_elements=budget)
    flat = np.stack([W[n].ravel().astype(np.float64) for n in names])
    np.testing.assert_allclose(G, flat @ flat.T, rtol=1e-9, atol=1e-9)
    cos = cosine_from_gram(G)
    assert np.isclose(cos[0, 1], flat[0] @ flat[1] / np.linalg.norm(flat[0]) / np.linalg.norm(flat[1]))
    rd = rel_delta_from_gram(G)
    assert np.isclose(rd[0, 1], np.linalg.norm(flat[0] - flat[1]) / np.linalg.norm(flat[1]), rtol=1e-6, atol=1e-9)
    grp = list(range(L))
    to_mean, mean_norm = rel_delta_to_mean(G, grp)
    mean = flat.mean(0)
    np.testing.assert_allclose(to_mean, np.linalg.norm(flat - mean, axis=1) / np.linalg.norm(mean), rtol=1e-5, atol=1e-7)


def test_r3_emergent_on_independent_and_on_shared_weights(lm):
    folder = lm("llama", num_hidden_layers=6)
    h = resolve_model(str(folder))
    r = r3_aliasing.check(h, ctx(1))
    assert r.status == Status.failed and r.metric("aliasing_ratio").value == 0.0
    assert r.metric("emergent_aliasing_potential").value == 0.0  # random init: nothing similar
    assert r.metric("best_cross_layer_cosine").value < 0.5
    # now make the core zone share up_proj with 1 % deltas: the potential must see it
    from safetensors.torch import load_file, save_file

    sd = load_file(folder / "model.safetensors")
    base = sd["model.layers.2.mlp.up_proj.weight"].clone()
    for i in h.facts.core_zone:
        sd[f"model.layers.{i}.mlp.up_proj.weight"] = base + 0.01 * torch.randn_like(base) * base.std()
    save_file(sd, folder / "model.safetensors", metadata={"format": "pt"})
    r = r3_aliasing.check(resolve_model(str(folder)), ctx(1))
    up = r.details["matrix_types"]["mlp.up_proj.weight"]
    assert min(up["best_cosine"]) > 0.99 and max(up["rel_delta_to_core_mean"]) < 0.05
    assert r.metric("emergent_aliasing_potential").value > 0


def _manifest_for(handle, layout):
    order = sorted(layout.items(), key=lambda kv: kv[1][0])
    blocks = [{"block_id": n, "access_frequency": "high", "rws_tier": "HOT", "offset_bytes": o, "size_bytes": s}
              for n, (o, s) in order]
    return {"aios_contract_version": "1.0", "frequency_ordered": True, "layout": blocks}


def test_r5_sidecar_pass_and_first_mismatch(lm):
    folder = lm("gpt2")
    h = resolve_model(str(folder))
    assert r5_layout.check(h, ctx(1)).status == Status.failed  # no manifest
    layout = real_layout(folder, h)
    m = _manifest_for(h, layout)
    (folder / "aios_manifest.json").write_text(json.dumps(m))
    r = r5_layout.check(h, ctx(1))
    assert r.status == Status.passed and r.metric("init_seconds").value < 60
    m["layout"][1]["offset_bytes"] += 4
    (folder / "aios_manifest.json").write_text(json.dumps(m))
    r = r5_layout.check(h, ctx(1))
    assert r.status == Status.failed and m["layout"][1]["block_id"] in r.summary
    m["layout"][1]["offset_bytes"] -= 4
    m["layout"][0]["access_frequency"] = "low"
    (folder / "aios_manifest.json").write_text(json.dumps(m))
    assert "lower-frequency" in r5_layout.check(h, ctx(1)).summary
    (folder / "aios_manifest.json").write_text('{"frequency_ordered": true}')
    assert "schema error" in r5_layout.check(h, ctx(1)).summary


def test_r5_embedded_gguf_manifest(gguf_file, tmp_path):
    import gguf

    path = gguf_file()
    h = resolve_model(str(path))
    m = _manifest_for(h, real_layout(path, h))
    # rewrite with the manifest embedded: offsets change, so compute them from a first pass
    out = tmp_path / "with-manifest.gguf"
    for _ in range(2):
        w = gguf.GGUFWriter(str(out), "falcon")
        for f in h.store.reader.fields.values():
            if f.name.startswith("GGUF.") or f.name == "general.architecture":
                continue
            w.add_key_value(f.name, f.contents(), f.types[0], f.types[-1] if len(f.types) > 1 else None)
        w.add_string("aios.manifest", json.dumps(m))
        for t in h.store.reader.tensors:
            w.add_tensor(t.name, np.array(t.data).reshape(tuple(reversed(t.shape.tolist()))))
        w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()  # noqa: E702
        h2 = resolve_model(str(out))
        m = _manifest_for(h2, real_layout(out, h2))
    r = r5_layout.check(resolve_model(str(out)), ctx(1))
    assert r.status == Status.passed and "embedded" in r.summary


def test_tiering():
    class R:
        def __init__(self, s):
            self.status = s

    P, F = Status.passed, Status.failed
    assert assign_tier({"R1": R(P), "R2": R(P), "R3": R(F), "R4": R(P), "R5": R(P)})["id"] == "optimized"
    assert assign_tier({"R1": R(F), "R2": R(P), "R3": R(P), "R4": R(P), "R5": R(P)})["id"] == "compatible"
    assert assign_tier({r: R(P) for r in ("R1", "R2", "R3", "R4", "R5")})["id"] == "native+"


def test_check_model_report_and_projection(lm):
    rep = check_model(str(lm("falcon", activation="relu")), samples=8, max_tokens=16)
    assert [r.id for r in rep.requirements] == ["R1", "R2", "R3", "R4", "R5"]
    p = rep.projection
    assert p.evidence.value == "projected" and 0 < p.projected_reduction < 1
    assert rep.calibration["samples"] == 8 and rep.calibration["tokens"] > 0


# --- on the bundled, trained fixtures ------------------------------------------------------


def test_bundled_gelu_falcon(tmp_path):
    import shutil

    from aios.models.aliases import FIXTURES_DIR

    c = ctx(40)
    rep = {r.id: r for r in check_model("tiny-falcon", samples=40, max_tokens=64).requirements}
    assert rep["R1"].status == Status.failed
    assert rep["R1"].metric("mean_exact_zero_fraction").value < 0.01
    assert 0 < rep["R1"].metric("mean_near_zero_fraction").value < 0.5
    assert rep["R2"].status == Status.passed
    # the same trained weights with the config switched to ReLU (no training)
    folder = tmp_path / "relu-falcon"
    shutil.copytree(FIXTURES_DIR / "tiny-falcon", folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["activation"] = "relu"
    (folder / "config.json").write_text(json.dumps(cfg))
    r = r1_sparsity.check(resolve_model(str(folder)), c)
    theirs = _independent_zero_fraction(folder, c.calibration_texts)
    assert abs(r.metric("mean_exact_zero_fraction").value - theirs) < 0.01


def test_bundled_llama_gqa_facts():
    h = resolve_model("tiny-llama")
    assert h.facts.n_kv_heads == 2 and h.facts.gated_ffn and h.facts.activation == "silu"
    assert r2_kv_cache.check(h, ctx(1)).status == Status.passed
    assert len(h.facts.core_zone) >= 1


def test_r1_on_gguf_runs_the_declared_activation(tmp_path):
    """transformers' GGUF loader assumes GELU for falcon; the checker must run the declared ReLU."""
    import shutil

    from aios.models.aliases import FIXTURES_DIR
    from convert.gguf import GGUFExportConfig, export_gguf

    folder = tmp_path / "relu-falcon"
    shutil.copytree(FIXTURES_DIR / "tiny-falcon", folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["activation"] = "relu"
    (folder / "config.json").write_text(json.dumps(cfg))
    out = tmp_path / "relu.gguf"
    export_gguf(str(folder), out, GGUFExportConfig(outtype="f32"))
    c1, c2 = ctx(16), ctx(16)
    hf = r1_sparsity.check(resolve_model(str(folder)), c1).metric("mean_exact_zero_fraction").value
    gg = r1_sparsity.check(resolve_model(str(out)), c2).metric("mean_exact_zero_fraction").value
    assert hf > 0.3 and abs(hf - gg) < 0.01


def test_r5_every_manifest_is_verified(gguf_file, tmp_path):
    """Issue 19.6: a sidecar that disagrees with the file fails R5, even beside a valid one,
    and the summary names the sidecar and the block."""
    import shutil

    src = gguf_file()
    path = tmp_path / "m.gguf"
    shutil.copy(src, path)
    h = resolve_model(str(path))
    good = _manifest_for(h, real_layout(path, h))
    (tmp_path / "aios_manifest.json").write_text(json.dumps(good))
    r = r5_layout.check(resolve_model(str(path)), ctx(1))
    assert r.status == Status.passed, r.summary
    bad = json.loads(json.dumps(good))
    bad["layout"][2]["size_bytes"] += 32
    sidecar = tmp_path / "m.aios.json"
    sidecar.write_text(json.dumps(bad))
    r = r5_layout.check(resolve_model(str(path)), ctx(1))
    assert r.status == Status.failed
    assert str(sidecar) in r.summary and bad["layout"][2]["block_id"] in r.summary
    assert r.metric("manifests_verified").value == 2
    assert [m["ok"] for m in r.details["manifests"]] == [True, False]


def test_r2_shows_the_models_own_maximum_context():
    """tiny-falcon runs at most 512 tokens: R2 keeps the contract's 4096 criterion and also shows
    the KV bytes at 512 (issue 19.9)."""
    from contract.checks import r2_kv_cache

    r = r2_kv_cache.check(resolve_model("tiny-falcon"), ctx(1))
    at_max = r.metric("kv_bytes_at_max_context")
    assert at_max is not None and at_max.value * 8 == r.metric("kv_bytes_at_4096").value
    assert "maximum context is 512" in r.summary
    assert r2_kv_cache.check(resolve_model("llama-2-7b"), ctx(1)).metric("kv_bytes_at_max_context") is None


def test_non_positive_option_is_named():
    from aios.errors import UsageError
    from contract.check import check_model

    for kw, name in (({"context": 0}, "--context"), ({"max_tokens": -1}, "--max-tokens"), ({"samples": 0}, "--samples")):
        with pytest.raises(UsageError, match=name):
            check_model("tiny-falcon", **kw)


def test_r1_on_gguf_stops_once_settled_and_says_so(tmp_path):
    """The GELU falcon's ~0 % is settled long before 60 texts: the result names how many texts
    it measured and the interval; --full-calibration (ctx.full_calibration) runs every text."""
    from aios.models.aliases import FIXTURES_DIR
    from convert.gguf import GGUFExportConfig, export_gguf

    out = tmp_path / "gelu.gguf"
    export_gguf(str(FIXTURES_DIR / "tiny-falcon"), out, GGUFExportConfig(outtype="f32"))
    early = r1_sparsity.check(resolve_model(str(out)), ctx(60))
    texts = early.metric("calibration_texts")
    assert 24 <= texts.value < 60 and "settled" in texts.note
    d = early.details["early_decision"]
    assert d["texts_measured"] == texts.value and d["texts_in_set"] == 60 and d["interval"][1] < 0.7
    assert early.status == Status.failed and f"on {texts.value} of 60 calibration texts" in early.summary
    full_ctx = ctx(60)
    full_ctx.full_calibration = True
    full = r1_sparsity.check(resolve_model(str(out)), full_ctx)
    assert full.metric("calibration_texts").value == 60 and "early_decision" not in full.details
    assert full.metric("calibration_tokens").value > early.metric("calibration_tokens").value
