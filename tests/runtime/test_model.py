"""The runtime against references we did not write: transformers logits, gguf-py dequantizers."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from aios.errors import InvalidModelError, UnsupportedArchitectureError, UsageError
from aios.models import resolve_model
from runtime.generate import Sampling, generate, sample
from runtime.kernels import Arithmetic
from runtime.model import Model
from runtime.weights import from_gguf_tensor

TEXT = "def add(a, b):\n    return a + b  # The list type supports slicing and item assignment."


def _hf_logits(src, text=TEXT):
    h = resolve_model(str(src))
    tok = h.load_tokenizer()
    ids = tok(text, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        return ids[0].numpy(), h.load_torch()(input_ids=ids).logits[0].numpy()


@pytest.mark.parametrize("fixture", ["tiny-falcon", "tiny-llama"])
def test_f32_logits_match_transformers(exported, fixture):
    path, src = exported(fixture, "f32")
    ids, ref = _hf_logits(src)
    m = Model(path, arithmetic="float")
    out = m.forward(ids, all_logits=True)
    assert np.abs(out - ref).max() <= 1e-4
    assert (out.argmax(-1) == ref.argmax(-1)).all()
    # token-by-token decode with the KV cache gives the same logits
    m.reset()
    step = np.concatenate([m.forward([t]) for t in ids])
    assert np.abs(step - ref).max() <= 1e-4


@pytest.mark.parametrize("kind", ["qwen2", "qwen3", "llama3", "llama32", "gemma3", "gemma2", "phi3", "mistral",
                                  "falcon-new-decoder", "gpt2"])
def test_architecture_rows_run_with_transformers_logits(tmp_path, kind):
    """Graph features read off the architecture row: Qwen2's q/k/v biases and NeoX RoPE,
    Qwen3's per-head q/k RMSNorm and explicit head_dim, Llama 3.1's RoPE frequency factors
    (``rope_freqs``), Falcon-40B's grouped KV heads in a fused QKV and the MLP's own norm
    (``attn_norm_2``) in a parallel block, GPT-2's learned positions (``position_embd``) and
    biases on every linear and norm; the export and the forward pass match transformers' logits."""
    import shutil

    from aios.models.aliases import FIXTURES_DIR
    from convert.gguf import GGUFExportConfig, export_gguf
    from tests.conftest import LLAMA3_ROPE, build_hf_model

    extra = {"llama3": LLAMA3_ROPE, "llama32": dict(LLAMA3_ROPE, tie_word_embeddings=True)}.get(kind, {})
    base = "llama" if kind.startswith("llama") else kind
    src = build_hf_model(base, tmp_path / kind, vocab_size=2048, **extra)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(FIXTURES_DIR / "tiny-falcon" / f, src / f)
    path = tmp_path / f"{kind}.gguf"
    export_gguf(str(src), path, GGUFExportConfig("f32"))
    ids, ref = _hf_logits(src)
    m = Model(path, arithmetic="float")
    names = {t.name for t in m.reader.tensors}
    assert m.hp.graph.name == {"llama3": "llama", "llama32": "llama", "mistral": "llama"}.get(kind, kind)
    if kind == "mistral":  # every layer attends through the 8-token window, the prompt is longer
        assert m.hp.window == 8 and all(m.hp.swa_layers) and len(ids) > 8
    if kind == "llama32":  # Llama 3.2: tied output, no output.weight stored
        assert "output.weight" not in names and m.output is m.tok_embd
    assert {"qwen2": "blk.0.attn_q.bias", "qwen3": "blk.0.attn_k_norm.weight", "llama3": "rope_freqs.weight",
            "llama32": "rope_freqs.weight",
            "gemma3": "blk.0.post_ffw_norm.weight", "gemma2": "blk.0.post_attention_norm.weight",
            "phi3": "blk.0.attn_qkv.weight", "mistral": "blk.0.ffn_gate.weight",
            "falcon-new-decoder": "blk.0.attn_norm_2.weight", "gpt2": "position_embd.weight"}[kind] in names
    out = m.forward(ids, all_logits=True)
    assert np.abs(out - ref).max() <= 1e-4
    m.reset()
    step = np.concatenate([m.forward([t]) for t in ids])
    assert np.abs(step - ref).max() <= 1e-4


def _tiny_with_tokenizer(kind: str, folder, **overrides):
    import shutil

    from aios.models.aliases import FIXTURES_DIR
    from tests.conftest import build_hf_model

    src = build_hf_model(kind, folder, vocab_size=2048, **overrides)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(FIXTURES_DIR / "tiny-falcon" / f, src / f)
    return src


@pytest.mark.parametrize("kind", ["falcon-new-decoder", "gpt2"])
def test_greedy_text_equals_transformers_and_llama_cpp(tmp_path, kind):
    """Greedy decoding: the same tokens as transformers (our f32 export) and as llama.cpp on our
    f16 export (both compute in floats there)."""
    from convert.gguf import GGUFExportConfig, export_gguf
    from tests.runtime.test_llama_cpp_files import llama_cpp_greedy

    src = _tiny_with_tokenizer(kind, tmp_path / "src")
    f32, f16 = tmp_path / "m.f32.gguf", tmp_path / "m.f16.gguf"
    export_gguf(str(src), f32, GGUFExportConfig("f32"))
    export_gguf(str(src), f16, GGUFExportConfig("f16"))
    ids = list(range(5, 30))
    n = 16
    with torch.no_grad():
        ref = resolve_model(str(src)).load_torch().generate(torch.tensor([ids]), max_new_tokens=n, min_new_tokens=n,
                                                            do_sample=False)[0, len(ids):].tolist()
    ours, _ = generate(Model(f32, arithmetic="float"), ids, n)
    assert ours == ref
    assert generate(Model(f16, arithmetic="float"), ids, n)[0] == llama_cpp_greedy(f16, ids, n)


@pytest.mark.parametrize("kind, relu", [("falcon-new-decoder", {"activation": "relu"}),
                                        ("gpt2", {"activation_function": "relu"})])
def test_relu_row_sparse_decodes_as_dense(tmp_path, kind, relu):
    """A ReLU variant of a non-gated row: exact sparse mode gives dense's logits and text."""
    from convert.gguf import GGUFExportConfig, export_gguf

    src = _tiny_with_tokenizer(kind, tmp_path / "src", **relu)
    path = tmp_path / "relu.gguf"
    export_gguf(str(src), path, GGUFExportConfig("f32"))
    ids = list(range(5, 30))
    dense, sparse = Model(path, arithmetic="float"), Model(path, mode="sparse", arithmetic="float")
    assert dense.hp.activation == "relu" and "ffn_gate.weight" not in sparse.layers[0]
    d, s = dense.forward(ids, all_logits=True), sparse.forward(ids, all_logits=True)
    assert np.abs(s - d).max() <= 1e-5 * np.abs(d).max()
    assert sparse.ffn_nnz < sparse.hp.n_layers * sparse.hp.d_ffn * len(ids)  # zeros were skipped
    assert generate(sparse, ids, 16)[0] == generate(dense, ids, 16)[0]


@pytest.mark.parametrize("outtype", ["f16", "bf16", "q8_0", "q4_0"])
def test_quantized_matvec_equals_gguf_dequantize(exported, outtype):
    import gguf

    path, _ = exported("tiny-llama", outtype)
    r = gguf.GGUFReader(str(path))
    x = np.random.default_rng(0).standard_normal((3, 128)).astype(np.float32)
    checked = 0
    for t in r.tensors:
        if t.tensor_type.name.lower() != outtype or len(t.shape) < 2 or int(t.shape[0]) != 128:
            continue
        W = gguf.dequantize(t.data, t.tensor_type).reshape(int(t.shape[1]), int(t.shape[0]))
        y = from_gguf_tensor(t).matmul(x, None, Arithmetic("float"))
        ref = x.astype(np.float64) @ W.astype(np.float64).T
        assert np.abs(y - ref).max() <= 1e-5 * max(1.0, np.abs(ref).max()), t.name
        checked += 1
    assert checked >= 3


@pytest.mark.parametrize("fixture", ["tiny-falcon", "tiny-llama"])
def test_exact_sparse_equals_dense(exported, fixture):
    path, _ = exported(fixture, "f32", relu=True)
    ids = np.arange(1, 40)
    dense = Model(path, arithmetic="float").forward(ids, all_logits=True)
    sp = Model(path, mode="sparse", arithmetic="float")
    out = sp.forward(ids, all_logits=True)
    assert np.abs(out - dense).max() <= 1e-5
    # decode: the down projection reads only rows of nonzero activations
    d, s = Model(path, arithmetic="float"), Model(path, mode="sparse", arithmetic="float")
    d.forward(ids)
    s.forward(ids)
    b_d, b_s = d.counter.snapshot()["weights"], s.counter.snapshot()["weights"]
    d.forward([5])
    s.forward([5])
    saved = (d.counter.snapshot()["weights"] - b_d) - (s.counter.snapshot()["weights"] - b_s)
    row = s.layers[0]["ffn_down.T"].row_bytes
    # gated FFNs also skip the up rows whose gate is zero (same row size as a down.T row)
    gated = "ffn_gate.weight" in s.layers[0]
    assert saved == (s.hp.n_layers * s.hp.d_ffn - s.ffn_nnz) * row * (2 if gated else 1)


def test_dense_byte_count_matches_independent_sum(exported):
    """Decode bytes = every tensor's bytes except the embedding table (one row) + KV + activations."""
    import gguf

    path, _ = exported("tiny-falcon", "f32")
    m = Model(path, arithmetic="float")
    m.forward(np.arange(1, 11))
    before = m.counter.snapshot()
    m.forward([7])  # position 10: attends over 11 positions
    got = {k: m.counter.snapshot()[k] - before[k] for k in before}
    r = gguf.GGUFReader(str(path))
    hp = m.hp
    names = {t.name: int(t.n_bytes) for t in r.tensors}
    d_emb = names["token_embd.weight"]
    mats = sum(b for n, b in names.items() if n.startswith("blk.") and n.endswith(".weight") and "norm" not in n)
    head = names.get("output.weight", d_emb)  # tied: the embedding table is the head
    expected_w = mats + d_emb // int(hp_vocab(r)) + head
    assert got["weights"] == expected_w
    kv = hp.n_layers * 2 * hp.n_kv * hp.head_dim * 4 * (11 + 1)  # read 11 positions, write 1
    assert got["kv_cache"] == kv
    assert got["activations"] > 0


def hp_vocab(r) -> int:
    return int(next(t for t in r.tensors if t.name == "token_embd.weight").shape[1])


def test_generate_greedy_and_sampling(exported):
    path, _ = exported("tiny-llama", "f32")
    m = Model(path, arithmetic="float")
    out1, tm = generate(m, [1, 2, 3, 4, 5], 6, chunk=2)
    out2, _ = generate(m, [1, 2, 3, 4, 5], 6, chunk=5)
    assert out1 == out2 and tm.generated == 5 and tm.prefill_bytes["weights"] > 0
    s = Sampling(temperature=0.8, top_k=20, top_p=0.9, seed=3)
    assert generate(m, [1, 2, 3], 5, sampling=s)[0] == generate(m, [1, 2, 3], 5, sampling=s)[0]
    logits = np.array([0.0, 5.0, 1.0])
    assert sample(logits, Sampling(), np.random.default_rng(0)) == 1
    assert sample(logits, Sampling(temperature=1.0, top_k=1), np.random.default_rng(0)) == 1


def test_errors(exported, gguf_file, tmp_path):
    path, _ = exported("tiny-falcon", "f32")
    with pytest.raises(UsageError, match="ReLU-family"):
        Model(path, mode="sparse", arithmetic="float")  # GELU model: no exact zeros
    m = Model(path, n_ctx=8, arithmetic="float")
    with pytest.raises(UsageError, match="Context full|exceed"):
        generate(m, list(range(1, 8)), 4)
    import gguf

    for arch, err in (("mpt", UnsupportedArchitectureError), ("gpt2", InvalidModelError)):  # gpt2 runs: incomplete
        p = tmp_path / f"{arch}.gguf"
        w = gguf.GGUFWriter(str(p), arch)
        w.add_block_count(1)
        w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()  # noqa: E702
        with pytest.raises(err):
            Model(p, arithmetic="float")


@pytest.mark.parametrize("outtype", ["q8_0", "q4_0"])
def test_block_quant_bytes_counted_are_the_file_bytes(exported, outtype):
    """fp16 block scales stay fp16 in memory, so a row costs exactly its bytes in the file."""
    import gguf

    path, _ = exported("tiny-llama", outtype)
    checked = 0
    for t in gguf.GGUFReader(str(path)).tensors:
        if t.tensor_type.name.lower() == outtype:
            assert from_gguf_tensor(t).nbytes == int(t.n_bytes), t.name
            checked += 1
    assert checked >= 3


@pytest.mark.parametrize("kind", ["qwen2", "qwen3", "llama3", "gemma3", "gemma2", "phi3", "mistral",
                                  "falcon-new-decoder", "gpt2"])
def test_fused_glue_gives_the_step_by_step_logits_to_the_bit(tmp_path, kind):
    """On the ggml path (int8 block weights), ``Model.fused_glue`` runs the residual adds with the
    norms after them, and everything between the q/k/v projections and attention, as compiled
    calls, and quantizes a shared input once for q/k/v and gate/up: the same float32 operations as
    the step by step path, so prefill and decode logits are identical, for every graph feature
    (biases, per-head norms, RoPE factors, post-norms, soft caps, windows, parallel blocks)."""
    from convert.gguf import GGUFExportConfig, export_gguf
    from tests.conftest import LLAMA3_ROPE

    extra = {"llama3": LLAMA3_ROPE}.get(kind, {})
    src = _tiny_with_tokenizer("llama" if kind == "llama3" else kind, tmp_path / kind, **extra)
    path = tmp_path / f"{kind}.gguf"
    export_gguf(str(src), path, GGUFExportConfig("q8_0"))
    ids = list(range(3, 40, 3))
    m = Model(path, arithmetic="int8")
    assert m._ggml(m.arith)
    runs = {}
    for fused in (True, False):
        m.fused_glue = fused
        m.reset()
        prefill = m.forward(ids, all_logits=True)
        m.reset()
        steps = np.concatenate([m.forward(ids[:4])] + [m.forward([t]) for t in ids[4:]])
        runs[fused] = prefill, steps
    for a, b in zip(runs[True], runs[False]):
        assert a.dtype == b.dtype == np.float32
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32))


def _rss_anon() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("RssAnon:"))


@pytest.mark.skipif(not __import__("os").path.exists("/proc/self/status"), reason="reads Linux's /proc")
def test_the_kv_cache_takes_memory_only_where_positions_are_written(exported):
    """A long context's KV cache is allocated untouched: the real Gemma 3's 32k context is 1.2 GB
    of cache that a short generate never writes (np.zeros_like filled all of it)."""
    path, _ = exported("tiny-llama", "f32")
    small = Model(path, arithmetic="float")
    small.forward(list(range(1, 9)))  # the kernels' compiled code is loaded outside the measure
    hp = small.hp
    per_position = 2 * hp.n_layers * hp.n_kv * hp.head_dim * 4
    n_ctx = (256 << 20) // per_position  # a 256 MB cache
    before = _rss_anon()
    m = Model(path, n_ctx=n_ctx, arithmetic="float")
    m.forward(list(range(1, 9)))
    assert m.k_cache.nbytes + m.v_cache.nbytes >= 250 << 20
    assert _rss_anon() - before < 64 << 20
