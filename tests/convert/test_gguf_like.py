"""aios-convert gguf --like SOURCE.gguf: each tensor in the type the source file has for it, so a
model converted from a llama.cpp Q4_K_M file (relufy, sparsify + fine-tune) goes back into the
same quant mix, and llama.cpp loads the result."""

from __future__ import annotations

import shutil

import gguf
import numpy as np
import pytest
from click.testing import CliRunner

from aios.errors import ModelNotFoundError
from aios.models.aliases import FIXTURES_DIR
from aios.reference import llamacpp
from convert.cli import main
from convert.gguf import GGUFExportConfig, export_gguf
from tests.conftest import build_hf_model

LLAMA_FTYPE_MOSTLY_Q4_K_M = 15  # llama.h's llama_ftype


def _types(path) -> dict[str, str]:
    return {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors}


@pytest.fixture(scope="module")
def q4_k_m(tmp_path_factory):
    """A tiny Llama at d_model 256 and llama.cpp's own Q4_K_M of it (Q4_K, Q6_K, and Q5_0/Q8_0
    where llama.cpp's mix picks them)."""
    root = tmp_path_factory.mktemp("like")
    src = build_hf_model("llama", root / "tiny", vocab_size=2048, hidden_size=256, intermediate_size=512)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(FIXTURES_DIR / "tiny-falcon" / f, src / f)
    f16, q4 = root / "m.f16.gguf", root / "m.q4_k_m.gguf"
    export_gguf(str(src), f16, GGUFExportConfig("f16"))
    llamacpp.quantize(f16, q4, LLAMA_FTYPE_MOSTLY_Q4_K_M)
    return src, q4


def test_like_copies_the_source_mix_and_llama_cpp_loads_it(q4_k_m, tmp_path):
    src, q4 = q4_k_m
    out = tmp_path / "like.gguf"
    res = export_gguf(str(src), out, GGUFExportConfig("f16", like=str(q4)))
    theirs, ours = _types(q4), _types(out)
    assert set(ours) == set(theirs)
    assert {"Q4_K", "Q6_K"} <= set(theirs.values())
    assert ours == theirs  # every type of this mix is one the exporter encodes
    assert not res.fallbacks
    r = gguf.GGUFReader(str(out))
    assert int(r.get_field("general.file_type").contents()) == LLAMA_FTYPE_MOSTLY_Q4_K_M
    assert r.get_field("general.quantization_version") is not None
    assert llamacpp.load_error(out) is None  # llama.cpp loads it
    prov = res.metadata["aios.provenance"]
    assert '"like": "m.q4_k_m.gguf"' in prov  # the file's name, not a machine's path
    # our encoding of the mix is about as close to the f16 model as llama.cpp's own
    from runtime.model import Model

    ids = list(range(5, 40))
    ref = Model(q4.with_name("m.f16.gguf"), arithmetic="float").forward(ids, all_logits=True)
    ours_err = np.sqrt(np.mean((Model(out, arithmetic="float").forward(ids, all_logits=True) - ref) ** 2))
    theirs_err = np.sqrt(np.mean((Model(q4, arithmetic="float").forward(ids, all_logits=True) - ref) ** 2))
    assert ours_err < 1.5 * theirs_err, (ours_err, theirs_err)


def test_types_the_source_lacks_or_cannot_be_encoded_are_reported(q4_k_m, tmp_path):
    from convert.gguf import tensors as gt

    src, q4 = q4_k_m
    mixed = tmp_path / "mixed.gguf"  # the source with one tensor in a type we do not encode (Q5_K)
    r = gguf.GGUFReader(str(q4))
    name = next(t.name for t in r.tensors if t.name.endswith("ffn_up.weight"))
    types, ft = gt.like_types(q4)
    assert ft == LLAMA_FTYPE_MOSTLY_Q4_K_M and types[name][1] is None
    types[name] = (gt.LIKE_SUBSTITUTE["Q5_K"], "x.gguf has Q5_K, which this exporter does not encode")
    del types["output_norm.weight"]  # 1-D tensors stay F32 whatever the source says
    from aios.models import resolve_model
    from convert.gguf.plan import plan_tensors

    plan = {p.name: p for p in plan_tensors(resolve_model(str(src)), "q8_0", like=types)}
    assert plan[name].outtype == "q6_k" and "Q5_K" in plan[name].fallback
    assert plan["output_norm.weight"].outtype == "f32"
    del types["token_embd.weight"]
    plan = {p.name: p for p in plan_tensors(resolve_model(str(src)), "q8_0", like=types)}
    assert plan["token_embd.weight"].outtype == "q8_0"  # not in the source: --outtype
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        gt.like_types(tmp_path / "nope.gguf")
    r = CliRunner().invoke(main, ["gguf", str(src), "-o", str(tmp_path / "o.gguf"), "--like",
                                  str(tmp_path / "nope.gguf")])
    assert r.exit_code == 4 and "does not exist" in r.output and not (tmp_path / "o.gguf").exists()
    r = CliRunner().invoke(main, ["gguf", str(src), "-o", str(tmp_path / "o.gguf"), "--like", str(q4)])
    assert r.exit_code == 0, r.output
    assert "types of m.q4_k_m.gguf" in r.output
    del mixed


def test_like_with_sparse_down_keeps_the_down_projections_types(q4_k_m, tmp_path):
    src, q4 = q4_k_m
    out = tmp_path / "like-sd.gguf"
    export_gguf(str(src), out, GGUFExportConfig("f16", like=str(q4), sparse_down=True))
    theirs, ours = _types(q4), _types(out)
    downs = [n for n in theirs if n.endswith("ffn_down.weight")]
    assert downs and all(ours[n.replace(".weight", ".t")] == theirs[n] for n in downs)  # d_model 256 fits
    assert {n: t for n, t in ours.items() if not n.endswith(".t")} == \
        {n: t for n, t in theirs.items() if n not in downs}


def test_alias_exports_in_the_source_mix(q4_k_m, tmp_path):
    """aios-convert alias --like: the de-aliased file (llama.cpp's) is the source's mix exactly;
    the aliased one (aios-run's) keeps it for every plain tensor, gives each canonical its first
    member's type (low-rank deltas: --outtype), and runs in aios-run close to the F32 export of
    the same aliased model."""
    from runtime.model import Model

    src, q4 = q4_k_m
    theirs = _types(q4)
    r = CliRunner().invoke(main, ["alias", str(src), "-o", str(tmp_path / "al"), "--zones", "all", "--min-cosine", "0.5", "--gguf", str(tmp_path / "al.gguf"), "--dealias", str(tmp_path / "de.gguf"),
                                  "--like", str(q4)])
    assert r.exit_code == 0, r.output
    assert _types(tmp_path / "de.gguf") == theirs
    assert llamacpp.load_error(tmp_path / "de.gguf") is None
    ours = _types(tmp_path / "al.gguf")
    plain = {n: t for n, t in ours.items() if ".canonical" not in n and ".delta" not in n}
    assert plain and all(theirs[n] == t for n, t in plain.items())
    canon = [n for n in ours if ".canonical" in n]
    assert canon
    for n in canon:  # blk.0.attn_q.canonical: the first member's (blk.0.attn_q.weight's) type
        assert ours[n] == theirs[n.replace(".canonical", ".weight")], n
    factors = [n for n in ours if ".delta.lr_" in n]  # low-rank deltas (the default): --outtype's F32
    assert factors and all(ours[n] == "F32" for n in factors)
    from convert.alias.export import export_alias_gguf

    export_alias_gguf(tmp_path / "al", tmp_path / "al32.gguf")  # the same aliased model in F32
    ids = list(range(5, 40))
    ref = Model(tmp_path / "al32.gguf", arithmetic="float").forward(ids, all_logits=True)
    got = Model(tmp_path / "al.gguf", arithmetic="float").forward(ids, all_logits=True)
    f16 = Model(q4.with_name("m.f16.gguf"), arithmetic="float").forward(ids, all_logits=True)
    quantized = np.corrcoef(Model(q4, arithmetic="float").forward(ids, all_logits=True).ravel(), f16.ravel())[0, 1]
    assert np.corrcoef(got.ravel(), ref.ravel())[0, 1] > quantized - 0.01  # as close as llama.cpp's own Q4_K_M
    r = CliRunner().invoke(main, ["alias", str(tmp_path / "al"), "--like", str(q4)])
    assert r.exit_code == 2 and "--gguf" in r.output


def test_svd_residual_in_the_source_mix(q4_k_m, tmp_path):
    """aios-convert svd-residual --like: plain tensors in the source's types, each residual in the
    type the source has for the matrix it replaces; aios-run runs it about as close to the F16
    model as llama.cpp's Q4_K_M of it is."""
    from runtime.model import Model

    src, q4 = q4_k_m
    theirs = _types(q4)
    out = tmp_path / "lr.gguf"
    r = CliRunner().invoke(main, ["svd-residual", str(src), "-o", str(out), "--rank", "8", "--method", "plain",
                                  "--eval-tokens", "0", "--like", str(q4)])
    assert r.exit_code == 0, r.output
    ours = _types(out)
    plain = {n: t for n, t in ours.items() if not any(s in n for s in (".lr_u", ".lr_v", ".residual"))}
    assert plain and all(theirs[n] == t for n, t in plain.items())
    residuals = [n for n in ours if n.endswith(".residual")]
    assert residuals and all(ours[n] == theirs[n.replace(".residual", ".weight")] for n in residuals)
    assert {"Q4_K", "Q6_K"} <= {ours[n] for n in residuals}
    meta = gguf.GGUFReader(str(out)).get_field("aios.provenance").contents()
    assert '"like": "m.q4_k_m.gguf"' in meta
    ids = list(range(5, 40))
    f16 = Model(q4.with_name("m.f16.gguf"), arithmetic="float").forward(ids, all_logits=True)
    quantized = np.corrcoef(Model(q4, arithmetic="float").forward(ids, all_logits=True).ravel(), f16.ravel())[0, 1]
    got = Model(out, arithmetic="float").forward(ids, all_logits=True)
    assert np.corrcoef(got.ravel(), f16.ravel())[0, 1] > quantized - 0.01  # as close as llama.cpp's Q4_K_M
