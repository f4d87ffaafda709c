"""MODEL resolution: the four forms, the HF cache, and every bad-input error."""

from __future__ import annotations

import json

import pytest
import torch

from aios.errors import (
    ExitCode,
    InvalidModelError,
    ModelNotFoundError,
    UnsupportedArchitectureError,
    WeightsUnavailableError,
)
from aios.models import hub, resolve_model
from tests.conftest import populate_fake_hub_cache

# --- form 1: local HF folder ------------------------------------------------------------


def test_local_folder_single_file(hf_model):
    folder = hf_model("llama")
    h = resolve_model(str(folder))
    assert h.kind == "hf-folder" and h.has_weights
    inv = {t.name: t for t in h.tensor_inventory()}
    t = inv["model.layers.0.mlp.down_proj.weight"]
    assert t.shape == (64, 96) and t.dtype == "F32" and t.nbytes == 64 * 96 * 4
    w = h.tensor("model.layers.0.mlp.down_proj.weight")
    assert tuple(w.shape) == (64, 96)
    # lazy read equals what transformers loads
    model = h.load_torch()
    assert torch.equal(model.model.layers[0].mlp.down_proj.weight, w)


def test_local_folder_sharded(hf_model):
    folder = hf_model("falcon", shard_kb=40)
    assert (folder / "model.safetensors.index.json").is_file()
    assert len(list(folder.glob("*.safetensors"))) > 1
    h = resolve_model(str(folder))
    files = {t.file for t in h.tensor_inventory()}
    assert len(files) > 1
    single = resolve_model(str(hf_model("falcon", name="single")))
    assert h.weight_bytes == single.weight_bytes


def test_config_json_path_resolves_to_folder(hf_model):
    folder = hf_model("gpt2")
    assert resolve_model(str(folder / "config.json")).path == folder


def test_bf16_inventory_bytes(hf_model):
    folder = hf_model("llama", name="bf16", dtype="bfloat16")
    import transformers  # noqa: F401  (dtype saved as the config says)

    h = resolve_model(str(folder))
    t = {t.name: t for t in h.tensor_inventory()}["model.layers.0.mlp.up_proj.weight"]
    assert t.dtype in ("BF16", "F32")
    assert t.nbytes == t.n_elements * (2 if t.dtype == "BF16" else 4)


# --- form 2: GGUF ----------------------------------------------------------------------


def test_gguf_file_facts_and_tensors(gguf_file):
    path = gguf_file(arch="falcon", n_layers=3, d=32, heads=4, kv=1, ffn=64)
    h = resolve_model(str(path))
    f = h.facts
    assert h.kind == "gguf" and h.arch.name == "falcon"
    assert (f.n_layers, f.d_model, f.n_heads, f.n_kv_heads, f.head_dim, f.d_ffn) == (3, 32, 4, 1, 8, 64)
    assert f.activation == "gelu" and f.activation_key.startswith("llama.cpp default")
    inv = {t.name: t for t in h.tensor_inventory()}
    assert inv["blk.0.ffn_up.weight"].shape == (64, 32)
    assert inv["blk.0.ffn_up.weight"].nbytes == 64 * 32 * 4
    assert h.tensor("blk.0.ffn_down.weight").shape == (32, 64)


def test_gguf_declared_activation_differs_from_llama_cpp(gguf_file):
    h = resolve_model(str(gguf_file(activation="relu")))
    assert h.facts.activation == "relu" and h.facts.activation_key == "aios.ffn_activation"
    assert any("llama.cpp" in n and "relu" in n for n in h.notes)


def test_folder_with_one_gguf(gguf_file, tmp_path):
    path = gguf_file()
    assert resolve_model(str(tmp_path)).path == path


# --- form 3: hub id in the local HF cache -----------------------------------------------


def test_hub_id_from_hf_home_cache(hf_model, clean_hf_env):
    src = hf_model("qwen2")
    snap = populate_fake_hub_cache(clean_hf_env, "acme/tiny-qwen", src)
    h = resolve_model("acme/tiny-qwen")
    assert h.kind == "hub-cache" and h.hub_id == "acme/tiny-qwen"
    assert h.path == snap and h.has_weights
    assert h.load_torch() is not None  # blobs behind symlinks load


def test_hub_cache_env_overrides_hf_home(hf_model, clean_hf_env, monkeypatch, tmp_path):
    other = tmp_path / "other-cache"
    populate_fake_hub_cache(other, "acme/m", hf_model("gpt2"))
    with pytest.raises(ModelNotFoundError, match="not in the local Hugging Face cache"):
        resolve_model("acme/m")
    monkeypatch.setenv("HF_HUB_CACHE", str(other))
    assert resolve_model("acme/m").arch.name == "gpt2"


def test_alias_prefers_cached_weights(hf_model, clean_hf_env):
    populate_fake_hub_cache(clean_hf_env, "tiiuae/falcon-7b", hf_model("falcon"))
    h = resolve_model("falcon-7b")
    assert h.kind == "hub-cache" and h.has_weights and h.facts.d_model == 64


def test_uncached_hub_id_says_how_to_fetch(clean_hf_env):
    with pytest.raises(ModelNotFoundError, match="aios-contract fetch acme/none"):
        resolve_model("acme/none")


def test_download_uses_cache_and_patterns(monkeypatch, clean_hf_env, tmp_path):
    calls = {}

    def fake_snapshot_download(repo_id, **kw):
        calls.update(kw, repo_id=repo_id)
        return str(tmp_path)

    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    assert hub.download("acme/x") == tmp_path
    assert calls["repo_id"] == "acme/x" and calls["cache_dir"] == str(clean_hf_env)
    assert "*.safetensors" in calls["allow_patterns"]
    assert not any(p.endswith(".bin") for p in calls["allow_patterns"])


def test_download_refused_offline(monkeypatch, clean_hf_env):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(hub.DownloadError, match="HF_HUB_OFFLINE"):
        hub.download("acme/x")


# --- form 4: alias without weights -------------------------------------------------------


def test_alias_without_weights(clean_hf_env):
    h = resolve_model("llama-3.1-8b")
    assert h.kind == "alias" and not h.has_weights and h.hub_id == "meta-llama/Llama-3.1-8B"
    with pytest.raises(WeightsUnavailableError, match="aios-contract fetch meta-llama/Llama-3.1-8B") as e:
        h.tensor_inventory()
    assert e.value.exit_code == ExitCode.NOT_EVALUATED


# --- errors -------------------------------------------------------------------------------


def test_missing_path():
    with pytest.raises(ModelNotFoundError, match="No such file"):
        resolve_model("./does/not/exist")


def test_unknown_name():
    with pytest.raises(ModelNotFoundError, match="built-in alias"):
        resolve_model("no-such-model")


def test_folder_that_is_not_a_model(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(InvalidModelError, match="no config.json"):
        resolve_model(str(tmp_path))


def test_config_without_weights(hf_model):
    folder = hf_model("llama")
    for p in folder.glob("*.safetensors"):
        p.unlink()
    with pytest.raises(InvalidModelError, match="no .safetensors"):
        resolve_model(str(folder))


def test_pickle_only_folder_refused(hf_model):
    folder = hf_model("llama")
    for p in folder.glob("*.safetensors"):
        p.rename(p.with_suffix(".bin"))
    with pytest.raises(InvalidModelError, match="pickled"):
        resolve_model(str(folder))


def test_unsupported_architecture(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mamba"}))
    with pytest.raises(UnsupportedArchitectureError, match="'mamba' is not supported"):
        resolve_model(str(tmp_path))


def test_invalid_config_json(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(InvalidModelError, match="not valid JSON"):
        resolve_model(str(tmp_path))


def test_truncated_safetensors(hf_model):
    folder = hf_model("llama")
    st = folder / "model.safetensors"
    data = st.read_bytes()
    st.write_bytes(data[: len(data) // 2])
    with pytest.raises(InvalidModelError, match="truncated or corrupt"):
        resolve_model(str(folder))


def test_corrupt_safetensors_header(hf_model):
    folder = hf_model("llama")
    st = folder / "model.safetensors"
    data = bytearray(st.read_bytes())
    data[8:40] = b"\xff" * 32
    st.write_bytes(bytes(data))
    with pytest.raises(InvalidModelError, match="not a readable safetensors"):
        resolve_model(str(folder))


def test_sharded_index_missing_shard(hf_model):
    folder = hf_model("falcon", shard_kb=40)
    sorted(folder.glob("model-*.safetensors"))[0].unlink()
    with pytest.raises(InvalidModelError, match="missing"):
        resolve_model(str(folder))


def test_truncated_gguf(gguf_file):
    path = gguf_file()
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 100])
    with pytest.raises(InvalidModelError, match="truncated or corrupt GGUF"):
        resolve_model(str(path))


def test_not_a_gguf(tmp_path):
    p = tmp_path / "fake.gguf"
    p.write_bytes(b"PK\x03\x04" + b"\0" * 64)
    with pytest.raises(InvalidModelError, match="not a GGUF file"):
        resolve_model(str(p))


def test_gguf_unsupported_arch(tmp_path):
    import gguf

    p = tmp_path / "m.gguf"
    w = gguf.GGUFWriter(str(p), "rwkv6")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(UnsupportedArchitectureError, match="rwkv6"):
        resolve_model(str(p))


# --- memory plan -----------------------------------------------------------------------


def test_load_plan_steps_down_to_offload(hf_model):
    h = resolve_model(str(hf_model("llama")))
    params = sum(t.n_elements for t in h.tensor_inventory())
    assert h.load_plan(available=params * 100)["dtype"] == "float32"
    assert h.load_plan(available=params * 4)["dtype"] == "bfloat16"
    plan = h.load_plan(available=params * 2)
    assert plan["offload"]


def test_offloaded_model_runs_and_matches(hf_model):
    h = resolve_model(str(hf_model("llama")))
    params = sum(t.n_elements for t in h.tensor_inventory())
    ids = torch.tensor([[1, 2, 3, 4]])
    ref = h.load_torch(dtype="bfloat16")(input_ids=ids).logits
    off = h.load_torch(available=params * 2)(input_ids=ids).logits
    assert any("offload" in n for n in h.notes)
    torch.testing.assert_close(off, ref, rtol=1e-2, atol=1e-2)


def test_index_with_path_traversal_refused(hf_model):
    folder = hf_model("falcon", shard_kb=40)
    index = folder / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    first = next(iter(data["weight_map"]))
    data["weight_map"][first] = "../../etc/passwd.safetensors"
    index.write_text(json.dumps(data))
    with pytest.raises(InvalidModelError, match="invalid shard"):
        resolve_model(str(folder))


def test_gguf_same_activation_family_is_not_flagged(gguf_file):
    h = resolve_model(str(gguf_file(activation="gelu_new")))  # llama.cpp runs gelu: same function
    assert not any("llama.cpp would execute" in n for n in h.notes)


def test_a_sound_file_is_walked_once_until_it_changes(gguf_file, monkeypatch):
    """check_gguf_bounds remembers a sound file by path, inode, size and mtime: the command's
    argument check and its loader walk it once; a rewritten file is walked (and refused) again."""
    import os

    from aios.models import gguf_bounds

    path = gguf_file()
    walks = []
    walk = gguf_bounds._walk
    monkeypatch.setattr(gguf_bounds, "_walk", lambda buf: walks.append(1) or walk(buf))
    gguf_bounds.check_gguf_bounds(path)
    gguf_bounds.check_gguf_bounds(path)
    assert len(walks) == 1
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 100])
    os.utime(path, ns=(1, 1))  # a different stamp even within the clock's resolution
    with pytest.raises(InvalidModelError, match="truncated or corrupt GGUF"):
        gguf_bounds.check_gguf_bounds(path)
    assert len(walks) == 2
