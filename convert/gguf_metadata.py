"""GGUF metadata for the export: llama.cpp's architecture keys and our ``aios.*`` keys.

``aios.*`` (DESIGN §6): the FFN activation as the model computes it, what llama.cpp hard-codes
for the architecture instead (and whether that is the same function), per-tensor type
fallbacks, an embedded sparsity map's description, and provenance (tool version, source files
identified by size and header digest, converter config; no paths or times, so output stays
byte-identical for identical input).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from aios import CONTRACT_VERSION, __version__
from aios.models import ModelHandle
from convert import gguf_sparsity as sparsity
from convert import gguf_tensors as gt

from aios.models.architectures import ACT_FAMILY, activation_family  # noqa: F401  (re-exported)

if TYPE_CHECKING:
    from convert.gguf_export import GGUFExportConfig

# how llama.cpp's CPU kernels deviate from the exact function, per activation family
LLAMA_CPP_ACT_NOTES = {
    "gelu": "llama.cpp's CPU backend evaluates GELU as the tanh approximation read from an fp16 "
            "lookup table, so its logits differ from transformers' by about 1e-3 to 1e-2 at f32",
}




def write_hparams(w, handle: ModelHandle, outtype: str) -> None:
    """Architecture keys llama.cpp reads (the ones its converter writes for these models)."""
    f, c = handle.facts, handle.config
    w.add_name(handle.name)
    w.add_context_length(int(f.max_context or 2048))
    w.add_embedding_length(f.d_model)
    w.add_block_count(f.n_layers)
    w.add_feed_forward_length(f.d_ffn)
    w.add_head_count(f.n_heads)
    w.add_head_count_kv(f.n_kv_heads)
    rope = c.get("rope_parameters") or {}
    theta = rope.get("rope_theta", c.get("rope_theta"))
    if handle.arch.name == "llama":
        w.add_vocab_size(int(f.vocab_size))
        w.add_rope_dimension_count(f.head_dim)
        w.add_layer_norm_rms_eps(float(c.get("rms_norm_eps", 1e-6)))
        if f.head_dim * f.n_heads != f.d_model:
            w.add_key_length(f.head_dim)
            w.add_value_length(f.head_dim)
        scaling = c.get("rope_scaling") or rope
        if scaling.get("rope_type", scaling.get("type")) == "linear":
            import gguf

            w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            w.add_rope_scaling_factor(float(scaling["factor"]))
    else:
        w.add_layer_norm_eps(float(c.get("layer_norm_epsilon", 1e-5)))
    if handle.arch.name.startswith("falcon"):
        w.add_tensor_data_layout("jploski")  # QKV regrouped as llama.cpp expects
    if theta is not None and handle.arch.name != "gpt2":
        w.add_rope_freq_base(float(theta))
    w.add_file_type(gt.llama_file_type(outtype))
    if outtype in ("q8_0", "q4_0"):
        import gguf

        w.add_quantization_version(gguf.GGML_QUANT_VERSION)


def aios_metadata(handle: ModelHandle, config: GGUFExportConfig, fallbacks: list[str],
                  masks: dict[int, np.ndarray]) -> tuple[dict[str, object], list[str], bool]:
    """The ``aios.*`` keys, warnings for the user, and whether llama.cpp can load the file."""
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
        "aios.export.outtype": config.outtype,
        "aios.export.fallback_count": len(fallbacks),
    }
    if matches and activation_family(runs) in LLAMA_CPP_ACT_NOTES:
        meta["aios.llama_cpp.activation_note"] = LLAMA_CPP_ACT_NOTES[activation_family(runs)]
    if f.activation_threshold is not None:
        meta["aios.ffn_activation_threshold"] = f.activation_threshold
    if fallbacks:
        meta["aios.export.fallbacks"] = fallbacks
    if not matches:
        msg = (f"the model's FFN activation is '{f.activation}' but llama.cpp hard-codes '{runs}' for "
               f"{handle.arch.gguf_arch.lower()}: llama.cpp (and transformers' GGUF loader) would compute "
               "it wrongly; it runs correctly in aios-run (reads aios.ffn_activation) and in transformers "
               "from the source folder")
        warnings.append(msg)
        meta["aios.runtime.note"] = msg
    if masks:
        kept = [float(m.mean()) for m in masks.values()]
        header = sparsity.sparsity_map_header(config.sparsity_map) if config.sparsity_map else {}
        meta.update({
            "aios.sparsity.format": "blk.N.ffn_active F32 (d_ffn,): 1 = neuron kept, 0 = pruned",
            "aios.sparsity.layers": list(masks),
            "aios.sparsity.kept_fraction": kept,
            "aios.sparsity.mode": str(header.get("mode", "unknown")),
            "aios.sparsity.source_sha256": _sha256_file(Path(config.sparsity_map)),  # type: ignore[arg-type]
            "aios.sparsity.runtime": "aios-run only: llama.cpp refuses the extra ffn_active tensors",
        })
        warnings.append("the sparsity map adds blk.N.ffn_active tensors: llama.cpp refuses such "
                               "files (wrong number of tensors); the file is for the AIOS runtime")
        loadable = False
    meta["aios.provenance"] = json.dumps(_provenance(handle, config), sort_keys=True)
    return meta, warnings, loadable


def _provenance(handle: ModelHandle, config: GGUFExportConfig) -> dict:
    assert handle.path is not None
    folder = handle.path
    files = []
    for p in sorted(folder.glob("*.safetensors")):
        with open(p, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            header = fh.read(n)
        files.append({"file": p.name, "bytes": p.stat().st_size,
                      "header_sha256": hashlib.sha256(header).hexdigest()})
    cfg = asdict(config)
    if cfg["sparsity_map"]:
        cfg["sparsity_map"] = Path(cfg["sparsity_map"]).name
    small = {n: _sha256_file(folder / n) for n in ("config.json", "tokenizer.json", "tokenizer_config.json")
             if (folder / n).is_file()}
    return {"tool": "aios-toolchain", "tool_version": __version__, "command": "aios-convert gguf",
            "source": {"name": handle.name, "kind": handle.kind, "architecture": handle.arch.name,
                       "weights": files, "sha256": small},
            "converter_config": cfg}


def _sha256_file(p: Path) -> str:
    h = hashlib.sha256()
    with open(p, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


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
