"""``--sparse-down`` on the other converters that write FFN weights: ``aios-convert alias --gguf``
(canonical + delta) and ``aios-convert svd-residual`` (low-rank + residual).

Their down projections are stored neuron-major (``.t`` tensors), so the sparse modes read only
the rows of firing neurons: sparse equals dense on the same file (float arithmetic: logits within
1e-5 of the largest; int8 arithmetic: the same greedy text), dense equals the standard layout's
dense where the stored values are the same (F16: elementwise), the values equal gguf-py's
decoding of the stored tensors, and the bytes counted per token are exactly the stored rows
touched (plus a low-rank U, read whole)."""

from __future__ import annotations

import shutil

import gguf
import numpy as np
import pytest
from click.testing import CliRunner

from aios.errors import UsageError
from aios.models import alias_format as af
from aios.models import resolve_model
from aios.models.aliases import FIXTURES_DIR
from convert.alias_gguf import export_alias_gguf
from convert.svd_residual import SvdResidualConfig, svd_residual
from runtime.generate import generate
from runtime.model import Model
from runtime.sparse_down import NeuronMajorSum
from runtime.weights import Matrix
from tests.conftest import build_hf_model
from tests.convert.test_alias import build_alias_folder

IDS = list(range(5, 29))
RELU = FIXTURES_DIR / "tiny-falcon-relu"  # d_model 128, d_ffn 512, 6 layers (core zone 2-3)

pytestmark = pytest.mark.usefixtures("one_thread")  # see tests/conftest.py


@pytest.fixture(scope="module")
def aliased(tmp_path_factory):
    """Factory: (delta, outtype, sparse_down) -> an aliased GGUF of the relufied Falcon. Deltas
    of the core zone only (layers 2-3), so the other layers keep a plain down projection."""
    root = tmp_path_factory.mktemp("alias-sd")
    folders: dict = {}
    made: dict = {}

    def make(delta: str, outtype: str, sparse_down: bool = True):
        key = (delta, outtype, sparse_down)
        if key not in made:
            if delta not in folders:
                folders[delta] = build_alias_folder(RELU, root / f"f-{delta.replace(':', '')}", zones="core",
                                                    delta=delta)
            out = root / f"a-{delta.replace(':', '')}-{outtype}-{int(sparse_down)}.gguf"
            made[key] = export_alias_gguf(folders[delta], out, outtype=outtype, sparse_down=sparse_down)
        return made[key].output

    return make


SVD = {  # name -> (source, config); plain SVD: no calibration run
    "q8_0": (RELU, SvdResidualConfig(rank=8, method="plain", residual="q8_0", factor_type="f16", outtype="q8_0")),
    "q4_0": (RELU, SvdResidualConfig(rank=8, method="plain", residual="q4_0", factor_type="f16", outtype="q4_0")),
    "f16": (RELU, SvdResidualConfig(rank=8, method="plain", residual="f16", factor_type="f16", outtype="f16")),
    # d_model 256: the neuron-major residual rows hold whole Q4_K super-blocks; rank 32 fills Q8_0 factor rows
    "q4_k": ("gated-256", SvdResidualConfig(rank=32, method="plain", residual="q4_k", factor_type="q8_0",
                                            outtype="q8_0")),
}


@pytest.fixture(scope="module")
def lowrank(tmp_path_factory):
    """Factory: (case, sparse_down) -> an svd-residual GGUF (see ``SVD``)."""
    from dataclasses import replace

    root = tmp_path_factory.mktemp("svd-sd")
    made: dict = {}

    def make(case: str, sparse_down: bool = True):
        key = (case, sparse_down)
        if key not in made:
            src, cfg = SVD[case]
            if src == "gated-256":
                src = root / "gated"
                if not src.exists():
                    build_hf_model("llama", src, hidden_size=256, intermediate_size=512, vocab_size=2048,
                                   hidden_act="relu")
                    for f in ("tokenizer.json", "tokenizer_config.json"):
                        shutil.copy(FIXTURES_DIR / "tiny-falcon" / f, src / f)
            made[key] = svd_residual(str(src), root / f"{case}-{int(sparse_down)}.gguf",
                                     replace(cfg, sparse_down=sparse_down))
        return made[key].output

    return make


def _tensors(path) -> dict:
    return {t.name: t for t in gguf.GGUFReader(str(path)).tensors}


def _deq(t) -> np.ndarray:
    """A stored tensor as float64 (numpy order) by gguf-py's dequantizer, not the runtime's."""
    shape = tuple(int(x) for x in reversed(t.shape))
    return gguf.dequantize(t.data, t.tensor_type).astype(np.float64).reshape(shape)


def _down_reference(path) -> Model:
    """A dense model of ``path`` whose down projections are F32 matrices rebuilt from the stored
    neuron-major tensors by gguf-py: Σ of each term (Xᵀ transposed back, U·(Vᵀ)ᵀ)."""
    t = _tensors(path)
    model = Model(path, arithmetic="float")
    for i, L in enumerate(model.layers):
        op = L["ffn_down.weight"]
        W = np.zeros((op.n_out, op.n_in))
        names = [p.name for p in op.parts()]  # the stored tensors behind the operator
        lr_u = [n for n in names if n.endswith(".lr_u")]
        for n in names:
            if n.endswith((".lr_v.t", ".lr_u")):
                continue
            W += _deq(t[n]).T  # canonical.t, delta.t, ffn_down.t, residual.t
        if lr_u:
            (u,) = lr_u
            vt = next(n for n in names if n.endswith(".lr_v.t"))
            W += _deq(t[u]) @ _deq(t[vt]).T
        L["ffn_down.weight"] = Matrix(f"blk.{i}.ffn_down.ref", "F32", op.n_out, op.n_in, W.astype(np.float32))
    return model


def _close(a: np.ndarray, b: np.ndarray, tol: float = 1e-5) -> None:
    assert np.abs(a - b).max() <= tol * max(1.0, np.abs(b).max()), np.abs(a - b).max()


def _sparse_equals_dense(path) -> None:
    dense = Model(path, arithmetic="float").forward(IDS, all_logits=True)
    sparse = Model(path, mode="sparse", arithmetic="float").forward(IDS, all_logits=True)
    _close(sparse, dense)
    _close(dense, _down_reference(path).forward(IDS, all_logits=True))
    d_text, _ = generate(Model(path, arithmetic="float"), IDS, 10)
    s_text, _ = generate(Model(path, mode="sparse", arithmetic="float"), IDS, 10)
    assert s_text == d_text


# --- aliased files -------------------------------------------------------------------------


@pytest.mark.parametrize("delta", ["lowrank:8", "q8_0", "dense"])
@pytest.mark.parametrize("outtype", ["q8_0", "q4_0"])
def test_aliased_sparse_equals_dense(aliased, delta, outtype):
    path = aliased(delta, outtype)
    names = _tensors(path)
    assert not any(n.endswith("ffn_down.weight") or n == "blk.0.ffn_down.canonical" for n in names)
    assert "blk.0.ffn_down.t" in names and "blk.2.ffn_down.canonical.t" in names  # plain outside the core zone
    t = names["blk.2.ffn_down.canonical.t"]
    assert t.tensor_type.name == outtype.upper() and [int(x) for x in t.shape] == [128, 512]
    if delta == "lowrank:8":  # U as is (d_model x R), V transposed (d_ffn rows of R: F16, 8 fits no block)
        assert [int(x) for x in names["blk.3.ffn_down.delta.lr_u"].shape] == [8, 128]
        assert [int(x) for x in names["blk.3.ffn_down.delta.lr_v.t"].shape] == [8, 512]
    else:
        assert [int(x) for x in names["blk.3.ffn_down.delta.t"].shape] == [128, 512]
    groups = af.groups_of(resolve_model(str(path)))
    down = next(g for g in groups if g.canonical.endswith("ffn_down.canonical.t"))
    assert all(n.endswith((".t", ".lr_u")) for m in down.members for n in m.tensors)
    m = Model(path, mode="sparse", arithmetic="float")
    assert isinstance(m.layers[3]["ffn_down.T"], NeuronMajorSum)
    _sparse_equals_dense(path)


@pytest.mark.parametrize("delta", ["lowrank:8", "dense"])
def test_aliased_sparse_down_dense_logits_equal_the_standard_layout(aliased, delta):
    """F16 stores each value the same whatever the layout: same values, different layout."""
    nm, std = aliased(delta, "f16", True), aliased(delta, "f16", False)
    assert "blk.2.ffn_down.canonical" in _tensors(std)
    _close(Model(nm, arithmetic="float").forward(IDS, all_logits=True), Model(std, arithmetic="float").forward(IDS, all_logits=True))


def test_aliased_sparse_down_metadata_and_ratio(aliased):
    nm, std = aliased("lowrank:8", "q8_0", True), aliased("lowrank:8", "q8_0", False)
    h, hs = resolve_model(str(nm)), resolve_model(str(std))
    assert "neuron-major" in h.store.field("aios.sparse_down.format")
    assert "llama.cpp" in h.store.field("aios.sparse_down.runtime")
    assert hs.store.field("aios.sparse_down.format") is None
    assert '"sparse_down": true' in h.store.field("aios.provenance")
    assert '"sparse_down"' not in hs.store.field("aios.provenance")
    # the ratio the file declares is the shared definition on its own tensors (the plain layers'
    # blk.N.ffn_down.t counted as their down projection)
    r = af.ratio_of(h)
    assert h.store.field("aios.alias.core_aliasing_ratio") == pytest.approx(r.core_ratio, abs=1e-6)
    assert h.store.field("aios.alias.model_aliasing_ratio") == pytest.approx(r.model_ratio, abs=1e-6)
    assert r.model_bytes == af.ratio_of(hs).model_bytes  # every layer's down projection in the denominator
    # Vᵀ's rows of R = 8 values fit no Q8_0 block: stored F16, more bytes than V's Q8_0 rows, which
    # the ratio counts (the price of reading V per neuron); with F16 everywhere the ratios are equal
    names, std_names = _tensors(nm), _tensors(std)
    extra = sum(int(names[f"blk.{i}.ffn_down.delta.lr_v.t"].n_bytes)
                - int(std_names[f"blk.{i}.ffn_down.delta.lr_v"].n_bytes) for i in (2, 3))
    assert names["blk.2.ffn_down.delta.lr_v.t"].tensor_type.name == "F16" and extra > 0
    assert af.ratio_of(hs).core_saved - r.core_saved == pytest.approx(extra, abs=1)
    f16 = [resolve_model(str(aliased("lowrank:8", "f16", sd))).store for sd in (True, False)]
    assert f16[0].field("aios.alias.core_aliasing_ratio") == f16[1].field("aios.alias.core_aliasing_ratio")


# --- svd-residual files --------------------------------------------------------------------


@pytest.mark.parametrize("case", ["q8_0", "q4_0", "q4_k"])
def test_lowrank_sparse_equals_dense(lowrank, case):
    path = lowrank(case)
    names = _tensors(path)
    assert "blk.0.ffn_down.lr_v" not in names and "blk.0.ffn_down.residual" not in names
    res, v, u = names["blk.0.ffn_down.residual.t"], names["blk.0.ffn_down.lr_v.t"], names["blk.0.ffn_down.lr_u"]
    d_ffn, d_model = int(res.shape[1]), int(res.shape[0])
    assert res.tensor_type.name == case.upper() and d_ffn == 512
    assert [int(x) for x in v.shape] == [int(u.shape[0]), d_ffn]  # Vᵀ: d_ffn rows of r
    assert "blk.0.ffn_up.residual" in names  # the other matrices keep the standard layout
    h = resolve_model(str(path))
    assert h.store.field("aios.sparse_down.layers") == h.facts.n_layers
    assert "lr_v.t" in h.store.field("aios.sparse_down.format")
    assert "neuron-major" in h.store.field("aios.lowrank.residual_layouts")
    _sparse_equals_dense(path)


def test_lowrank_k_residual_falls_back_on_rows_it_cannot_tile(lowrank):
    """d_model 128 holds no 256-value super-block: a Q4_K residual's neuron-major rows are Q4_0,
    declared, and the standard file keeps its flat Q4_K residual for the other matrices."""
    from dataclasses import replace

    from convert.svd_residual import compress

    rng = np.random.default_rng(0)
    W = rng.standard_normal((128, 512))
    c = compress(W, replace(SVD["q8_0"][1], residual="q4_k"), neuron_major=True)
    assert c.residual_type == "q4_0" and c.residual_layout == "neuron-major"
    assert any("Q4_K" in n for n in c.notes)
    arr, typ, shape = c.tensors["residual.t"]
    assert typ == "q4_0" and shape == (512, 128) and set(c.tensors) == {"lr_u", "lr_v.t", "residual.t"}


def test_lowrank_sparse_down_dense_logits_equal_the_standard_layout(lowrank):
    nm, std = lowrank("f16", True), lowrank("f16", False)
    assert "blk.0.ffn_down.residual" in _tensors(std)
    _close(Model(nm, arithmetic="float").forward(IDS, all_logits=True), Model(std, arithmetic="float").forward(IDS, all_logits=True))


# --- int8 arithmetic -----------------------------------------------------------------------


@pytest.mark.parametrize("kind, case", [("alias", "q8_0"), ("alias", "q4_0"), ("svd", "q8_0"), ("svd", "q4_0"),
                                        ("svd", "q4_k")])
def test_int8_arithmetic_sparse_text_equals_dense(aliased, lowrank, kind, case):
    path = aliased("lowrank:8", case) if kind == "alias" else lowrank(case)
    d_text, _ = generate(Model(path, arithmetic="int8"), IDS, 10)
    s_text, _ = generate(Model(path, mode="sparse", arithmetic="int8"), IDS, 10)
    assert s_text == d_text


# --- bytes ---------------------------------------------------------------------------------


def _expected_down_reads(path, model: Model, active: dict[int, int]) -> dict[str, int]:
    """Bytes one decode token reads of each stored down-projection tensor: every ``.t`` tensor's
    stored row bytes (its bytes / d_ffn) times the layer's firing neurons, a U whole when any fires."""
    t = _tensors(path)
    want: dict[str, int] = {}
    for i, L in enumerate(model.layers):
        for p in L["ffn_down.T"].parts():
            d_ffn = model.hp.d_ffn
            n = p.name
            nbytes = int(t[n].n_bytes) // d_ffn * active[i] if n.endswith(".t") else \
                (int(t[n].n_bytes) if active[i] else 0)
            want[n] = want.get(n, 0) + nbytes
    return {k: v for k, v in want.items() if v}


@pytest.mark.parametrize("kind", ["alias-lowrank", "alias-q8_0", "svd"])
def test_sparse_bytes_are_the_stored_rows_touched(aliased, lowrank, kind):
    path = {"alias-lowrank": lambda: aliased("lowrank:8", "q4_0"), "alias-q8_0": lambda: aliased("q8_0", "q8_0"),
            "svd": lambda: lowrank("q4_0")}[kind]()
    dense, sparse = Model(path, arithmetic="float"), Model(path, mode="sparse", arithmetic="float")
    for m in (dense, sparse):
        m.forward(IDS)
    active: dict[int, int] = {}
    sparse.ffn_act_hook = lambda layer, a: active.__setitem__(layer, int(np.count_nonzero(a[0])))
    for m in (dense, sparse):
        m.counter.reset()
        m.forward([IDS[-1]])
    assert sum(active.values()) > 0 and all(active[i] < 512 for i in range(6)), active
    got = {k: v for k, v in sparse.counter.per_tensor.items() if "ffn_down" in k and v}
    assert got == _expected_down_reads(path, sparse, active)
    # dense reads every stored byte of the same tensors; the difference is the rows skipped (and
    # a U of a layer where nothing fired)
    t = _tensors(path)
    skipped = sum(int(t[p.name].n_bytes) // 512 * (512 - active[i]) if p.name.endswith(".t")
                  else (0 if active[i] else int(t[p.name].n_bytes))
                  for i, L in enumerate(sparse.layers) for p in L["ffn_down.T"].parts())
    assert dense.counter.totals["weights"] - sparse.counter.totals["weights"] == skipped


# --- refusals ------------------------------------------------------------------------------


def test_standard_layout_composites_refuse_the_sparse_modes_with_the_command(aliased, lowrank):
    with pytest.raises(UsageError, match="--sparse-down"):
        Model(aliased("lowrank:8", "q8_0", False), mode="sparse", arithmetic="float")
    with pytest.raises(UsageError, match="--sparse-down"):
        Model(lowrank("q8_0", False), mode="sparse", arithmetic="float")


def test_alias_sparse_down_without_an_aliased_gguf_is_a_usage_error(tmp_path):
    """--sparse-down is a layout of the aliased GGUF: with --dealias alone it is one sentence, exit 2."""
    from convert.cli import main

    out = tmp_path / "d.gguf"
    res = CliRunner().invoke(main, ["alias", str(FIXTURES_DIR / "tiny-falcon-alias"), "--dealias", str(out),
                                    "--sparse-down"])
    assert res.exit_code == 2, res.output
    assert "--gguf" in res.output and "Traceback" not in res.output
    assert len([ln for ln in res.output.splitlines() if ln.strip()]) == 1
    assert not out.exists()


def test_cli_options_write_neuron_major_files(tmp_path):
    from convert.cli import main

    out = tmp_path / "a.gguf"
    res = CliRunner().invoke(main, ["alias", str(FIXTURES_DIR / "tiny-falcon-alias"), "--gguf", str(out),
                                    "--outtype", "q8_0", "--sparse-down"])
    assert res.exit_code == 0, res.output
    assert "neuron-major" in res.output and "llama.cpp" in res.output
    assert any(n.endswith("ffn_down.canonical.t") for n in _tensors(out))
    out2 = tmp_path / "s.gguf"
    res = CliRunner().invoke(main, ["svd-residual", str(RELU), "-o", str(out2), "--rank", "4", "--method", "plain",
                                    "--residual", "q8_0", "--eval-tokens", "0", "--sparse-down"])
    assert res.exit_code == 0, res.output
    assert "llama.cpp cannot load" in " ".join(res.output.split())
    assert "blk.5.ffn_down.residual.t" in _tensors(out2)
