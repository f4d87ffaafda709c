"""K-quant encoders: ggml's block layouts (read back by gguf-py), error bounds, determinism,
and error against llama.cpp's own quantizer on the same tensors."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf.quants import dequantize as gguf_dequantize
from hypothesis import given
from hypothesis import strategies as st

from aios.errors import UsageError
from convert import kquants as kq
from convert.gguf.tensors import sqnr_db

# SQNR floor on standard-normal rows (measured: 11.6, 16.8, 23.0, 29.0, 35.5 dB)
MIN_SQNR = {"q2_k": 11.0, "q3_k": 16.0, "q4_k": 22.5, "q5_k": 28.5, "q6_k": 35.0}


def roundtrip(x: np.ndarray, t: str, imatrix=None) -> tuple[np.ndarray, np.ndarray]:
    q = kq.quantize(x, t, imatrix)
    return q, gguf_dequantize(q, gguf.GGMLQuantizationType[t.upper()])


@pytest.mark.parametrize("t", kq.TYPES)
def test_layout_and_size_match_ggml(t):
    x = np.random.default_rng(0).standard_normal((3, 512)).astype(np.float32)
    q, y = roundtrip(x, t)
    block, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[t.upper()]]
    assert (block, type_size) == (kq.QK_K, kq.BLOCK_BYTES[t])
    assert q.dtype == np.uint8 and q.shape == (3, 2 * type_size) == (3, kq.row_bytes(512, t))
    assert y.shape == x.shape and sqnr_db(x, y) >= MIN_SQNR[t]


@pytest.mark.parametrize("t", kq.TYPES)
def test_exact_cases(t):
    z = np.zeros((2, 256), np.float32)
    assert not roundtrip(z, t)[1].any()
    c = np.full((1, 256), 3.5, np.float32)  # a power-of-two multiple: exactly representable
    y = roundtrip(c, t)[1]
    assert np.abs(y - c).max() <= 1e-3 * 3.5
    if t in ("q3_k", "q6_k"):  # symmetric: the constant lands on the grid exactly
        assert np.array_equal(y, c)


def test_levels_are_decoded_where_ggml_puts_them():
    """A ramp makes every level appear once per sub-block in order; any packing slip shows."""
    x = np.tile(np.linspace(-1, 1, 32, dtype=np.float32), 8)[None, :]
    for t in kq.TYPES:
        y = roundtrip(x, t)[1]
        assert np.all(np.diff(y.reshape(-1, 32), axis=1) >= -1e-6), t  # monotone in every 32-run
        assert sqnr_db(x, y) > MIN_SQNR[t] - 6, t


values = st.builds(
    lambda kind, rows, blocks, exp, seed: _draw(kind, rows, blocks * 256, 10.0 ** exp, seed),
    st.sampled_from(["normal", "uniform", "negative", "positive", "sparse", "constant", "heavy"]),
    st.integers(1, 3), st.integers(1, 2), st.floats(-7, 5), st.integers(0, 2**16),
)


def _draw(kind: str, rows: int, cols: int, scale: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = {"normal": lambda: rng.standard_normal((rows, cols)),
         "uniform": lambda: rng.uniform(-1, 1, (rows, cols)),
         "negative": lambda: -np.abs(rng.standard_normal((rows, cols))),
         "positive": lambda: np.abs(rng.standard_normal((rows, cols))),
         "sparse": lambda: rng.standard_normal((rows, cols)) * (rng.random((rows, cols)) < 0.1),
         "constant": lambda: np.full((rows, cols), rng.uniform(-2, 2)),
         "heavy": lambda: rng.standard_t(2, (rows, cols))}[kind]()
    return (x * scale).astype(np.float32)


@given(values, st.sampled_from(kq.TYPES))
def test_property_roundtrip_bounded_deterministic(x, t):
    q, y = roundtrip(x, t)
    assert np.array_equal(q, kq.quantize(x.copy(), t))  # deterministic
    assert np.isfinite(y).all() and y.shape == x.shape
    xb, eb = x.reshape(-1, 256).astype(np.float64), (x - y).reshape(-1, 256).astype(np.float64)
    # never worse than storing zeros, super-block by super-block
    assert np.all((eb**2).sum(1) <= (xb**2).sum(1) * (1 + 1e-5) + 1e-30)
    scale = float(np.abs(x).max())
    if scale > 1e-3:  # inside fp16's normal range the grid holds: a bounded relative error
        rel = np.sqrt((eb**2).mean()) / max(np.sqrt((xb**2).mean()), 1e-30)
        assert rel <= {"q2_k": 0.6, "q3_k": 0.35, "q4_k": 0.2, "q5_k": 0.1, "q6_k": 0.06}[t]


def test_rows_encode_independently():
    """Chunked export relies on it: a row's bytes do not depend on the other rows (or threads)."""
    x = np.random.default_rng(5).standard_normal((300, 512)).astype(np.float32)
    for t in ("q2_k", "q6_k"):
        whole = kq.quantize(x, t)
        assert np.array_equal(np.concatenate([kq.quantize(x[:7], t), kq.quantize(x[7:], t)]), whole)


def test_imatrix_weights_the_error():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((32, 512)).astype(np.float32)
    im = (rng.standard_normal(512) ** 2 * 10 + 0.01).astype(np.float32)
    for t in ("q2_k", "q4_k", "q6_k"):
        plain, weighted = roundtrip(x, t)[1], roundtrip(x, t, im)[1]
        werr = lambda y: float(np.mean(im * (x - y) ** 2))  # noqa: E731
        assert werr(weighted) < werr(plain), t


def test_user_errors():
    x = np.ones((2, 256), np.float32)
    with pytest.raises(UsageError, match="multiple of 256"):
        kq.quantize(np.ones((2, 128), np.float32), "q4_k")
    with pytest.raises(UsageError, match="must be one of"):
        kq.quantize(x, "q4_0")
    with pytest.raises(UsageError, match="NaN"):
        kq.quantize(np.full((1, 256), np.nan, np.float32), "q6_k")
    with pytest.raises(UsageError, match="imatrix"):
        kq.quantize(x, "q4_k", np.ones(128))
    with pytest.raises(UsageError, match="2-D"):
        kq.quantize(np.ones(256, np.float32), "q4_k")


def _fixture_rows(name: str) -> dict[str, np.ndarray]:
    """Every 2-D weight of a bundled fixture, as 256-wide rows (tensors whose rows are shorter
    are read as consecutive rows: the same values for both encoders)."""
    from safetensors import safe_open

    from aios.models.aliases import FIXTURES_DIR

    out = {}
    for f in sorted((FIXTURES_DIR / name).glob("*.safetensors")):
        with safe_open(str(f), "np") as s:
            for k in s.keys():
                a = s.get_tensor(k).astype(np.float32)
                if a.ndim == 2 and a.size % 256 == 0:
                    out[k] = a.reshape(-1, 256)
    return out


@pytest.mark.parametrize("t", ["q2_k", "q4_k", "q6_k", "q3_k", "q5_k"])
def test_error_no_worse_than_llama_cpp(t):
    """Ours ≤ 1.1 × llama.cpp's RMS error on the same tensors (fixture weights + random)."""
    pytest.importorskip("llama_cpp")
    rng = np.random.default_rng(0)
    tensors = dict(_fixture_rows("tiny-falcon"))
    tensors["gaussian"] = rng.standard_normal((64, 1024)).astype(np.float32)
    tensors["student-t2"] = rng.standard_t(2, (64, 1024)).astype(np.float32)
    T = gguf.GGMLQuantizationType[t.upper()]
    for name, x in tensors.items():
        ours = np.sqrt(np.mean((x - gguf_dequantize(kq.quantize(x, t), T)) ** 2))
        ref = np.sqrt(np.mean((x - gguf_dequantize(kq.llama_cpp_quantize(x, t), T)) ** 2))
        assert ours <= 1.1 * ref, (name, ours, ref)


def test_gguf_export_q4_k_reports_fallbacks_and_runs_in_llama_cpp(tmp_path):
    """``aios-convert gguf --outtype q4_k`` on tiny-falcon (d_model 128): only the 512-wide
    ffn_down rows fit Q4_K super-blocks; every other matrix falls back to Q4_0, each one
    reported. llama.cpp loads the file, and its logits track our runtime's on the same file
    (measured: max |Δ| 0.9 % of the logit range, top-1 agreement 0.99 — llama.cpp also
    quantizes activations to 8 bits and runs a tanh GELU; our Q4_0 export shows the same gap)."""
    pytest.importorskip("llama_cpp")
    from click.testing import CliRunner

    from aios.models import resolve_model
    from convert.cli import main
    from runtime.model import Model
    from tests.convert.test_gguf_export import held_out_ids, llama_cpp_logits

    out = tmp_path / "f.q4_k.gguf"
    res = CliRunner().invoke(main, ["gguf", "tiny-falcon", "-o", str(out), "--outtype", "q4_k"])
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())  # rich wraps long lines
    assert "19 fallback(s)" in text and "llama.cpp loads and runs it" in text
    assert ("fallback: blk.N.attn_qkv.weight in blocks 0-5: row length 128 is not a multiple of the Q4_K block "
            "(256) -> Q4_0") in text  # one line for the six blocks; the metadata lists each tensor
    assert text.count("fallback: ") == 4  # qkv, dense, dense_h_to_4h, and the head / embedding
    r = gguf.GGUFReader(str(out))
    types = {t.name: t.tensor_type.name for t in r.tensors if len(t.shape) == 2}
    assert {n for n, k in types.items() if k == "Q4_K"} == {f"blk.{i}.ffn_down.weight" for i in range(6)}
    assert {k for n, k in types.items() if "ffn_down" not in n} == {"Q4_0"}
    fallbacks = [str(bytes(p), "utf-8") for p in r.get_field("aios.export.fallbacks").parts[6::2]]
    assert len(fallbacks) == 19 and all("Q4_K block (256)" in f and f.endswith("-> Q4_0") for f in fallbacks)
    # the stored Q4_K bytes are our encoder's bytes for the source tensor
    h = resolve_model("tiny-falcon")
    src = _fixture_rows("tiny-falcon")["transformer.h.0.mlp.dense_4h_to_h.weight"].reshape(128, 512)
    t0 = next(t for t in r.tensors if t.name == "blk.0.ffn_down.weight")
    assert np.array_equal(np.asarray(t0.data).reshape(128, -1), kq.quantize(src, "q4_k"))

    ids = held_out_ids(h.load_tokenizer(), n_texts=1)[0]
    ours = Model(out, arithmetic="float").forward(np.array(ids), all_logits=True)
    theirs = llama_cpp_logits(out, ids)
    assert np.abs(ours - theirs).max() <= 0.03 * np.abs(ours).max()
    assert (ours.argmax(-1) == theirs.argmax(-1)).mean() >= 0.95


def test_fallback_chain_per_tensor():
    from convert.gguf import tensors as gt

    assert gt.choose_type((64, 512), "q4_k") == ("q4_k", None)
    assert gt.choose_type((64, 128), "q6_k")[0] == "q8_0"
    assert gt.choose_type((64, 128), "q2_k")[0] == "q4_0"
    t, why = gt.choose_type((64, 48), "q4_k")  # fits neither Q4_K nor its Q4_0 fallback
    assert t == "f16" and "Q4_K block (256)" in why
    assert gt.choose_type((512,), "q4_k") == ("f32", None)
    x = np.random.default_rng(0).standard_normal((4, 512)).astype(np.float32)
    assert np.array_equal(gt.encode(x, "q6_k"), kq.quantize(x, "q6_k"))
    assert gt.encoded_nbytes((4, 512), "q2_k") == 4 * 2 * 84
