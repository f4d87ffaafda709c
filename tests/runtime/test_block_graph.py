"""runtime.block_graph: one definition of a layer's graph, followed by every route.

Each graph fact is changed on a tiny model (through the same derivation the model uses when it
loads: the architecture row, the hyperparameters or the layer's tensors), and every route runs
the same decode: the step by step path, the glued path (fused_glue, compiled blocks off), the
compiled blocks one layer at a time, and the whole step as one call. Every route must give the
step by step path's logits to the bit, and a compiled form must run exactly when
``block_graph.FORMS`` says it implements the changed layer."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from runtime import block_graph
from runtime.block_graph import BlockGraph, compiled_form
from runtime.model import Model
from runtime.thresholds import INPUT_SITES, InputThresholds
from runtime.weights import Matrix
from tests.runtime.test_decode_block import _dims, _export

IDS = [3, 8, 13, 18, 23, 28]


def _row(m: Model, **changes) -> None:
    m.hp = replace(m.hp, graph=replace(m.hp.graph, **changes))


def _hp(m: Model, **changes) -> None:
    m.hp = replace(m.hp, **changes)


def _tensors(m: Model, names, scale=0.1, base=1.0) -> None:
    rng = np.random.default_rng(7)
    for L in m.layers:
        for name, n in names:
            L[name] = (base + scale * rng.standard_normal(n)).astype(np.float32)


def _qk_norm(m):
    _tensors(m, [("attn_q_norm.weight", m.hp.head_dim), ("attn_k_norm.weight", m.hp.head_dim)])
    _row(m, qk_norm=True)


def _norm_bias(m):  # (LayerNorms: an RMS norm has no bias in any architecture row)
    _tensors(m, [("attn_norm.bias", m.hp.d_model), ("ffn_norm.bias", m.hp.d_model)], base=0.0)
    _row(m, norm="layer")


def _post_norms(m):
    _tensors(m, [("post_attention_norm.weight", m.hp.d_model), ("post_ffw_norm.weight", m.hp.d_model)])
    _row(m, post_norms=True)


def _fused_qkv(m):
    for i, L in enumerate(m.layers):
        q, k, v = (L.pop(f"attn_{x}.weight") for x in "qkv")
        L["attn_qkv.weight"] = Matrix(f"blk.{i}.attn_qkv.weight", q.kind, q.n_out + k.n_out + v.n_out, q.n_in,
                                      np.concatenate([q.data, k.data, v.data]))
    _row(m, fused_qkv=True)


def _cuts(m):  # every input site cut (aios-convert sparsify --scope all)
    n = m.hp.n_layers
    m.input_cuts = InputThresholds({s: np.full(n, 0.3, np.float32) for s in INPUT_SITES})


def _not_gated(m):
    for L in m.layers:
        L.pop("ffn_gate.weight")


# fact -> (how to change it on a tiny Llama 3.1 model, whether the logits must change)
RECIPES = {
    "qk_norm": (_qk_norm, True),
    "rope": (lambda m: _row(m, rope="neox"), True),
    "q_prescale": (lambda m: _row(m, q_prescale=not m.hp.graph.q_prescale), False),  # (the float path has no such rounding)
    "window": (lambda m: _hp(m, window=2, swa_layers=(True,) * m.hp.n_layers), True),
    "local_rope": (lambda m: _hp(m, swa_layers=(True,) * m.hp.n_layers), True),
    "attn_softcap": (lambda m: _hp(m, attn_softcap=0.5), True),
    "norm": (lambda m: _row(m, norm="layer"), True),
    "norm_bias": (_norm_bias, True),
    "post_norms": (_post_norms, True),
    # parallel, the MLP with its own norm (Falcon-40B's); then the MLP on the attention norm's output
    "parallel": (lambda m: _row(m, parallel_attn_default=True, parallel_ffn_norm="ffn_norm"), True),
    "ffn_norm": (lambda m: _row(m, parallel_attn_default=True), True),
    "fused_qkv": (_fused_qkv, False),
    "gated_ffn": (_not_gated, True),
    "fused_gate_up": (lambda m: _row(m, fused_gate_up=True), False),
    "cuts": (_cuts, True),
}
# model facts outside the blocks: the embedding scale (before every route), the final soft cap (after)
MODEL_RECIPES = {
    "embed_scale": lambda m: _row(m, embed_scale=True),
    "final_softcap": lambda m: _hp(m, final_softcap=0.5),
    "activation": lambda m: _hp(m, activation="gelu"),
}


def _regraph(m: Model) -> None:
    m._regraph()  # the model's own: the facts again from the row, hyperparameters, tensors and cuts


def _decode(m: Model) -> np.ndarray:
    m.reset()
    m.counter.reset()
    return np.concatenate([m.forward(IDS[:3])] + [m.forward([t]) for t in IDS[3:]])


def _routes(m: Model) -> dict:
    """Each route's decode logits, and what the compiled routes ran."""
    out = {}
    m.fused_glue = False
    out["step by step"] = _decode(m)
    m.fused_glue = True
    m._block_plans = lambda a: None  # the glued ops, no compiled block
    out["glued"] = _decode(m)
    del m._block_plans
    m._compiled_step = lambda plans, a: None  # compiled blocks, one call per layer
    out["blocks"] = _decode(m)
    plans = m._plans
    del m._compiled_step
    m._step = None
    out["step"] = _decode(m)
    return out, plans, m._step[1] if m._step else None


def _model(tmp_path: Path, arith: str) -> Model:
    outtype = "q8_0" if arith == "int8" else "f16"
    return Model(_export(tmp_path, "llama3", outtype, **_dims("llama3")), arithmetic=arith)


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.fixture(scope="module")
def baselines(tmp_path_factory):
    out = {}
    for arith in ("int8", "float"):
        m = _model(tmp_path_factory.mktemp(arith), arith)
        routes, plans, step = _routes(m)
        assert plans is not None and all(plans) and step is not None, "the unchanged model runs compiled"
        assert all(_same(r, routes["step by step"]) for r in routes.values())
        out[arith] = routes["step by step"]
    return out


@pytest.mark.parametrize("arith", ["int8", "float"])
@pytest.mark.parametrize("fact", sorted(RECIPES))
def test_a_changed_graph_fact_reaches_every_route(tmp_path, baselines, fact, arith):
    m = _model(tmp_path, arith)
    before = m.blocks[0]
    recipe, changes = RECIPES[fact]
    recipe(m)
    _regraph(m)
    assert getattr(m.blocks[0], fact) != getattr(before, fact), f"the recipe did not change {fact}"
    path = "ggml" if m._ggml(m.arith) else "float"
    implemented = compiled_form(m.blocks[0], m._activation(m.arith), path) is not None
    routes, plans, _ = _routes(m)
    ref = routes["step by step"]
    for route, logits in routes.items():
        assert _same(logits, ref), f"{fact} changed: the {route} route differs from the step by step one"
    assert plans is not None and all(p is not None for p in plans) == implemented, (
        f"FORMS says the compiled {path} blocks {'do' if implemented else 'do not'} implement {fact}={getattr(m.blocks[0], fact)!r}")
    if changes and not (fact == "q_prescale" and arith == "float"):
        assert not _same(ref, baselines[arith]), f"changing {fact} did not change the step by step route"


@pytest.mark.parametrize("fact", sorted(MODEL_RECIPES))
def test_a_changed_model_fact_reaches_every_route(tmp_path, baselines, fact):
    m = _model(tmp_path, "int8")
    MODEL_RECIPES[fact](m)
    _regraph(m)
    routes, plans, step = _routes(m)
    for route, logits in routes.items():
        assert _same(logits, routes["step by step"]), f"{fact}: the {route} route differs"
    assert not _same(routes["step by step"], baselines["int8"])
    if fact == "final_softcap":
        assert step is None  # the whole-step call ends at the head: a capped model runs its blocks only
    if fact == "activation":
        assert not any(plans)  # ggml's GELU: no sequential compiled form


def test_every_form_names_every_fact():
    facts = {f for f in BlockGraph.__dataclass_fields__} | {"activation"}
    for form, implemented in block_graph.FORMS.items():
        assert set(implemented) == facts, form
    with pytest.raises(AssertionError, match="lacks"):
        block_graph.check_forms({("ggml", "new"): {"norm": {"rms"}}})


def test_every_graph_field_of_the_architecture_row_lands_somewhere():
    """The row's graph section (between its "the graph" and the next section comment): each field
    is a BlockGraph fact or says why no block route reads it; so is every recipe above."""
    import aios.models.architectures as A

    src = Path(A.__file__).read_text()
    section = src.split("# --- the graph", 1)[1].split("# ---", 1)[0]
    fields = set(re.findall(r"^    (\w+): ", section, re.MULTILINE))
    assert fields == set(block_graph.ROW_FACTS)
    facts = set(BlockGraph.__dataclass_fields__)
    for field, lands in {**block_graph.ROW_FACTS, **block_graph.ROW_FACTS_ELSEWHERE}.items():
        assert lands in facts or lands.startswith("model:"), field
    assert set(RECIPES) == facts
