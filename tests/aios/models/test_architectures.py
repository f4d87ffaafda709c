"""Every architecture row agrees with the HF modelling code it describes."""

from __future__ import annotations

import gguf
import pytest
import torch

from aios.errors import UnsupportedArchitectureError
from aios.models import ARCHITECTURES, resolve_model
from aios.models.aliases import ALIASES, find_alias
from aios.models.architectures import by_name, for_gguf_arch, for_hf_config
from tests.conftest import TINY_CONFIGS

ROW_OF = {"mistral": "llama"}


def _module(model, dotted: str):
    m = model
    for part in dotted.split("."):
        m = getattr(m, part)
    return m


def _in_out(mod) -> tuple[int, int]:
    if isinstance(mod, torch.nn.Linear):
        return mod.in_features, mod.out_features
    w = mod.weight  # gpt2 Conv1D: [in, out]
    return w.shape[0], w.shape[1]


@pytest.mark.parametrize("kind", sorted(TINY_CONFIGS))
def test_row_matches_modelling_code(kind, hf_model):
    handle = resolve_model(str(hf_model(kind)))
    facts, arch = handle.facts, handle.arch
    assert arch.name == ROW_OF.get(kind, kind)
    model = handle.load_torch()
    for i in range(facts.n_layers):
        down = _module(model, arch.block(i, arch.ffn_down))
        up = _module(model, arch.block(i, arch.ffn_up))
        assert _in_out(down) == (facts.d_ffn, facts.d_model)
        up_out = 2 * facts.d_ffn if arch.fused_gate_up else facts.d_ffn
        assert _in_out(up) == (facts.d_model, up_out)
        if arch.ffn_gate:
            assert _in_out(_module(model, arch.block(i, arch.ffn_gate))) == (facts.d_model, facts.d_ffn)
        act = _module(model, arch.block(i, arch.ffn_act_module))
        assert isinstance(act, torch.nn.Module)
        names = {n for n, _ in model.named_parameters()}
        for rel in arch.shareable:
            assert arch.block(i, rel) in names, rel
    # KV heads / head_dim as the attention weights really have them
    sd = handle.store.inventory
    kv_dim = facts.n_kv_heads * facts.head_dim
    q_dim = facts.n_heads * facts.head_dim
    if arch.name.startswith("falcon"):
        qkv = sd[arch.block(0, "self_attention.query_key_value.weight")].shape[0]
        assert qkv == q_dim + 2 * kv_dim
    elif arch.name == "gpt2":
        assert sd[arch.block(0, "attn.c_attn.weight")].shape[1] == 3 * q_dim
    elif arch.name == "phi3":
        assert sd[arch.block(0, "self_attn.qkv_proj.weight")].shape[0] == q_dim + 2 * kv_dim
    else:
        assert sd[arch.block(0, "self_attn.k_proj.weight")].shape[0] == kv_dim
        assert sd[arch.block(0, "self_attn.q_proj.weight")].shape[0] == q_dim


@pytest.mark.parametrize("row", ARCHITECTURES, ids=lambda r: r.name)
def test_gguf_names_exist_for_every_shareable_tensor(row):
    tmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH[row.gguf_arch], 4)
    for rel in row.shareable:
        hf = row.block(1, rel)
        assert tmap.get_name(hf, try_suffixes=(".weight",)) is not None, hf


def test_falcon_rows_selected_by_new_decoder_flag():
    assert for_hf_config({"model_type": "falcon"}).name == "falcon"
    assert for_hf_config({"model_type": "falcon", "new_decoder_architecture": True}).name == "falcon-new-decoder"
    assert for_gguf_arch("falcon", has_attn_norm_2=True).name == "falcon-new-decoder"


def test_unsupported_architecture_names_supported_ones():
    with pytest.raises(UnsupportedArchitectureError, match="not supported.*llama"):
        for_hf_config({"model_type": "mamba"})
    with pytest.raises(UnsupportedArchitectureError):
        for_gguf_arch("rwkv6")
    with pytest.raises(UnsupportedArchitectureError):
        by_name("nope")


def test_falcon_7b_alias_facts():
    h = resolve_model("falcon-7b")
    f = h.facts
    assert (f.n_layers, f.d_model, f.n_heads, f.n_kv_heads, f.head_dim, f.d_ffn) == (32, 4544, 71, 1, 64, 18176)
    assert f.activation == "gelu" and f.parallel_attn and f.tied_embeddings and not f.gated_ffn
    assert f.attention_kind == "MQA"
    # R2 formula (docs/design.md, "The contract"): L x H_kv x d_head x C x 4 bytes at C = 4096 -> 32 MiB
    assert f.n_layers * f.n_kv_heads * f.head_dim * 4096 * 4 == 32 * 2**20
    assert not h.has_weights


@pytest.mark.parametrize(
    "name, kv, gated, act",
    [
        ("falcon-40b", 8, False, "gelu"),
        ("llama-2-7b", 32, True, "silu"),
        ("llama-3.1-8b", 8, True, "silu"),
        ("mistral-7b", 8, True, "silu"),
        ("qwen2.5-7b", 4, True, "silu"),
        ("gemma-2-9b", 8, True, "gelu_pytorch_tanh"),
        ("phi-3-mini", 32, True, "silu"),
        ("ReluLLaMA-7B", 32, True, "relu"),
        ("ProSparse-Llama-2-7B", 32, True, "fatrelu"),
    ],
)
def test_alias_facts(name, kv, gated, act):
    f = resolve_model(name).facts
    assert (f.n_kv_heads, f.gated_ffn, f.activation) == (kv, gated, act)
    if name == "gemma-2-9b":
        assert f.head_dim == 256  # explicit, not d_model / heads
    if name.startswith("ProSparse"):
        assert f.activation_threshold == 0.01


def test_every_alias_resolves():
    for a in ALIASES:
        assert find_alias(a.name) is a
        if a.hub_id:
            assert find_alias(a.hub_id) is a
        resolve_model(a.name)
