"""``aios-convert sparsify --scope all --input-major``: every matrix a cut input feeds is stored
input-major (``blk.N.X.t``), and ``aios-run --mode sparse`` reads only the rows of each token's
nonzero inputs of q/k/v, o, gate/up and down (runtime.model.Model._project).

The reference is the dense run of the same file (every row summed): a kernel that skipped the
wrong rows, or a site whose rows were read for zero inputs, moves the logits or the byte count."""

from __future__ import annotations


import gguf
import numpy as np
import pytest
from click.testing import CliRunner

from convert.sparsify import SparsifyConfig, sparsify
from convert.sparsify.write import WIDER
from runtime.generate import generate
from runtime.model import Model
from runtime.thresholds import INPUT_SITES, SITE_MATRICES
from tests.conftest import build_hf_model, with_tokenizer

SMALL = dict(tokens=192, sensitivity_tokens=64, window=64, heldout_tokens=0)
IDS = list(range(5, 29))
# what the source files are exported as: the float types and a block type of each family the
# re-encoder writes (every output width here is 256 or 512, so K-quant rows fit)
OUTTYPES = ["f32", "f16", "q8_0", "q4_0", "q4_k", "q6_k"]
MAJOR = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """Factory: outtype -> a Qwen2-style GGUF (q/k/v biases; d_model 256, d_ffn 512, 4 KV heads
    of 64), made once per type."""
    from convert.gguf import GGUFExportConfig, export_gguf

    root = tmp_path_factory.mktemp("input-major")
    src = with_tokenizer(build_hf_model("qwen2", root / "hf", hidden_size=256, intermediate_size=512,
                                        vocab_size=2048, num_attention_heads=4, num_key_value_heads=4))
    made = {}

    def make(outtype):
        if outtype not in made:
            p = root / f"src.{outtype}.gguf"
            export_gguf(str(src), p, GGUFExportConfig(outtype))
            out = root / f"major.{outtype}.gguf"
            res = sparsify(p, out, SparsifyConfig(target=0.5, scope="all", input_major=True, **SMALL))
            made[outtype] = (p, out, res)
        return made[outtype]

    return make


# every stored type sums its rows in a kernel: gguf-py's row decoding is refused (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("no_row_decoding")


@pytest.mark.parametrize("outtype", OUTTYPES)
def test_every_cut_matrix_is_stored_input_major_in_its_own_type(source, outtype):
    src, out, res = source(outtype)
    r = gguf.GGUFReader(str(out))
    names = {t.name: t for t in r.tensors}
    src_names = {t.name: t for t in gguf.GGUFReader(str(src)).tensors}
    for i in range(2):
        for m in MAJOR:
            assert f"blk.{i}.{m}.weight" not in names
            t, s = names[f"blk.{i}.{m}.t"], src_names[f"blk.{i}.{m}.weight"]
            assert [int(x) for x in t.shape] == [int(x) for x in s.shape][::-1]  # n_in rows of n_out
            # one step wider than the source (the default): every output width here fits the blocks
            want = WIDER.get(s.tensor_type.name.lower(), s.tensor_type.name.lower())
            assert t.tensor_type.name.lower() == want
        assert f"blk.{i}.attn_q.bias" in names  # biases as they were
    assert sorted(r.get_field("aios.input_major.matrices").contents()) == sorted(MAJOR)
    assert not [w for w in res.warnings if "stored as" in w and "block" in w]  # no width falls back


def _steps(model, ids=IDS, n=6):
    """The prompt ids[:-n] as one chunk, then n decode steps: their logits (n, vocab)."""
    model.forward(ids[:-n])
    return np.vstack([model.forward([t]) for t in ids[-n:]])


@pytest.mark.parametrize("outtype", OUTTYPES)
def test_sparse_mode_reads_the_rows_of_nonzero_inputs_and_equals_dense(source, outtype):
    _, out, _ = source(outtype)
    dense, sparse = Model(out, arithmetic="float"), Model(out, mode="sparse", arithmetic="float")
    # a prompt: the same chunk product in both modes (the rows nonzero in some token, decoded once)
    assert np.array_equal(dense.forward(IDS, all_logits=True), sparse.forward(IDS, all_logits=True))
    dense.reset(), sparse.reset()
    a, b = _steps(dense), _steps(sparse)  # decode steps: every row summed / the active rows only
    assert np.abs(a - b).max() <= 1e-4 * max(1.0, np.abs(a).max())
    # one decode step: each input-major tensor's bytes = its row bytes × the token's nonzero inputs
    seen: dict = {}
    sparse.input_hook = lambda layer, site, x: seen.__setitem__((layer, site), x.copy())
    nnz_down: dict = {}
    sparse.ffn_act_hook = lambda layer, y: nnz_down.__setitem__(layer, int(np.count_nonzero(y[0])))
    sparse.counter.reset()
    sparse.forward([IDS[-1]])
    cuts = sparse.input_cuts
    for i, L in enumerate(sparse.layers):
        for site in INPUT_SITES:
            nz = int(np.count_nonzero(cuts.cut(seen[(i, site)], i, site)[0]))
            assert 0 < nz < seen[(i, site)].shape[1]
            for m in SITE_MATRICES[site]:
                if f"{m}.T" in L:
                    assert sparse.counter.per_tensor[f"blk.{i}.{m}.t"] == nz * L[f"{m}.T"].row_bytes, (i, m)
        assert sparse.counter.per_tensor[f"blk.{i}.ffn_down.t"] == nnz_down[i] * L["ffn_down.T"].row_bytes
    d_text, td = generate(Model(out, arithmetic="float"), IDS, 8)
    s_text, ts = generate(Model(out, mode="sparse", arithmetic="float"), IDS, 8)
    assert s_text == d_text
    layers = lambda t: sum(v for k, v in t.items() if k.startswith("blk."))  # noqa: E731
    assert ts.decode_bytes["weights"] < td.decode_bytes["weights"]
    assert layers(sparse.counter.per_tensor) < 0.75 * sum(
        p.nbytes for L in sparse.layers for k, op in L.items() if k.endswith(".weight") and hasattr(op, "parts")
        for p in op.parts())


@pytest.mark.parametrize("outtype", ["q8_0", "q4_k"])
def test_int8_arithmetic_sparse_text_equals_dense(source, outtype):
    _, out, _ = source(outtype)
    d_text, _ = generate(Model(out, arithmetic="int8"), IDS, 8)
    s_text, _ = generate(Model(out, mode="sparse", arithmetic="int8"), IDS, 8)
    assert s_text == d_text


def test_a_kernel_that_skips_the_wrong_rows_is_caught(source, monkeypatch):
    """Mutation check of the test above: the sparse sum over every active row but the first."""
    from runtime.sparse_down import NeuronRows

    _, out, _ = source("q8_0")
    a = _steps(Model(out, arithmetic="float"))
    real = NeuronRows.sparse_matvec
    monkeypatch.setattr(NeuronRows, "sparse_matvec",
                        lambda self, x, active, arith=None: real(self, x, active if len(active) == self.n_in
                                                                 else active[1:]))
    b = _steps(Model(out, mode="sparse", arithmetic="float"))
    assert np.abs(a - b).max() > 1e-3 * max(1.0, np.abs(a).max())


def test_scope_ffn_input_major_is_the_down_projection_alone_and_same_keeps_the_type(source, tmp_path):
    src, _, _ = source("q4_0")
    out = tmp_path / "ffn.gguf"
    sparsify(src, out, SparsifyConfig(target=0.5, input_major=True, input_major_type="same", **SMALL))
    names = {t.name: t for t in gguf.GGUFReader(str(out)).tensors}
    assert "blk.0.ffn_down.t" in names and "blk.0.attn_q.weight" in names and "blk.0.ffn_up.weight" in names
    assert names["blk.0.ffn_down.t"].tensor_type.name == "Q4_0"


def test_cli_input_major(source, tmp_path):
    from convert.cli import main

    src, _, _ = source("q8_0")
    out = tmp_path / "cli.gguf"
    r = CliRunner().invoke(main, ["sparsify", str(src), "-o", str(out), "--scope", "all", "--input-major",
                                  "--tokens", "128", "--heldout-tokens", "0"])
    assert r.exit_code == 0, r.output
    names = {t.name for t in gguf.GGUFReader(str(out)).tensors}
    assert {f"blk.1.{m}.t" for m in MAJOR} <= names


def test_check_measures_every_site_and_the_projection_counts_them(source):
    """R1's run measures each cut input site's zeros; the projection applies them to the matrices
    each site feeds (q/k/v, o, gate/up) and lands near the runtime's measured sparse bytes."""
    from aios.data import load_texts
    from aios.models import resolve_model
    from contract.checks import r1_sparsity
    from contract.checks.base import CheckContext
    from contract.projection import project, weight_bytes_by_role

    src, out, _ = source("q8_0")
    h = resolve_model(str(out))
    roles, _ = weight_bytes_by_role(h)
    n = {t.name: int(t.n_bytes) for t in gguf.GGUFReader(str(out)).tensors if t.name.endswith(".t")}
    assert roles["attn_in"] == pytest.approx(sum(v for k, v in n.items() if k.split(".")[2:3] in (["attn_q"], ["attn_k"],
                                                                                                    ["attn_v"])))
    assert roles["attn_out"] == pytest.approx(sum(v for k, v in n.items() if ".attn_output." in k))
    r1 = r1_sparsity.check(h, CheckContext(calibration_texts=load_texts(None, 8), max_tokens=48))
    fr = {x: r1.metric(f"{x}_exact_zero_fraction").value for x in INPUT_SITES}
    assert all(0.3 < v < 0.7 for v in fr.values()), fr
    p = project(h, {"R1": r1}, 64, "optimized")
    attn = next(t for t in p.terms if t.term.startswith("weights: attention projections"))
    assert attn.projected_bytes == pytest.approx(roles["attn_in"] * (1 - fr["attn_in"])
                                                 + roles["attn_out"] * (1 - fr["attn_out"]))
    ffn = next(t for t in p.terms if t.term == "weights: FFN outside core zone")
    s = r1.metric("mean_exact_zero_fraction").value
    assert ffn.projected_bytes == pytest.approx((roles["ffn_gate"] + roles["ffn_up"]) * (1 - fr["ffn_in"])
                                                + roles.get("ffn_down", 0.0) * (1 - s))
    # the standard file's projection (no input cuts measured) skips only what R1 measures
    base = project(resolve_model(str(src)), {}, 64, "optimized")
    assert p.projected_reduction > base.projected_reduction + 0.2
