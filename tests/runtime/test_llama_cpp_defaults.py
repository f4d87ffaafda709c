"""aios-run reads a GGUF that lacks an optional key as llama.cpp does (runtime/model.py
``read_hparams``; the per-architecture defaults are fields of the architecture table).

For every runtime row a random tiny model is exported (f32), then copies are written with one
optional key (or the tied ``output.weight``) stripped, tensors untouched, and aios-run's logits
are compared with llama.cpp's on each copy. Each config makes the stripped key matter: the file's
value differs from llama.cpp's default (global RoPE base 1e6 != 10000, a local base of 50000, a
per-layer pattern that is not the default one, strong soft caps, partial rotary, linear RoPE
scaling, an untied output), and the test checks that llama.cpp's own logits move when the key
goes. Where the default gives tensors of the wrong shape (KV heads, head sizes) both refuse the
file. Keys are added too where llama.cpp ignores them (a sliding window on Phi-3 and Qwen2).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest

from aios.errors import AiosError
from aios.models.aliases import FIXTURES_DIR
from aios.reference import llamacpp
from convert.gguf import GGUFExportConfig, export_gguf
from runtime.model import Model
from tests.conftest import build_hf_model

pytestmark = pytest.mark.usefixtures("one_thread")

IDS = list(range(5, 29))  # 24 tokens: past the 8-token windows of the tiny Gemma/Mistral configs
# aios-run vs llama.cpp, of the largest logit: f32 weights on both sides (measured ~1.5e-6); where
# the FFN is a GELU llama.cpp reads it from an fp16 table (measured up to 1.6e-3, 62 layers)
TOL, TOL_GELU = 1e-5, 5e-3
MOVES = 5e-2  # llama.cpp's logits move by more than this when a stripped key matters (measured >= 0.15)
INIT = 0.2  # weights 10x HF's default scale: attention peaked enough that positions and caps matter

LOCAL_GLOBAL = {"sliding_attention": {"rope_type": "default", "rope_theta": 50000.0},
                "full_attention": {"rope_type": "default", "rope_theta": 1e6}}
# name: (TINY_CONFIGS kind, config overrides)
ROWS = {
    "llama": ("llama", dict(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 5e5},
                            tie_word_embeddings=False)),
    "mistral": ("mistral", dict(rope_parameters={"rope_type": "default", "rope_theta": 1e6})),
    "qwen2": ("qwen2", dict(rope_parameters={"rope_type": "default", "rope_theta": 1e6})),
    "qwen3": ("qwen3", dict(rope_parameters={"rope_type": "default", "rope_theta": 1e6})),
    "gemma3": ("gemma3", dict(rope_parameters=LOCAL_GLOBAL, final_logit_softcapping=5.0, layer_types=[
        "sliding_attention", "full_attention", "sliding_attention", "full_attention", "sliding_attention",
        "sliding_attention"])),
    # Gemma 3 4B's RoPE: the global layers' positions scaled linearly (llama.cpp: the local ones not)
    "gemma3-linear": ("gemma3", dict(rope_parameters={
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}},
        layer_types=["sliding_attention", "full_attention"] * 3)),
    "qwen2-linear": ("qwen2", dict(rope_parameters={"rope_type": "linear", "factor": 4.0, "rope_theta": 1e4})),
    # query_pre_attn_scalar != head_dim: the export writes aios.attention.scale, llama.cpp ignores it
    "gemma3-qpas": ("gemma3", dict(query_pre_attn_scalar=16)),
    # 27B's block counts: llama.cpp scales by 1/sqrt(d_model / heads) = query_pre_attn_scalar's
    "gemma3-62": ("gemma3", dict(num_hidden_layers=62, query_pre_attn_scalar=16)),
    "gemma2": ("gemma2", dict(rope_parameters={"rope_type": "default", "rope_theta": 1e6},
                              layer_types=["full_attention", "sliding_attention"],
                              attn_logit_softcapping=2.0, final_logit_softcapping=5.0)),
    "gemma2-46": ("gemma2", dict(num_hidden_layers=46, query_pre_attn_scalar=16, attn_logit_softcapping=2.0,
                                 final_logit_softcapping=5.0)),
    "phi3": ("phi3", dict(partial_rotary_factor=0.5, rope_parameters={"rope_type": "default", "rope_theta": 1e6})),
    "falcon": ("falcon", {}),
    "gpt2": ("gpt2", {}),
}
# (row, edit): "-key" strips {arch}.key (an aios.* key as written), "-tensor:name" a tensor,
# "+key=value" adds an integer key; "" is the file as exported
CASES = [
    ("llama", ""), ("llama", "-rope.freq_base"), ("llama", "-rope.scaling.factor"),
    ("llama", "-rope.scaling.type"), ("llama", "-rope.dimension_count"), ("llama", "-tensor:output.weight"),
    ("mistral", "-attention.sliding_window"),
    ("qwen2", ""), ("qwen2", "-rope.freq_base"), ("qwen2", "-attention.head_count_kv"),
    ("qwen2", "+attention.sliding_window=4"),
    ("qwen3", ""), ("qwen3", "-rope.freq_base"), ("qwen3", "-attention.key_length"),
    ("qwen3", "-attention.value_length"),
    ("gemma3", ""), ("gemma3", "-attention.sliding_window_pattern"), ("gemma3", "-rope.freq_base_swa"),
    ("gemma3", "-final_logit_softcapping"), ("gemma3", "-attention.sliding_window"),
    ("gemma3", "-rope.freq_base"),
    ("gemma3-linear", ""), ("gemma3-linear", "-rope.scaling.factor"), ("qwen2-linear", "-rope.scaling.factor"),
    ("gemma3-qpas", "-aios.attention.scale"), ("gemma3-62", ""), ("gemma3-62", "-aios.attention.scale"),
    ("gemma2", ""), ("gemma2", "-attention.sliding_window_pattern"), ("gemma2", "-attn_logit_softcapping"),
    ("gemma2", "-final_logit_softcapping"), ("gemma2", "-attention.sliding_window"),
    ("gemma2-46", ""), ("gemma2-46", "-aios.attention.scale"),
    ("phi3", ""), ("phi3", "-rope.dimension_count"), ("phi3", "+attention.sliding_window=4"),
    ("falcon", ""), ("falcon", "-attention.head_count_kv"),
    ("gpt2", ""),
]
# stripped keys whose default equals the file's value here: llama.cpp's logits stay (nothing to move)
SAME_AS_DEFAULT = {("llama", "-rope.scaling.type"), ("llama", "-rope.dimension_count"),
                   ("mistral", "-attention.sliding_window"),  # llama.cpp's llama graph has no window
                   ("qwen2", "+attention.sliding_window=4"), ("phi3", "+attention.sliding_window=4"),
                   ("gemma3-62", "-aios.attention.scale"), ("gemma2-46", "-aios.attention.scale")}


def rewrite(src: Path, dst: Path, *, drop_keys=(), drop_tensors=(), add: dict | None = None) -> Path:
    """A copy of the GGUF ``src`` without ``drop_keys`` / ``drop_tensors`` and with the keys
    ``add`` (int: uint32, str: string) added; every other key and tensor byte for byte."""
    r = gguf.GGUFReader(str(src))
    arch = r.get_field("general.architecture").contents()
    w = gguf.GGUFWriter(str(dst), arch)
    for field in r.fields.values():
        if field.name == "general.architecture" or field.name.startswith("GGUF.") or field.name in drop_keys:
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(field.name, field.contents(), vtype, sub_type=sub)
    for key, value in (add or {}).items():
        w.add_uint32(key, value) if isinstance(value, int) else w.add_string(key, value)
    tensors = [t for t in r.tensors if t.name not in drop_tensors]
    for t in tensors:
        w.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for t in tensors:
        w.write_tensor_data(t.data)
    w.close()
    return dst


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """Factory: row name -> (f32 export, the export's warnings), built once per module."""
    root, cache = tmp_path_factory.mktemp("defaults"), {}

    def make(name: str):
        if name not in cache:
            kind, overrides = ROWS[name]
            # (a neutral folder name: it becomes general.name, and llama.cpp treats a model named
            # "phi3" as Phi-3's own vocabulary)
            src = build_hf_model(kind, root / f"m{len(cache)}", vocab_size=2048, initializer_range=INIT,
                                 **overrides)
            for f in ("tokenizer.json", "tokenizer_config.json"):
                shutil.copy(FIXTURES_DIR / "tiny-falcon" / f, src / f)
            out = root / f"{name}.f32.gguf"
            result = export_gguf(str(src), out, GGUFExportConfig("f32"))
            cache[name] = (out, result.warnings)
        return cache[name]

    return make


def llama_cpp_logits(path: Path, _cache: dict = {}) -> np.ndarray:  # noqa: B006 (a cache of the exports')
    key = (str(path), path.stat().st_mtime_ns)
    if key not in _cache:
        _cache[key] = llamacpp.logits(path, IDS, n_ctx=64, n_batch=64, type_k=0, type_v=0, n_threads=2,
                                      seed=0).value
    return _cache[key]


def edited(path: Path, edit: str, tmp_path: Path) -> Path:
    if not edit:
        return path
    arch = gguf.GGUFReader(str(path)).get_field("general.architecture").contents()
    out = tmp_path / "edited.gguf"
    if edit.startswith("-tensor:"):
        return rewrite(path, out, drop_tensors={edit.removeprefix("-tensor:")})
    if edit.startswith("+"):
        key, value = edit[1:].split("=")
        return rewrite(path, out, add={f"{arch}.{key}": int(value)})
    key = edit[1:]
    full = key if key.startswith("aios.") else f"{arch}.{key}"
    assert gguf.GGUFReader(str(path)).get_field(full) is not None, f"the export has no {full}"
    return rewrite(path, out, drop_keys={full})


@pytest.mark.parametrize("row, edit", CASES, ids=[f"{r}{e or '-as-exported'}" for r, e in CASES])
def test_aios_run_reads_a_file_without_the_key_as_llama_cpp_does(exports, tmp_path, row, edit):
    path, _ = exports(row)
    f = edited(path, edit, tmp_path)
    refused = llamacpp.load_error(f, n_ctx=64)
    if refused is not None:  # the default gives tensors of other shapes: aios-run refuses as well
        assert edit.startswith("-")
        with pytest.raises(AiosError):
            Model(f, arithmetic="float")
        return
    theirs = llama_cpp_logits(f)
    model = Model(f, arithmetic="float")
    ours = model.forward(IDS, all_logits=True)
    scale = float(np.abs(theirs).max())
    tol = TOL_GELU if model.hp.activation.startswith("gelu") else TOL
    assert np.abs(ours - theirs).max() <= tol * scale, np.abs(ours - theirs).max() / scale
    if edit and (row, edit) not in SAME_AS_DEFAULT and not edit.endswith("aios.attention.scale"):
        # the key mattered: llama.cpp computes otherwise without it
        assert np.abs(theirs - llama_cpp_logits(path)).max() > MOVES * scale


def test_mistral_window_is_aios_runs_own(exports):
    """The llama row (Mistral): llama.cpp's graph ignores the window, aios-run applies it as
    transformers does; the export says so. Within the window both agree, local RoPE base
    included (the global one: llama.cpp has no other for llama)."""
    path, warnings = exports("mistral")
    assert any("llama.cpp ignores llama.attention.sliding_window (8)" in w for w in warnings)
    theirs, ours = llama_cpp_logits(path), Model(path, arithmetic="float").forward(IDS, all_logits=True)
    scale = float(np.abs(theirs).max())
    assert np.abs(ours[:8] - theirs[:8]).max() <= TOL * scale
    assert np.abs(ours[8:] - theirs[8:]).max() > MOVES * scale


def test_an_attention_scale_llama_cpp_does_not_compute_is_said_at_export(exports):
    path, warnings = exports("gemma3-qpas")
    notes = [w for w in warnings if "aios.attention.scale" in w]
    assert len(notes) == 1 and "1/sqrt(32)" in notes[0] and "\n" not in notes[0]
    theirs, ours = llama_cpp_logits(path), Model(path, arithmetic="float").forward(IDS, all_logits=True)
    assert np.abs(ours - theirs).max() > MOVES * float(np.abs(theirs).max())  # aios-run: the model's scale
    for row in ("gemma3-62", "gemma2-46"):  # llama.cpp's rule gives the model's scale: nothing to say
        assert not any("aios.attention.scale" in w for w in exports(row)[1])


def test_rope_scaling_types_aios_run_does_not_run_are_refused(exports, tmp_path):
    path, _ = exports("llama")
    assert gguf.GGUFReader(str(path)).get_field("llama.rope.scaling.type").contents() == "linear"
    yarn = rewrite(path, tmp_path / "yarn.gguf", drop_keys={"llama.rope.scaling.type"},
                   add={"llama.rope.scaling.type": "yarn"})
    with pytest.raises(AiosError, match="rope.scaling.type' is 'yarn'"):
        Model(yarn, arithmetic="float")


@pytest.mark.parametrize("key, value, message", [
    ("llama.attention.value_length", "16", "value_length' is '16'; the runtime needs a positive integer"),
    ("llama.rope.scaling.factor", "2", "factor' is '2'; the runtime needs a finite number"),
])
def test_a_lying_key_read_for_the_defaults_is_one_sentence(exports, tmp_path, key, value, message):
    path, _ = exports("llama")
    bad = rewrite(path, tmp_path / "bad.gguf", drop_keys={key}, add={key: value})
    with pytest.raises(AiosError, match=message):
        Model(bad, arithmetic="float")
