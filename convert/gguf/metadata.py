"""Step 3 of the GGUF spine: metadata — llama.cpp's architecture keys and our ``aios.*`` keys.

``aios.*`` (docs/design.md, "GGUF extensions"): the FFN activation as the model computes it,
what llama.cpp hard-codes for the architecture instead (and whether that is the same
function), per-tensor type fallbacks, an embedded sparsity map's description, and provenance
(tool version, source files identified by size and header digest, converter config; no paths
or times, so output stays byte-identical for identical input).

Which architecture keys are written beyond the common ones is data: the row's
``gguf_hparams`` names entries of :data:`HPARAM_WRITERS`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

import numpy as np

from aios import CONTRACT_VERSION, __version__
from aios.io import sha256_file
from aios.models import ModelHandle, ffn_cut
from aios.models.architectures import activation_family
from aios.models.from_gguf import gguf_source_of
from convert.gguf import sparsity
from convert.gguf import tensors as gt
from convert.gguf.plan import GGUFExportConfig, rope_parameters

# how llama.cpp's CPU kernels deviate from the exact function, per activation family
LLAMA_CPP_ACT_NOTES = {
    "gelu": "llama.cpp's CPU backend evaluates GELU as the tanh approximation read from an fp16 "
            "lookup table, so its logits differ from transformers' by about 1e-3 to 1e-2 at f32",
}


def _rope_scaling(w, handle: ModelHandle) -> None:
    import gguf

    scaling = rope_parameters(handle.config)
    if scaling.get("rope_type", scaling.get("type")) == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(float(scaling["factor"]))


def _key_value_length(w, handle: ModelHandle) -> None:
    f = handle.facts
    if f.head_dim * f.n_heads != f.d_model:
        w.add_key_length(f.head_dim)
        w.add_value_length(f.head_dim)


def _layer_types(handle: ModelHandle) -> list[str]:
    return list(handle.config.get("layer_types") or [])


def _sliding_window(w, handle: ModelHandle) -> None:
    """The window, and which layers use it (llama.cpp's per-layer pattern array)."""
    window = handle.config.get(handle.arch.sliding_window_key or "sliding_window")
    types = _layer_types(handle)
    if window and (not types or "sliding_attention" in types):
        w.add_sliding_window(int(window))
        if types:
            w.add_sliding_window_pattern([t == "sliding_attention" for t in types])


def _rope_freq_base_swa(w, handle: ModelHandle) -> None:
    c = handle.config
    local = rope_parameters(c, "sliding_attention").get("rope_theta") if "sliding_attention" in (
        c.get("rope_parameters") or {}) else c.get("rope_local_base_freq")
    if local is not None:
        w.add_rope_freq_base_swa(float(local))


def _final_logit_softcapping(w, handle: ModelHandle) -> None:
    cap = handle.config.get(handle.arch.final_softcap_key or "final_logit_softcapping")
    if cap:
        w.add_final_logit_softcapping(float(cap))


def _attn_logit_softcapping(w, handle: ModelHandle) -> None:
    cap = handle.config.get(handle.arch.attn_softcap_key or "attn_logit_softcapping")
    if cap:
        w.add_attn_logit_softcapping(float(cap))


def _attention_scale(w, handle: ModelHandle) -> None:
    """Only when q·k is not scaled by 1/sqrt(head_dim) (Gemma's query_pre_attn_scalar); llama.cpp
    derives the scale from the model size instead (the export says so when the two differ:
    ``llama_cpp_divergences``), aios-run reads this key."""
    qpas = handle.config.get("query_pre_attn_scalar")
    if qpas and int(qpas) != handle.facts.head_dim:
        w.add_float32("aios.attention.scale", float(qpas) ** -0.5)


def llama_cpp_divergences(handle: ModelHandle) -> list[str]:
    """One line per key the export writes that llama.cpp ignores, so that it computes this model
    differently from aios-run and transformers (its defaults: the row's fields)."""
    f, arch, notes = handle.facts, handle.arch, []
    qpas = handle.config.get("query_pre_attn_scalar")
    if "attention_scale" in arch.gguf_hparams and qpas and int(qpas) != f.head_dim:
        theirs = arch.llama_cpp_attn_scale(f.n_layers, f.d_model, f.n_heads, f.head_dim)
        if abs(theirs * float(qpas) ** 0.5 - 1) > 1e-6:
            notes.append(f"llama.cpp ignores aios.attention.scale (1/sqrt({qpas}), query_pre_attn_scalar) and scales "
                         f"q·k of a {f.n_layers}-layer {arch.gguf_arch.lower()} by 1/sqrt({round(theirs ** -2)}): its "
                         "logits will differ from aios-run's and transformers'")
    window = handle.config.get(arch.sliding_window_key or "sliding_window")
    if "sliding_window" in arch.gguf_hparams and window and not arch.llama_cpp_window and (
            not _layer_types(handle) or "sliding_attention" in _layer_types(handle)):
        notes.append(f"llama.cpp ignores {arch.gguf_arch.lower()}.attention.sliding_window ({window}) and attends to "
                     f"the whole context: past {window} tokens its logits will differ from aios-run's and transformers'")
    return notes


# Architecture keys a row may ask for (``Architecture.gguf_hparams``), in the order written.
HPARAM_WRITERS: dict[str, Callable[[Any, ModelHandle], None]] = {
    "vocab_size": lambda w, h: w.add_vocab_size(int(h.facts.vocab_size)),  # type: ignore[arg-type]
    # partial rotary (Phi-4-mini rides on the phi3 row): only the first dims of each head rotate
    "rope_dimension_count": lambda w, h: w.add_rope_dimension_count(
        int(h.facts.head_dim * float(h.config.get("partial_rotary_factor") or 1.0))),
    "key_value_length": _key_value_length,
    "rope_scaling": _rope_scaling,
    "tensor_data_layout": lambda w, h: w.add_tensor_data_layout("jploski"),  # Falcon QKV regrouped
    "sliding_window": _sliding_window,
    "rope_freq_base_swa": _rope_freq_base_swa,
    "attn_logit_softcapping": _attn_logit_softcapping,
    "final_logit_softcapping": _final_logit_softcapping,
    "attention_scale": _attention_scale,
}
_BEFORE_EPS = ("vocab_size", "rope_dimension_count")  # written before the norm epsilon


def write_hparams(w, handle: ModelHandle, outtype: str, file_type: int | None = None) -> None:
    """Architecture keys llama.cpp reads (the ones its converter writes for these models);
    ``file_type``: general.file_type when not ``outtype``'s (``--like``)."""
    f, c, arch = handle.facts, handle.config, handle.arch
    w.add_name(handle.name)
    w.add_context_length(int(f.max_context or 2048))
    w.add_embedding_length(f.d_model)
    w.add_block_count(f.n_layers)
    w.add_feed_forward_length(f.d_ffn)
    w.add_head_count(f.n_heads)
    w.add_head_count_kv(f.n_kv_heads)
    params = c.get("rope_parameters") or {}
    if isinstance(params.get("full_attention"), dict):  # per layer type (Gemma 3): the global layers'
        params = params["full_attention"]
    theta = params.get("rope_theta", c.get("rope_theta"))
    for key in (k for k in arch.gguf_hparams if k in _BEFORE_EPS):
        HPARAM_WRITERS[key](w, handle)
    if arch.norm == "rms":
        w.add_layer_norm_rms_eps(float(c.get("rms_norm_eps", 1e-6)))
    else:
        w.add_layer_norm_eps(float(c.get("layer_norm_epsilon", 1e-5)))
    for key in (k for k in arch.gguf_hparams if k not in _BEFORE_EPS):
        HPARAM_WRITERS[key](w, handle)
    if theta is not None and arch.rope is not None:
        w.add_rope_freq_base(float(theta))
    w.add_file_type(file_type if file_type is not None else gt.llama_file_type(outtype))
    if outtype in ("q8_0", "q4_0", "q5_0") or file_type is not None:
        import gguf

        w.add_quantization_version(gguf.GGML_QUANT_VERSION)


def aios_metadata(handle: ModelHandle, outtype: str, fallbacks: list[str], provenance_record: dict,
                  masks: dict[int, np.ndarray] | None = None,
                  sparsity_map: str | None = None) -> tuple[dict[str, object], list[str], bool]:
    """The ``aios.*`` keys, warnings for the user, and whether llama.cpp can load the file.

    ``outtype``: the requested type of the plain tensors; ``provenance_record``: what
    :func:`provenance` returns for the converter writing the file; ``masks``: an embedded
    sparsity map read from the file ``sparsity_map``."""
    f = handle.facts
    warnings: list[str] = []
    loadable = True
    runs = handle.llama_cpp_activation or "unknown"
    matches = activation_family(f.activation) == activation_family(runs)
    meta: dict[str, object] = {
        "aios.contract_version": CONTRACT_VERSION,
        "aios.ffn_activation": f.activation,
        "aios.llama_cpp.ffn_activation": runs,
        "aios.llama_cpp.activation_matches": matches,
        "aios.export.outtype": outtype,
        "aios.export.fallback_count": len(fallbacks),
    }
    if matches and activation_family(runs) in LLAMA_CPP_ACT_NOTES:
        meta["aios.llama_cpp.activation_note"] = LLAMA_CPP_ACT_NOTES[activation_family(runs)]
    if f.activation_threshold is not None:
        meta["aios.ffn_activation_threshold"] = f.activation_threshold
    cut = ffn_cut.from_config(handle.config, f.n_layers) if handle.kind != "gguf" else None
    if cut is not None:  # an HF folder's calibrated cut (relufy --init-thresholds): aios-run applies it
        meta.update({ffn_cut.GGUF_SITE: ffn_cut.SITE, ffn_cut.GGUF_VALUES: cut,
                     "aios.ffn_threshold.runtime": "aios-run applies the thresholds; llama.cpp ignores them"})
        warnings.append("llama.cpp ignores aios.ffn_threshold.* (the config's calibrated FFN cut): it "
                        "runs this file without the cut; aios-run applies it")
    if fallbacks:
        meta["aios.export.fallbacks"] = fallbacks
    if not matches:
        msg = (f"the model's FFN activation is '{f.activation}' but llama.cpp hard-codes '{runs}' for "
               f"{handle.arch.gguf_arch.lower()}: llama.cpp (and transformers' GGUF loader) would compute "
               "it wrongly; it runs correctly in aios-run (reads aios.ffn_activation) and in transformers "
               "from the source folder")
        warnings.append(msg)
        meta["aios.runtime.note"] = msg
    warnings += llama_cpp_divergences(handle)
    if masks:
        kept = [float(m.mean()) for m in masks.values()]
        header = sparsity.sparsity_map_header(sparsity_map) if sparsity_map else {}
        meta.update({
            "aios.sparsity.format": "blk.N.ffn_active F32 (d_ffn,): 1 = neuron kept, 0 = pruned",
            "aios.sparsity.layers": list(masks),
            "aios.sparsity.kept_fraction": kept,
            "aios.sparsity.mode": str(header.get("mode", "unknown")),
            "aios.sparsity.source_sha256": sha256_file(Path(sparsity_map)),  # type: ignore[arg-type]
            "aios.sparsity.runtime": "aios-run only: llama.cpp refuses the extra ffn_active tensors",
        })
        warnings.append("the sparsity map adds blk.N.ffn_active tensors: llama.cpp refuses such "
                        "files (wrong number of tensors); the file is for the AIOS runtime")
        loadable = False
    meta["aios.provenance"] = json.dumps(provenance_record, sort_keys=True)
    return meta, warnings, loadable


SPARSE_DOWN_FORMAT = ("blk.N.ffn_down.t (d_ffn x d_model): the FFN down projection stored neuron-major "
                      "(row j = neuron j's output weights, quantized along d_model) in place of "
                      "blk.N.ffn_down.weight, so exact-sparse runs read only firing neurons' rows")


def sparse_down_keys(n_layers: int, fmt: str = SPARSE_DOWN_FORMAT) -> dict[str, object]:
    """``aios.sparse_down.*`` keys of a neuron-major export (``fmt``: which tensors hold the rows;
    the alias and svd-residual exports describe theirs)."""
    return {"aios.sparse_down.format": fmt, "aios.sparse_down.layers": n_layers,
            "aios.sparse_down.runtime": "aios-run only: llama.cpp finds no blk.N.ffn_down.weight"}


def sparse_down_metadata(n_layers: int) -> tuple[dict[str, object], str]:
    """``aios.sparse_down.*`` keys and the warning for a neuron-major ``aios-convert gguf`` export."""
    return sparse_down_keys(n_layers), ("--sparse-down stores every FFN down projection neuron-major (blk.N.ffn_down.t): the file is "
                  "for aios-run (all modes); export again without it for llama.cpp")


def provenance(handle: ModelHandle, config: GGUFExportConfig | None = None, *,
               command: str = "aios-convert gguf", converter_config: dict | None = None) -> dict:
    """Tool, source files (by size and digest) and converter config of an export.

    ``converter_config`` defaults to ``config`` (an ``aios-convert gguf`` export); converters
    with their own config (svd-residual) pass theirs and their ``command``."""
    assert handle.path is not None
    folder = handle.path
    files = []
    for p in sorted(folder.glob("*.safetensors")):
        with open(p, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            header = fh.read(n)
        files.append({"file": p.name, "bytes": p.stat().st_size,
                      "header_sha256": hashlib.sha256(header).hexdigest()})
    if converter_config is None:
        converter_config = asdict(config or GGUFExportConfig())
        if converter_config["sparsity_map"]:
            converter_config["sparsity_map"] = Path(converter_config["sparsity_map"]).name
        if not converter_config["sparse_down"]:  # recorded only when on: older exports keep their bytes
            del converter_config["sparse_down"]
        if converter_config["like"]:
            converter_config["like"] = Path(converter_config["like"]).name
        else:
            del converter_config["like"]
    small = {n: sha256_file(folder / n) for n in ("config.json", "tokenizer.json", "tokenizer_config.json")
             if (folder / n).is_file()}
    return {"tool": "aios-toolchain", "tool_version": __version__, "command": command,
            "source": {"name": handle.name, "kind": handle.kind, "architecture": handle.arch.name,
                       "weights": files, "sha256": small,
                       **({"gguf": g} if (g := gguf_source_of(folder)) else {})},
            "converter_config": converter_config}


def add_metadata(w, meta: dict[str, object]) -> None:
    """Write ``aios.*`` keys with their natural GGUF types."""
    for key, value in meta.items():
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
        elif isinstance(value, list) and value:
            w.add_array(key, value)
