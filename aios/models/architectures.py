"""Architecture knowledge as data: one row per architecture, no ``if arch == ...`` elsewhere.

A row says where the FFN input, activation and output live (module names relative to a
decoder block), which config keys hold the facts, how KV heads and head_dim are derived,
which GGUF architecture it maps to, and the *graph*: norm kind, RoPE pairing, fused or
separate QKV, parallel attention/MLP, gated FFN, what llama.cpp runs for the FFN, the
weight layouts the GGUF export applies, the extra hyperparameter keys it writes, and whether
``aios-run`` executes it. The runtime's forward pass, its GGUF structure checks, the exporter
and the contract checks read these fields; HF -> GGUF tensor names come from gguf-py's
``TensorNameMap`` (we depend on it rather than copying its tables).

Adding an architecture that reuses existing graph features is adding a row to
``ARCHITECTURES`` (plus tests); see docs/design.md, "How to add an architecture".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from aios.errors import UnsupportedArchitectureError


@dataclass(frozen=True)
class Architecture:
    name: str  # our row id
    hf_model_types: tuple[str, ...]  # config.json "model_type" values served by the row
    gguf_arch: str  # gguf.MODEL_ARCH member name, also the GGUF general.architecture (lower)
    description: str
    # --- config keys (first present wins) -------------------------------------------------
    n_layers_keys: tuple[str, ...]
    d_model_keys: tuple[str, ...]
    n_heads_keys: tuple[str, ...]
    d_ffn_keys: tuple[str, ...]
    activation_keys: tuple[str, ...]  # the FFN activation's config key(s)
    default_activation: str  # what the HF code uses when the key is absent
    d_ffn_default_mult: int = 4  # d_ffn = mult * d_model when no d_ffn key is present
    kv_heads_keys: tuple[str, ...] = ()  # absent -> n_heads (MHA)
    mqa_flag_key: str | None = None  # config flag meaning exactly one KV head
    head_dim_keys: tuple[str, ...] = ("head_dim",)  # absent -> d_model // n_heads
    parallel_attn_key: str | None = None
    parallel_attn_default: bool = False
    tied_key: str = "tie_word_embeddings"
    tied_default: bool = False
    context_keys: tuple[str, ...] = ("max_position_embeddings",)
    # --- selection among rows sharing a model_type --------------------------------------
    when: Mapping[str, Any] = field(default_factory=dict)  # config values that must match
    # --- module / tensor layout (relative to one decoder block) -------------------------
    block_prefix: str = "model.layers.{i}."
    ffn_up: str = "mlp.up_proj"
    ffn_gate: str | None = None
    ffn_down: str = "mlp.down_proj"  # its *input* is the FFN activation output (R1 hook point)
    ffn_act_module: str = "mlp.act_fn"
    gated_ffn: bool = False  # act(gate(x)) * up(x); a fused gate_up counts as gated
    fused_gate_up: bool = False  # one matrix holds [gate; up] (phi3)
    # matrices that may be shared across layers (R3 candidates), relative names
    shareable: tuple[str, ...] = ()
    transposed_linear: bool = False  # gpt2 Conv1D stores weights as [in, out]
    # --- the graph (read by runtime/model.py, runtime/gguf_checks.py, convert/gguf/) ----
    norm: str = "rms"  # "rms" (RMSNorm) or "layer" (LayerNorm, optional bias)
    rope: str | None = "normal"  # RoPE pairing as llama.cpp runs it: "normal" = interleaved
    #   pairs (q/k rows permuted from HF's rotate-half order at export), "neox" = halves as
    #   stored; None: learned absolute positions (a position_embd table added to the embeddings)
    fused_qkv: bool = False  # one attn_qkv matrix [q; k; v] in the GGUF
    qk_norm: bool = False  # RMSNorm on q and k per head (attn_q_norm / attn_k_norm)
    post_norms: bool = False  # extra norms after attention and FFN (Gemma 2/3)
    # a parallel block whose MLP has its own input norm (Falcon-40B's ln_mlp): the GGUF tensor
    # name (relative to blk.N.) of that norm; None: the MLP reads the attention norm's output
    parallel_ffn_norm: str | None = None
    attn_softcap_key: str | None = None  # config key of attention logit soft-capping
    final_softcap_key: str | None = None  # config key of final logit soft-capping
    embed_scale: bool = False  # embeddings multiplied by sqrt(d_model)
    # llama.cpp multiplies q by the attention scale before q·k (softmax scale 1) instead of
    # scaling the scores: the same math, another rounding, which the int8 path reproduces
    q_prescale: bool = False
    sliding_window_key: str | None = None  # config key of the local-attention window
    # which layers use the window when a file gives no per-layer pattern: every layer but each
    # swa_pattern-th (llama.cpp's default for the architecture); 0 = all layers
    swa_pattern: int = 0
    # --- what llama.cpp's loader assumes for a key a GGUF lacks (read_hparams applies the same;
    #     docs/design.md, "llama.cpp's defaults") ---------------------------------------------
    # aios-run windows local layers by the file's {arch}.attention.sliding_window. llama.cpp's
    # loader reads it for Gemma 2/3 (llama_cpp_window); for the llama row (Mistral) aios-run applies
    # it as transformers does while llama.cpp's graph attends to the whole context; Phi-3's it reads
    # and disables, the others never read it
    runtime_window: bool = False
    llama_cpp_window: bool = False
    swa_default_window: int = 0  # the window when the file has none (Gemma 2: 4096; 0: no window)
    # the local layers' RoPE: llama.cpp reads {arch}.rope.freq_base_swa (else the local layers use the
    # global base); missing, it is local_rope_base_default (0: the global base); local_rope_scaled:
    # the local layers get the file's RoPE scaling factor too (Gemma 2) or run unscaled (Gemma 3)
    reads_local_rope: bool = False
    local_rope_base_default: float = 0.0
    local_rope_scaled: bool = True
    # soft caps when the file has no {arch}.attn_logit_softcapping / final_logit_softcapping (read
    # only for a row with the matching *_softcap_key); 0: none
    attn_softcap_default: float = 0.0
    final_softcap_default: float = 0.0
    # llama.cpp hard-codes the attention scale: 1/sqrt(head_dim), or 1/sqrt(d_model / n_heads) for
    # the block counts listed here (Gemma 2/3 27B: query_pre_attn_scalar = d_model / n_heads)
    attn_scale_width_layers: tuple[int, ...] = ()
    # What llama.cpp executes for this GGUF architecture's FFN, whatever the file declares:
    # llama.cpp hard-codes the activation per architecture (docs/design.md, "Pitfalls").
    llama_cpp_ffn_activation: str = "silu"
    # --- GGUF export -----------------------------------------------------------------------
    export_model_types: tuple[str, ...] = ()  # model_type values the export writes correctly
    # RoPE scaling types (config rope_type) the export writes the way llama.cpp runs them
    rope_scaling_types: tuple[str, ...] = ("default", "linear")
    # tensors the export computes from the config (convert/gguf/plan.py GENERATED_TENSORS)
    generated_tensors: tuple[str, ...] = ()
    # (layout rule, HF tensor name fragment): rules convert/gguf/tensors.py applies to the
    # source tensor before encoding ("falcon_qkv", "rope_q", "rope_k", "transpose")
    layout_rules: tuple[tuple[str, str], ...] = ()
    # architecture keys beyond the common ones (convert/gguf/metadata.py HPARAM_WRITERS)
    gguf_hparams: tuple[str, ...] = ()
    # --- tokenizer -------------------------------------------------------------------------
    # a SentencePiece vocabulary's control tokens strip the whitespace after them (Phi-3's
    # tokenizer_config "rstrip"; in no GGUF key, llama.cpp restores it by architecture)
    spm_control_tokens_rstrip: bool = False
    # --- aios-run --------------------------------------------------------------------------
    runtime: bool = False  # the forward pass executes this graph

    @property
    def required_layer_tensors(self) -> tuple[str, ...]:
        """Per-layer operators the forward pass calls (GGUF names relative to ``blk.N.``)."""
        attn = ("attn_qkv.weight",) if self.fused_qkv else ("attn_q.weight", "attn_k.weight", "attn_v.weight")
        ffn_norm = ((f"{self.parallel_ffn_norm}.weight",) if self.parallel_ffn_norm else ()) \
            if self.parallel_attn_default else ("ffn_norm.weight",)
        qk_norm = ("attn_q_norm.weight", "attn_k_norm.weight") if self.qk_norm else ()
        post = ("post_attention_norm.weight", "post_ffw_norm.weight") if self.post_norms else ()
        gate = ("ffn_gate.weight",) if self.gated_ffn and not self.fused_gate_up else ()
        return ("attn_norm.weight", *attn, *qk_norm, "attn_output.weight", *ffn_norm, *gate,
                "ffn_up.weight", "ffn_down.weight", *post)

    def llama_cpp_attn_scale(self, n_layers: int, d_model: int, n_heads: int, head_dim: int) -> float:
        """The q·k scale llama.cpp computes for this architecture (it reads no key for it)."""
        return 1 / math.sqrt(d_model // n_heads if n_layers in self.attn_scale_width_layers else head_dim)

    def layout_rule(self, hf_name: str) -> str | None:
        """The export layout rule for HF tensor ``hf_name`` (None: stored as is)."""
        return next((r for r, fragment in self.layout_rules if fragment in hf_name), None)

    def block(self, i: int, rel: str) -> str:
        """Full HF module/tensor prefix of relative name ``rel`` in block ``i``."""
        return self.block_prefix.format(i=i) + rel


_LLAMA_KEYS = dict(
    n_layers_keys=("num_hidden_layers",),
    d_model_keys=("hidden_size",),
    n_heads_keys=("num_attention_heads",),
    d_ffn_keys=("intermediate_size",),
    kv_heads_keys=("num_key_value_heads",),
    block_prefix="model.layers.{i}.",
    ffn_up="mlp.up_proj",
    ffn_gate="mlp.gate_proj",
    ffn_down="mlp.down_proj",
    ffn_act_module="mlp.act_fn",
    gated_ffn=True,
    shareable=(
        "self_attn.q_proj.weight",
        "self_attn.k_proj.weight",
        "self_attn.v_proj.weight",
        "self_attn.o_proj.weight",
        "mlp.gate_proj.weight",
        "mlp.up_proj.weight",
        "mlp.down_proj.weight",
    ),
    layout_rules=(("rope_q", "self_attn.q_proj"), ("rope_k", "self_attn.k_proj")),
)

_FALCON_COMMON = dict(
    n_layers_keys=("num_hidden_layers", "n_layer"),
    d_model_keys=("hidden_size",),
    n_heads_keys=("num_attention_heads", "n_head"),
    d_ffn_keys=("ffn_hidden_size",),
    activation_keys=("activation",),
    default_activation="gelu",
    kv_heads_keys=("num_kv_heads", "n_head_kv"),
    block_prefix="transformer.h.{i}.",
    ffn_up="mlp.dense_h_to_4h",
    ffn_down="mlp.dense_4h_to_h",
    ffn_act_module="mlp.act",
    tied_default=True,
    context_keys=("max_position_embeddings",),
    shareable=(
        "self_attention.query_key_value.weight",
        "self_attention.dense.weight",
        "mlp.dense_h_to_4h.weight",
        "mlp.dense_4h_to_h.weight",
    ),
    norm="layer",
    rope="neox",
    fused_qkv=True,
    llama_cpp_ffn_activation="gelu",
    export_model_types=("falcon", "RefinedWebModel", "RefinedWeb"),
    layout_rules=(("falcon_qkv", "self_attention.query_key_value"),),
    gguf_hparams=("tensor_data_layout", "rope_scaling"),
)

ARCHITECTURES: tuple[Architecture, ...] = (
    Architecture(
        name="falcon",
        hf_model_types=("falcon", "RefinedWebModel", "RefinedWeb"),
        gguf_arch="FALCON",
        description="Falcon-7B style: multi-query attention, attention and MLP in parallel",
        mqa_flag_key="multi_query",
        parallel_attn_key="parallel_attn",
        parallel_attn_default=True,
        when={"new_decoder_architecture": False},
        runtime=True,
        **_FALCON_COMMON,
    ),
    Architecture(
        name="falcon-new-decoder",
        hf_model_types=("falcon", "RefinedWeb"),
        gguf_arch="FALCON",
        description="Falcon-40B style new decoder: grouped KV heads, two layer norms, parallel",
        parallel_attn_default=True,  # the new decoder is always parallel
        parallel_ffn_norm="attn_norm_2",  # ln_mlp; attn_norm is ln_attn
        when={"new_decoder_architecture": True},
        runtime=True,
        **_FALCON_COMMON,
    ),
    Architecture(
        name="llama",
        hf_model_types=("llama", "mistral"),
        gguf_arch="LLAMA",
        description="Llama family: gated SiLU FFN (SwiGLU), RoPE, grouped-query attention",
        activation_keys=("hidden_act",),
        default_activation="silu",
        export_model_types=("llama", "mistral"),
        gguf_hparams=("vocab_size", "rope_dimension_count", "key_value_length", "rope_scaling", "sliding_window"),
        rope_scaling_types=("default", "linear", "llama3"),  # llama3: per-frequency factors
        # Mistral v0.1's window (every layer); llama.cpp's llama graph ignores the key and attends
        # to the whole context, aios-run applies it as transformers does
        sliding_window_key="sliding_window",
        runtime_window=True,
        generated_tensors=("rope_freqs",),
        runtime=True,
        **_LLAMA_KEYS,
    ),
    Architecture(
        name="qwen2",
        hf_model_types=("qwen2",),
        gguf_arch="QWEN2",
        description="Qwen2/2.5: the Llama graph with q/k/v biases and NeoX RoPE (q/k stored as is)",
        activation_keys=("hidden_act",),
        default_activation="silu",
        rope="neox",
        export_model_types=("qwen2",),
        gguf_hparams=("rope_scaling",),
        runtime=True,
        **{**_LLAMA_KEYS, "layout_rules": ()},
    ),
    Architecture(
        name="qwen3",
        hf_model_types=("qwen3",),
        gguf_arch="QWEN3",
        description="Qwen3: the Llama graph with per-head RMSNorm on q and k, NeoX RoPE, explicit head_dim",
        activation_keys=("hidden_act",),
        default_activation="silu",
        rope="neox",
        qk_norm=True,
        export_model_types=("qwen3",),
        gguf_hparams=("key_value_length", "rope_scaling"),
        runtime=True,
        **{**_LLAMA_KEYS, "layout_rules": ()},
    ),
    Architecture(
        name="gemma3",
        hf_model_types=("gemma3_text",),
        gguf_arch="GEMMA3",
        description="Gemma 3 (text): GeGLU-tanh FFN, q/k RMSNorm, four norms per block stored as "
                    "(1 + w), sqrt(d) embedding scale, local (sliding-window) and global layers with "
                    "their own RoPE bases",
        activation_keys=("hidden_activation", "hidden_act"),
        default_activation="gelu_pytorch_tanh",
        tied_default=True,
        rope="neox",
        qk_norm=True,
        post_norms=True,
        q_prescale=True,
        embed_scale=True,
        final_softcap_key="final_logit_softcapping",
        sliding_window_key="sliding_window",
        swa_pattern=6,
        runtime_window=True,
        llama_cpp_window=True,  # no window key: no local layers at all
        reads_local_rope=True,
        local_rope_base_default=10000.0,  # llama_hparams' default, not the global base
        local_rope_scaled=False,  # rope_freq_scale_train_swa keeps its default, 1
        attn_scale_width_layers=(62,),  # 27B
        llama_cpp_ffn_activation="gelu_pytorch_tanh",
        export_model_types=("gemma3_text",),
        gguf_hparams=("key_value_length", "sliding_window", "rope_freq_base_swa",
                      "final_logit_softcapping", "attention_scale", "rope_scaling"),
        runtime=True,
        **{**_LLAMA_KEYS, "layout_rules": (("plus_one", "norm.weight"),)},
    ),
    Architecture(
        name="gemma2",
        hf_model_types=("gemma2",),
        gguf_arch="GEMMA2",
        description="Gemma 2: GeGLU-tanh FFN, four (1 + w) norms per block, sqrt(d) embedding scale, "
                    "soft-capped attention and final logits, sliding-window layers alternating with global ones",
        activation_keys=("hidden_activation", "hidden_act"),
        default_activation="gelu_pytorch_tanh",
        tied_default=True,
        post_norms=True,
        q_prescale=True,
        attn_softcap_key="attn_logit_softcapping",
        final_softcap_key="final_logit_softcapping",
        embed_scale=True,
        sliding_window_key="sliding_window",
        swa_pattern=2,
        runtime_window=True,
        llama_cpp_window=True,
        swa_default_window=4096,
        reads_local_rope=True,  # missing: the global base and scale
        attn_softcap_default=50.0,
        final_softcap_default=30.0,
        attn_scale_width_layers=(46,),  # 27B
        llama_cpp_ffn_activation="gelu_pytorch_tanh",
        rope="neox",
        export_model_types=("gemma2",),
        gguf_hparams=("key_value_length", "sliding_window", "attn_logit_softcapping",
                      "final_logit_softcapping", "attention_scale", "rope_scaling"),
        runtime=True,
        **{**_LLAMA_KEYS, "layout_rules": (("plus_one", "norm.weight"),)},
    ),
    Architecture(
        name="phi3",
        hf_model_types=("phi3",),
        gguf_arch="PHI3",
        description="Phi-3: fused gate_up projection with SiLU gating, fused qkv",
        activation_keys=("hidden_act",),
        default_activation="silu",
        n_layers_keys=("num_hidden_layers",),
        d_model_keys=("hidden_size",),
        n_heads_keys=("num_attention_heads",),
        d_ffn_keys=("intermediate_size",),
        kv_heads_keys=("num_key_value_heads",),
        ffn_up="mlp.gate_up_proj",
        ffn_down="mlp.down_proj",
        ffn_act_module="mlp.activation_fn",
        gated_ffn=True,
        fused_gate_up=True,
        shareable=("self_attn.qkv_proj.weight", "mlp.gate_up_proj.weight"),
        fused_qkv=True,
        q_prescale=True,
        rope="neox",
        sliding_window_key="sliding_window",  # llama.cpp runs phi3 without it; so does the export
        spm_control_tokens_rstrip=True,
        export_model_types=("phi3",),
        gguf_hparams=("rope_dimension_count", "rope_scaling"),
        runtime=True,
    ),
    Architecture(
        name="gpt2",
        hf_model_types=("gpt2",),
        gguf_arch="GPT2",
        description="GPT-2: learned positions, MHA, GELU (tanh) FFN, Conv1D weights [in, out]",
        n_layers_keys=("n_layer",),
        d_model_keys=("n_embd",),
        n_heads_keys=("n_head",),
        d_ffn_keys=("n_inner",),
        activation_keys=("activation_function",),
        default_activation="gelu_new",
        tied_default=True,
        context_keys=("n_positions", "n_ctx"),
        block_prefix="transformer.h.{i}.",
        ffn_up="mlp.c_fc",
        ffn_down="mlp.c_proj",
        ffn_act_module="mlp.act",
        transposed_linear=True,
        shareable=("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight"),
        norm="layer",
        rope=None,
        fused_qkv=True,
        llama_cpp_ffn_activation="gelu",
        export_model_types=("gpt2",),
        layout_rules=tuple(("transpose", t) for t in ("attn.c_attn.weight", "attn.c_proj.weight",
                                                       "mlp.c_fc.weight", "mlp.c_proj.weight")),
        runtime=True,
    ),
)

# activation names that are the same function as far as "which activation runs" goes
ACT_FAMILY = {"gelu_new": "gelu", "gelu_pytorch_tanh": "gelu", "gelu_fast": "gelu",
              "gelu_python": "gelu", "gelu_accurate": "gelu", "swish": "silu"}  # fmt: skip


def activation_family(name: str) -> str:
    return ACT_FAMILY.get(name.lower(), name.lower())


def supported_model_types() -> list[str]:
    return sorted({t for a in ARCHITECTURES for t in a.hf_model_types})


def for_hf_config(config: Mapping[str, Any]) -> Architecture:
    """The row serving an HF ``config.json`` (by model_type plus the row's ``when``)."""
    model_type = config.get("model_type")
    if not model_type:
        raise UnsupportedArchitectureError(
            "config.json has no 'model_type', so the architecture cannot be determined; "
            "add it (e.g. \"llama\") or pass a supported model."
        )
    rows = [a for a in ARCHITECTURES if model_type in a.hf_model_types]
    for row in rows:
        if all(bool(config.get(k, False)) == v for k, v in row.when.items()):
            return row
    raise UnsupportedArchitectureError(
        f"Architecture '{model_type}' is not supported; supported model_type values are "
        f"{', '.join(supported_model_types())}."
    )


def for_gguf_arch(gguf_name: str, has_attn_norm_2: bool = False) -> Architecture:
    """The row for a GGUF ``general.architecture`` value.

    llama.cpp tells the two Falcon layouts apart by the presence of ``attn_norm_2``
    tensors, so we do the same.
    """
    rows = [a for a in ARCHITECTURES if a.gguf_arch.lower() == gguf_name]
    if gguf_name == "falcon" and rows:
        return rows[1] if has_attn_norm_2 else rows[0]
    if not rows:
        known = sorted({a.gguf_arch.lower() for a in ARCHITECTURES})
        raise UnsupportedArchitectureError(
            f"GGUF architecture '{gguf_name}' is not supported; supported: {', '.join(known)}."
        )
    return rows[0]


def exportable_model_types() -> list[str]:
    """Lower-case model_type values the GGUF export writes, in row order (for messages)."""
    seen: dict[str, None] = {}
    for a in ARCHITECTURES:
        seen.update((t, None) for t in a.export_model_types if t.islower())
    return list(seen)


def runtime_architectures() -> list[str]:
    """GGUF architecture names ``aios-run`` executes, in row order."""
    return list(dict.fromkeys(a.gguf_arch.lower() for a in ARCHITECTURES if a.runtime))


def by_name(name: str) -> Architecture:
    for a in ARCHITECTURES:
        if a.name == name:
            return a
    raise UnsupportedArchitectureError(f"Unknown architecture row '{name}'.")
