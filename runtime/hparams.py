"""What a GGUF's keys mean to the forward pass, read as llama.cpp reads them.

llama.cpp's loader fills every optional key a file omits with a default, some per architecture
(its ``load_hparams``; files written by its own converters rely on them): the local RoPE base,
the sliding-window pattern, soft caps, attention scale, RoPE scaling. :func:`read_hparams` applies
the same defaults, taking the per-architecture ones from the architecture table
(aios/models/architectures.py), so a real file computes what llama.cpp computes
(tests/runtime/test_llama_cpp_defaults.py strips each key and compares with llama.cpp).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from aios.errors import InvalidModelError, UnsupportedArchitectureError
from aios.models.architectures import Architecture, for_gguf_arch, runtime_architectures


@dataclass(frozen=True)
class HParams:
    arch: str
    n_layers: int
    d_model: int
    n_heads: int
    n_kv: int
    head_dim: int
    d_ffn: int
    n_ctx: int
    rope_base: float
    rope_dims: int
    norm_eps: float
    activation: str
    activation_threshold: float | None
    graph: Architecture  # the architecture row: norm, RoPE, QKV, parallel block, gated FFN
    attn_scale: float = 0.0  # q·k multiplier (1/sqrt(head_dim) unless the file says otherwise)
    window: int = 0  # sliding-window size of local layers (0: none)
    swa_layers: tuple[bool, ...] = ()  # per layer: uses the window and the local RoPE base
    rope_base_swa: float = 0.0
    rope_scale: float = 1.0  # linear RoPE scaling: positions multiplied by this (1 / the file's factor)
    rope_scale_swa: float = 1.0  # the same for the local layers
    attn_softcap: float = 0.0  # 0: none
    final_softcap: float = 0.0


def runtime_row(arch, has_attn_norm_2: bool) -> Architecture:
    """The architecture row of a GGUF's ``general.architecture``, if the forward pass runs it."""
    runs = runtime_architectures()
    known = isinstance(arch, str) and arch in runs
    row = for_gguf_arch(arch, has_attn_norm_2) if known else None
    if row is None:
        raise UnsupportedArchitectureError(
            f"The runtime runs {' and '.join(runs)}-family GGUFs; this file is '{arch}'."
        )
    if not row.runtime:
        raise UnsupportedArchitectureError(f"'{row.name}' GGUFs ({row.description}) are not supported by the "
                                           "runtime yet.")
    return row


def read_hparams(store, row: Architecture, n_ctx: int | None) -> HParams:
    """The hyperparameters of a checked GGUF (``gguf_checks.check_hparams`` ran first);
    ``n_ctx`` overrides the file's context length.

    A key the file lacks gets the value llama.cpp's loader gives it (``llama_model_base::
    load_hparams``, llama_hparams' defaults and the architecture's ``load_arch_hparams``), the
    per-architecture ones read off the row (docs/design.md, "llama.cpp's defaults"); a key
    llama.cpp does not read for the architecture is not read here either. Only ``aios.*`` keys
    (the declared activation, our export's attention scale) override what llama.cpp computes."""
    arch = row.gguf_arch.lower()

    def f(key: str, default=None):
        v = store.field(f"{arch}.{key}")
        return default if v is None else v

    n_heads = int(f("attention.head_count"))
    d_model = int(f("embedding_length"))
    hd = int(f("attention.key_length", d_model // n_heads))  # explicit when heads·hd != d_model
    hd_v = _number(f("attention.value_length", d_model // n_heads), arch, "attention.value_length")
    if hd_v != hd:  # (absent: d_model / heads in llama.cpp, not the key length)
        raise InvalidModelError(f"'{arch}.attention.value_length' is {hd_v} (d_model / heads when absent) and the "
                                f"key length {hd}: aios-run needs equal key and value head sizes.")
    n_layers = int(f("block_count"))
    window = int(f("attention.sliding_window", row.swa_default_window)) if row.runtime_window else 0
    rope_base = float(f("rope.freq_base", 10000.0))
    rope_scale = _rope_freq_scale(f, arch)
    local_base = rope_base if not row.reads_local_rope else \
        float(f("rope.freq_base_swa", row.local_rope_base_default or rope_base))
    # llama.cpp reads the epsilon of the row's norm kind (and refuses a file without it)
    eps_key = "attention.layer_norm_epsilon" if row.norm == "layer" else "attention.layer_norm_rms_epsilon"
    return HParams(
        arch=arch,
        n_layers=n_layers,
        d_model=d_model,
        n_heads=n_heads,
        n_kv=int(f("attention.head_count_kv", n_heads)),
        head_dim=hd,
        d_ffn=int(f("feed_forward_length")),
        n_ctx=int(n_ctx or f("context_length", 2048)),
        rope_base=rope_base,
        rope_dims=int(f("rope.dimension_count", hd)),
        norm_eps=float(f(eps_key, 1e-5)),
        activation=str(store.field("aios.ffn_activation") or row.llama_cpp_ffn_activation),
        activation_threshold=store.field("aios.ffn_activation_threshold"),
        graph=row,
        # aios.attention.scale: our export of a checkpoint whose scale llama.cpp does not compute
        attn_scale=float(store.field("aios.attention.scale")
                         or row.llama_cpp_attn_scale(n_layers, d_model, n_heads, hd)),
        window=window,
        swa_layers=_swa_layers(f("attention.sliding_window_pattern"), window, n_layers, row),
        rope_base_swa=local_base,
        rope_scale=rope_scale,
        rope_scale_swa=rope_scale if row.local_rope_scaled or not row.reads_local_rope else 1.0,
        attn_softcap=float(f("attn_logit_softcapping", row.attn_softcap_default)) if row.attn_softcap_key else 0.0,
        final_softcap=float(f("final_logit_softcapping", row.final_softcap_default)) if row.final_softcap_key else 0.0,
    )


def _rope_freq_scale(f, arch: str) -> float:
    """llama.cpp's ``rope_freq_scale``: 1 / ``rope.scaling.factor`` (or the older
    ``rope.scale_linear``) for linear scaling, the type's default; 1 for type "none" or no factor.
    Other types (YaRN, LongRoPE) change the rotation itself: refused."""
    kind = f("rope.scaling.type", "linear")
    if kind not in ("linear", "none"):
        raise UnsupportedArchitectureError(f"'{arch}.rope.scaling.type' is {kind!r}; aios-run runs linear RoPE "
                                           "scaling (and Llama 3.1's rope_freqs) only.")
    key = "rope.scaling.factor" if f("rope.scaling.factor") is not None else "rope.scale_linear"
    factor = _number(f(key, 0.0), arch, key, float)
    if factor < 0:
        raise InvalidModelError(f"'{arch}.{key}' is {factor!r}; the runtime needs a positive number.")
    return 1.0 if kind == "none" or factor == 0.0 else 1.0 / factor


def _number(v, arch: str, key: str, kind: type = int):
    """``v`` as ``kind`` (a key ``gguf_checks.check_hparams`` does not check), or one sentence."""
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and (kind is float or v > 0)
    if not ok or (kind is int and v != int(v)):
        raise InvalidModelError(f"'{arch}.{key}' is {v!r}; the runtime needs "
                                f"{'a positive integer' if kind is int else 'a finite number'}.")
    return kind(v)


def _swa_layers(pattern, window: int, n_layers: int, row: Architecture) -> tuple[bool, ...]:
    """Which layers attend through the sliding window: the file's per-layer pattern (a list of
    booleans), else every layer but each n-th (n: the file's integer pattern or the row's
    ``swa_pattern``; llama.cpp's rule), none without a window."""
    if window <= 0:
        return (False,) * n_layers
    if isinstance(pattern, list):
        if len(pattern) != n_layers:
            raise InvalidModelError(f"The sliding-window pattern has {len(pattern)} entries for {n_layers} layers.")
        return tuple(bool(x) for x in pattern)
    n = int(pattern) if isinstance(pattern, int) and not isinstance(pattern, bool) else row.swa_pattern
    return tuple(n == 0 or i % n < n - 1 for i in range(n_layers))
