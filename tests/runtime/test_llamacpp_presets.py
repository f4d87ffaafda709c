"""aios-run on files llama.cpp's quantizer presets wrote: every tensor type they produce runs,
the float path decodes them exactly and the int8 path is as accurate as llama.cpp (issue 16).
The F16 "preset" (the export itself) checks the int8 setting's fp16 activations for F16 weights.

Our f16 exports of the bundled tiny-llama and tiny-falcon, and of a random llama with
d_model 256 (the fixtures' d_model 128 is no multiple of 256, so there llama.cpp falls back
per tensor and writes few K-quants; tiny-llama's Q2_K and Q4_0, Q6_K and Q8_0, IQ4_NL and IQ4_XS
come out byte-identical and are measured once), go through ``llama_model_quantize`` with the
presets people deploy. Per file:

- the types that appear are each listed in the runtime's kernel table, and together the
  files hold every block type of the table (a type no preset writes would be untested here);
- float path: ``Model`` logits equal those of the same model with each block-typed weight
  replaced by gguf-py's dequantization of its bytes (multiplied by the F32 kernel) within 1e-5
  of the largest logit (fixtures: a 128-token held-out window; d256: 25 tokens). Measured worst
  case 5.4e-7 (fixtures), 7.0e-7 (d256): float32 summation order only;
- on the bundled fixtures, over the first HELDOUT_TOKENS (default 2048; at 512 one flip more
  or less moves top-1 by 0.002) tokens of their held-out split
  (``runtime.perplexity.heldout_ids``: 8 pydoc topics the fixtures never trained on), windows
  of 128, a fresh context each:
  - int8 path (Q8_0/Q8_K activations) against llama.cpp's logits on the same file: top-1
    agreement ≥ 0.99 with no exception (the issue's target), and ≥ 0.995 where a near-tie
    counts as agreeing (llama.cpp's own logit for our pick within TIE = 0.5 % of its largest
    |logit| below its top-1). The int8 path rounds as ggml does: fp16 activation scales,
    round-half-even quants, GELU from ggml's fp16 table, and norms, RoPE, attention and SiLU in
    ggml's order (runtime.ggml_ops; tests/runtime/test_ggml_ops.py checks layer 0 bit for bit),
    and Q8_0 blocks summed in ggml's 8-lane order, so on Q8_0 the logits are bit-identical to
    llama.cpp's at almost every position (tiny-falcon: 98 %) and top-1 agrees at all. The other
    block types' dot products still sum a row's blocks in another lane order than ggml's; in a
    6-layer model each 8-bit requantization amplifies such a 1-ulp difference to its rounding
    noise, and top-1 flips where llama.cpp's top-2 are that close. Measured at 2048 positions
    (docs/benchmarks.md): no exception 0.9941-1.0000, near-ties counted 0.9995-1.0000 (before
    ggml_ops: 0.9893-0.9990; the exact float path: 0.983-0.994).
    On a CPU without AVX-512, llama.cpp's own build sums in AVX2's 8-lane order, which ggml_ops
    does not mirror, and the test asks for the floor it held before: 0.97 raw, 0.99 with ties.
    Those figures are the one-token kernels run over each window (``top1_tokenwise``;
    ``kernels.Arithmetic(..., batched=False)``). The default many-token form multiplies in float32
    GEMMs (runtime.kernels.gemm, runtime.attention_gemm), the same arithmetic rounded in another
    order: measured 0.9893-0.9995 raw, 0.9976-1.0000 with near-ties (2026-11-27, Xeon AVX-512
    + AMX), asked ≥ 0.98 and ≥ 0.995;
  - held-out perplexity of the int8 path within 0.5 % of the float path's on the same file
    (measured |Δ| ≤ 0.17 % at 2048 tokens);
  ``pytest -s`` prints the per-file table, ``AIOS_PRESET_TOKENS=N`` measures N tokens;
- on the bundled fixtures at Q4_K_M and Q8_0, greedy tokens equal llama.cpp's on the same
  file, up to a near-tie within llama.cpp's 8-bit activation rounding: its CPU kernels
  quantize the activations to 8-bit blocks before block dot products, which moves these
  logits by up to ~1.1 % of the largest one (measured on these files: f16 ≤ 0.11 %, Q8_0,
  Q5_0 and Q4_K_M 1.0–1.3 %), so texts may part only where the two candidates are closer
  than 2 % of the largest logit (measured: tiny-falcon Q4_K_M, step 1, 0.031 of 8.26).
"""

from __future__ import annotations

import collections
import hashlib
import os
import shutil

import gguf
import numpy as np
import pytest

from aios.models.aliases import FIXTURES_DIR
from aios.reference import llamacpp
from convert.gguf import GGUFExportConfig, export_gguf
from runtime import ggml_ops, kernels
from runtime.generate import generate, load_tokenizer
from runtime.model import Model
from runtime.perplexity import heldout_ids, perplexity
from runtime.weights import BLOCK_TYPES, SUPPORTED_TYPES, Matrix
from tests.conftest import build_hf_model
from tests.runtime.quant_blocks import dequantized
from tests.runtime.test_llama_cpp_files import llama_cpp_greedy

llama_cpp = pytest.importorskip("llama_cpp")

# F16 too: under the int8 setting (llama.cpp's arithmetic) its matmuls round x to fp16 as ggml does
FIXTURE_PRESETS = ("Q2_K", "Q3_K_M", "Q4_0", "Q4_1", "Q4_K_S", "Q4_K_M", "Q5_0", "Q5_1", "Q5_K_M", "Q6_K",
                   "Q8_0", "IQ4_NL", "IQ4_XS", "F16")
D256_PRESETS = ("Q2_K", "Q3_K_M", "Q4_K_M", "Q5_K_M", "Q6_K", "IQ4_XS")
FIXTURES = ("tiny-llama", "tiny-falcon")
IDS = list(range(5, 30))
N_NEW = 16
# held-out tokens (the fixtures' held-out split of pydoc_data.topics, never trained on), run in
# windows of the fixtures' training length; the docs table is this default run
HELDOUT_TOKENS = int(os.environ.get("AIOS_PRESET_TOKENS", "2048"))
WINDOW = 128
TIE = 0.005  # llama.cpp top-1 margin, as a fraction of its largest logit, below which it is a near-tie


def quantize(src, dst, preset: str) -> None:
    llamacpp.quantize(src, dst, preset, nthread=1)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """{(model, preset): path} for the fixtures and the d_model-256 llama."""
    root = tmp_path_factory.mktemp("presets")
    d256 = build_hf_model("llama", root / "d256", hidden_size=256, intermediate_size=512, num_attention_heads=4,
                          num_key_value_heads=2, vocab_size=2048)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(FIXTURES_DIR / "tiny-llama" / f, d256 / f)
    out = {}
    for name, src, presets in (("tiny-llama", FIXTURES_DIR / "tiny-llama", FIXTURE_PRESETS),
                               ("tiny-falcon", FIXTURES_DIR / "tiny-falcon", FIXTURE_PRESETS),
                               ("d256", d256, D256_PRESETS)):
        f16 = root / f"{name}.f16.gguf"
        export_gguf(str(src), f16, GGUFExportConfig("f16"))
        for preset in presets:
            out[name, preset] = root / f"{name}.{preset}.gguf"
            quantize(f16, out[name, preset], preset)
    return out


def _types(path) -> collections.Counter:
    return collections.Counter(t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors)


def test_presets_cover_every_block_type(files):
    seen = collections.Counter()
    for path in files.values():
        kinds = _types(path)
        assert set(kinds) <= set(SUPPORTED_TYPES), (path.name, kinds)
        seen.update(kinds)
    assert set(BLOCK_TYPES) <= set(seen), set(BLOCK_TYPES) - set(seen)


class _Recorded:
    """A Model whose chunk logits are kept, so ``perplexity`` (the held-out protocol itself)
    also yields the logits it scored."""

    def __init__(self, model):
        self.model, self.counter, self.arith, self.logits = model, model.counter, model.arith, []

    def reset(self):
        self.model.reset()

    def forward(self, ids, all_logits=False, **kw):
        out = self.model.forward(ids, all_logits=all_logits, **kw)
        self.logits.append(out)
        return out


def _ours(path, ids, arith: str, batched: bool = True):
    """(logits (len(ids), vocab), held-out perplexity) of ``Model(path)`` in ``arith``, in
    windows of WINDOW (``batched`` False: the one-token kernels over each window)."""
    rec = _Recorded(Model(path, arithmetic=kernels.Arithmetic(arith, batched=batched)))
    ppl = perplexity(rec, ids, window=WINDOW, arithmetic=None)["perplexity"]
    return np.concatenate(rec.logits), ppl


def _llama_cpp_logits(path, ids) -> llamacpp.Result:
    """llama.cpp's logits at every position, the same windows as ``perplexity`` (fresh context
    each), and the llama.cpp configuration that computed them."""
    return llamacpp.logits(path, ids, window=WINDOW, n_ctx=WINDOW, n_batch=WINDOW, n_threads=2, seed=0,
                           type_k=0, type_v=0)


def _float_err(path, ids, ours=None) -> float:
    """max |float-path logits of ``ids`` − gguf-py-dequantized twin's| / the twin's largest |logit|."""
    ours = _ours(path, ids, "float")[0] if ours is None else ours
    ref_model = dequantized(Model(path, arithmetic="float"))
    assert not any(isinstance(v, Matrix) and v.kind in BLOCK_TYPES for L in ref_model.layers for v in L.values())
    ref = ref_model.forward(ids, all_logits=True)
    return float(np.abs(ours - ref).max() / np.abs(ref).max())


def _measure(path, ids) -> dict:
    lf, ppl_f = _ours(path, ids, "float")
    l8, ppl_8 = _ours(path, ids, "int8")
    l8_tokens = _ours(path, ids, "int8", batched=False)[0]  # the one-token kernels: llama.cpp's rounding
    row = {"err": _float_err(path, ids[:WINDOW], lf[:WINDOW]), "ppl_float": ppl_f, "ppl_int8": ppl_8,
           "ppl_rel": (ppl_8 - ppl_f) / ppl_f}
    try:
        ref = _llama_cpp_logits(path, ids)
    except llamacpp.LlamaCppError as e:  # only the tests that compare with llama.cpp fail, with this line
        return row | {"llama_cpp": f"failed: {e}", "llama_cpp_error": str(e), "positions": 0, "top1": np.nan,
                      "top1_ties": np.nan, "top1_float": np.nan, "near_ties": 0}
    lc = ref.value
    scale = np.abs(lc).max(1)
    best = lc.max(1)
    pick = l8.argmax(1)
    same = pick == lc.argmax(1)
    # a near-tie: llama.cpp's own logit for our pick within TIE · its largest |logit| of its top-1
    tie = lc[np.arange(len(lc)), pick] >= best - TIE * scale
    margin = best - np.sort(lc, 1)[:, -2]
    exact = l8_tokens.argmax(1)
    tie_exact = lc[np.arange(len(lc)), exact] >= best - TIE * scale
    row |= {"top1_tokenwise": float((exact == lc.argmax(1)).mean()),
            "top1_ties_tokenwise": float(((exact == lc.argmax(1)) | tie_exact).mean())}
    return row | {"positions": len(lc), "top1": float(same.mean()), "top1_ties": float((same | tie).mean()),
                  "top1_float": float((lf.argmax(1) == lc.argmax(1)).mean()),
                  "near_ties": int((margin < TIE * scale).sum()),  # llama.cpp's top-2 within TIE
                  "llama_cpp": ref.config}


@pytest.fixture(scope="module")
def accuracy(files):
    """{(fixture, preset): figures} on the first HELDOUT_TOKENS held-out tokens; measured once
    per distinct file (a preset whose types all fall back writes the same bytes as another)."""
    by_digest, rows = {}, {}
    for model in FIXTURES:
        ids = heldout_ids(load_tokenizer(files[model, "Q8_0"], FIXTURES_DIR / model), HELDOUT_TOKENS)
        for preset in FIXTURE_PRESETS:
            path = files[model, preset]
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            if digest not in by_digest:
                by_digest[digest] = _measure(path, ids)
            rows[model, preset] = by_digest[digest]
    print(f"\nint8 path vs llama.cpp, {HELDOUT_TOKENS} held-out tokens per file "
          f"(±ties: a llama.cpp near-tie within {TIE:.1%} of its largest |logit| counts as agreeing)")
    print(f"{'file':20s} {'float err':>9s} {'top-1':>6s} {'±ties':>6s} {'tokenw':>6s} {'float':>6s} {'ties':>4s} "
          f"{'ppl float':>9s} {'ppl int8':>9s} {'Δppl':>7s}  llama.cpp")
    for (model, preset), r in rows.items():
        print(f"{model + ' ' + preset:20s} {r['err']:9.1e} {r['top1']:6.4f} {r['top1_ties']:6.4f} "
              f"{r.get('top1_tokenwise', np.nan):6.4f} "
              f"{r['top1_float']:6.4f} {r['near_ties']:4d} {r['ppl_float']:9.4f} {r['ppl_int8']:9.4f} "
              f"{r['ppl_rel']:+7.3%}  {r['llama_cpp']}")
    return rows


FIXTURE_KEYS = [(m, p) for m in FIXTURES for p in FIXTURE_PRESETS]


@pytest.mark.parametrize("key", FIXTURE_KEYS, ids="-".join)
def test_float_path_equals_gguf_py_dequantization(accuracy, key):
    assert accuracy[key]["err"] <= 1e-5, (key, accuracy[key])


@pytest.mark.parametrize("key", FIXTURE_KEYS, ids="-".join)
def test_int8_top1_agrees_with_llama_cpp(accuracy, key):
    r = accuracy[key]
    if "llama_cpp_error" in r:
        pytest.fail(r["llama_cpp_error"], pytrace=False)
    assert r["positions"] == HELDOUT_TOKENS
    if ggml_ops.avx512_order():  # the one-token kernels' rounding order is this llama.cpp build's
        assert r["top1_tokenwise"] >= 0.99, (key, r)
        assert r["top1_ties_tokenwise"] >= 0.995, (key, r)
    else:  # an AVX2 build sums in 8 lanes: ours parts from it by float32 rounding (0.989-0.999)
        assert r["top1_tokenwise"] >= 0.97, (key, r)
        assert r["top1_ties_tokenwise"] >= 0.99, (key, r)
    # the default many-token form (float32 GEMMs, runtime.kernels.gemm) rounds otherwise, and a
    # one-ulp difference flips an activation quant now and then: 0.989-0.998 measured
    # (2026-11-27, Xeon AVX-512 + AMX), every miss but 1-3 per file a llama.cpp near-tie
    assert r["top1"] >= 0.98, (key, r)
    assert r["top1_ties"] >= 0.995, (key, r)


@pytest.mark.parametrize("key", FIXTURE_KEYS, ids="-".join)
def test_int8_perplexity_within_half_a_percent_of_float(accuracy, key):
    assert abs(accuracy[key]["ppl_rel"]) <= 0.005, (key, accuracy[key])


@pytest.mark.parametrize("preset", D256_PRESETS)
def test_d256_logits_equal_gguf_py_dequantization(files, preset):
    path = files["d256", preset]
    err = _float_err(path, IDS)
    assert err <= 1e-5, (preset, err, dict(_types(path)))


@pytest.mark.parametrize("model", ["tiny-llama", "tiny-falcon"])
@pytest.mark.parametrize("preset", ["Q4_K_M", "Q8_0"])
def test_greedy_equals_llama_cpp(files, model, preset):
    path = files[model, preset]
    ours, _ = generate(Model(path, arithmetic="float"), IDS, N_NEW)
    theirs = llama_cpp_greedy(path, IDS, N_NEW)
    if ours != theirs:  # only at a near-tie within llama.cpp's 8-bit activation rounding
        k = next(i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b)
        logits = Model(path, arithmetic="float").forward(IDS + ours[:k], all_logits=True)[-1]
        assert logits[ours[k]] - logits[theirs[k]] < 0.02 * np.abs(logits).max(), (k, ours, theirs)
