"""Structural checks of a GGUF before the runtime trusts it: keys, tensor shapes, cache size.

The bounds pass (``aios.models.gguf_bounds``) guarantees that every declared tensor lies
inside the file; this module checks that the file is a model the forward pass can run, the
way llama.cpp's loader does ("tensor has wrong shape; expected ..."): every hyperparameter
the runtime reads is a positive integer (or a number), heads divide the model width, the
standard tensors have the shapes those hyperparameters imply, every layer ends up with the
operators the forward pass calls (after extension hooks such as low-rank or alias), and the
KV cache the context length implies fits in memory. A file that lies gets one sentence
(exit 4) instead of a KeyError, a reshape error or a multi-terabyte allocation.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from aios.errors import InvalidModelError, UsageError
from runtime.thresholds import INPUT_MAJOR

INT_KEYS = ("block_count", "embedding_length", "attention.head_count", "feed_forward_length")
OPTIONAL_INT_KEYS = ("attention.head_count_kv", "context_length", "rope.dimension_count",
                     "attention.key_length", "attention.sliding_window")
FLOAT_KEYS = ("rope.freq_base", "attention.layer_norm_epsilon", "attention.layer_norm_rms_epsilon",
              "rope.freq_base_swa", "attn_logit_softcapping", "final_logit_softcapping")
# 0 is "none" here, as in llama.cpp: its converter writes a sliding window of 0 for every Phi-3
# without one (and for Phi-4)
ZERO_IS_NONE = ("attention.sliding_window",)
MAX_LAYERS = 4096


def check_hparams(store, arch: str, path: Path) -> None:
    """Every key the runtime reads has a usable value (before any of them is converted)."""
    def bad(key: str, v, want: str) -> InvalidModelError:
        return InvalidModelError(f"{path}: '{arch}.{key}' is {v!r}; the runtime needs {want}.")

    vals = {}
    for key in INT_KEYS + OPTIONAL_INT_KEYS:
        v = store.field(f"{arch}.{key}")
        if v is None and key in OPTIONAL_INT_KEYS:
            continue
        if key in ZERO_IS_NONE and v == 0 and not isinstance(v, bool):
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise bad(key, v, "a positive integer")
        vals[key] = v
    for key in FLOAT_KEYS:
        v = store.field(f"{arch}.{key}")
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v)):
            raise bad(key, v, "a finite number")
    t = store.field("aios.ffn_activation_threshold")
    if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or not np.isfinite(t)):
        raise InvalidModelError(f"{path}: 'aios.ffn_activation_threshold' is {t!r}, not a number.")
    a = store.field("aios.ffn_activation")
    if a is not None and not isinstance(a, str):
        raise InvalidModelError(f"{path}: 'aios.ffn_activation' is {a!r}, not a string.")
    d, h = vals["embedding_length"], vals["attention.head_count"]
    kv = vals.get("attention.head_count_kv", h)
    explicit = "attention.key_length" in vals  # head size given: heads need not divide the width
    if vals["block_count"] > MAX_LAYERS or (d % h and not explicit) or h % kv:
        raise InvalidModelError(
            f"{path}: inconsistent hyperparameters ({vals['block_count']} layers, width {d}, "
            f"{h} heads, {kv} KV heads): heads must divide the width and KV heads the heads.")
    hd = vals.get("attention.key_length", d // h)
    if vals.get("rope.dimension_count", hd) > hd:
        raise bad("rope.dimension_count", vals["rope.dimension_count"], f"at most the head size {hd}")


def check_cache(hp, path: Path, n_ctx_given: bool, available: int | None = None) -> None:
    """The KV cache (allocated at load) must fit in memory: refuse a context that cannot."""
    from aios.models.handle import mem_available

    need = 2 * hp.n_layers * hp.n_ctx * hp.n_kv * hp.head_dim * 4
    avail = available if available is not None else mem_available()
    if need > 0.8 * avail:
        msg = (f"A context of {hp.n_ctx:,} tokens needs a {need / 2**30:,.1f} GiB KV cache, more than "
               f"the {avail / 2**30:,.1f} GiB available; pass a smaller --ctx")
        if n_ctx_given:
            raise UsageError(msg + ".")
        raise InvalidModelError(f"{path}: {msg} (the file declares this context length).")


def _expected(hp, stored: bool = False) -> dict[str, tuple[int, ...]]:
    """Per-layer tensor -> numpy shape (n_out, n_in) or (n,) implied by the hyperparameters:
    as ``stored`` in the file, or as the forward pass sees it after the layer hooks (a fused
    [gate; up] matrix is one 2·d_ffn-row tensor in the file, two operators after the hook)."""
    d, f, hd = hp.d_model, hp.d_ffn, hp.head_dim
    q, kv = hp.n_heads * hd, hp.n_kv * hd
    shapes = {"attn_norm.weight": (d,), "attn_norm.bias": (d,), "attn_output.weight": (d, q),
              "ffn_up.weight": (f, d), "ffn_down.weight": (d, f), "ffn_active": (f,),
              "ffn_up.bias": (f,), "ffn_down.bias": (d,), "attn_output.bias": (d,), "ffn_norm.bias": (d,)}
    if hp.graph.fused_qkv:
        shapes.update({"attn_qkv.weight": (q + 2 * kv, d), "attn_qkv.bias": (q + 2 * kv,)})
    else:
        shapes.update({"attn_q.weight": (q, d), "attn_k.weight": (kv, d), "attn_v.weight": (kv, d),
                       "attn_q.bias": (q,), "attn_k.bias": (kv,), "attn_v.bias": (kv,)})
    if hp.graph.qk_norm:
        shapes.update({"attn_q_norm.weight": (hd,), "attn_k_norm.weight": (hd,)})
    if hp.graph.post_norms:
        shapes.update({"post_attention_norm.weight": (d,), "post_ffw_norm.weight": (d,)})
    if not hp.graph.parallel_attn_default:
        shapes["ffn_norm.weight"] = (d,)
    elif hp.graph.parallel_ffn_norm:
        shapes.update({f"{hp.graph.parallel_ffn_norm}.weight": (d,), f"{hp.graph.parallel_ffn_norm}.bias": (d,)})
    if hp.graph.gated_ffn:
        shapes["ffn_gate.weight"] = (f, d)
    if stored and hp.graph.fused_gate_up:
        shapes["ffn_up.weight"] = (2 * f, d)
    if stored:  # input-major projections (--sparse-down: the down projection; sparsify --input-major)
        shapes.update({f"{n}.t": shapes[f"{n}.weight"][::-1] for n in INPUT_MAJOR if f"{n}.weight" in shapes})
    return shapes


def _numpy_shape(x) -> tuple[int, ...]:
    """A gguf ReaderTensor's shape in numpy order, with trailing unit dimensions dropped."""
    dims = [int(v) for v in x.shape]
    while len(dims) > 1 and dims[-1] == 1:
        dims.pop()
    return tuple(reversed(dims))


def check_tensors(tensors: dict, hp, path: Path) -> None:
    """Global tensors present with the right shapes; stored per-layer tensors match ``hp``."""
    learned = hp.graph.rope is None  # learned absolute positions: one position_embd row per position
    for name in ("token_embd.weight", "output_norm.weight") + (("position_embd.weight",) if learned else ()):
        if name not in tensors:
            raise InvalidModelError(f"{path} has no '{name}' tensor; it is not a complete {hp.arch} model.")
    if learned:
        s = _numpy_shape(tensors["position_embd.weight"])
        if len(s) != 2 or s[1] != hp.d_model:
            raise InvalidModelError(f"{path}: 'position_embd.weight' has shape {list(s)}; expected "
                                    f"[positions, {hp.d_model}].")
        if s[0] < hp.n_ctx:
            raise UsageError(f"{path.name} has learned positions for {s[0]} tokens; a context of {hp.n_ctx} "
                             f"needs more (pass --ctx {s[0]} or less).")
    want = {"output_norm.weight": (hp.d_model,), "output_norm.bias": (hp.d_model,),
            "rope_freqs.weight": (hp.rope_dims // 2,)}
    for name in ("token_embd.weight", "output.weight"):
        if name in tensors:
            s = _numpy_shape(tensors[name])
            if len(s) != 2 or s[1] != hp.d_model:
                raise InvalidModelError(f"{path}: '{name}' has shape {list(s)}; expected [vocab, {hp.d_model}].")
    layer = _expected(hp, stored=True)
    for name, x in tensors.items():
        shape = want.get(name)
        if shape is None and name.startswith("blk.") and name.count(".") >= 2:
            shape = layer.get(name.split(".", 2)[2])
        if shape is not None and _numpy_shape(x) != shape:
            raise InvalidModelError(f"{path}: tensor '{name}' has shape {list(_numpy_shape(x))}; the "
                                    f"hyperparameters imply {list(shape)}.")


def check_layer(hp, i: int, L: dict, path: Path) -> None:
    """After extension hooks: every operator the forward pass calls exists with the right shape."""
    layer = _expected(hp)
    for key in hp.graph.required_layer_tensors:
        if key not in L:
            raise InvalidModelError(f"{path}: layer {i} has no '{key}' (tensor 'blk.{i}.{key}' or an "
                                    "extension that provides it).")
    for key, op in L.items():
        shape = layer.get(key)
        if shape is None:
            continue
        got = (op.n_out, op.n_in) if hasattr(op, "n_out") else tuple(np.shape(op))
        if got != shape:
            raise InvalidModelError(f"{path}: 'blk.{i}.{key}' has shape {list(got)}; expected {list(shape)}.")
