"""``aios-convert gguf``: export an HF model (falcon, llama family, gpt2) to a GGUF llama.cpp loads.

Standard tensor names and keys come from gguf-py (``TensorNameMap``, ``GGUFWriter``); we add
``aios.*`` keys (DESIGN §6): the FFN activation as the model really computes it, what llama.cpp
would run instead, per-tensor type fallbacks, an optional sparsity map, and provenance.

Streaming: the tensor plan is built from file headers only; each tensor is then read
(safetensors mmap), laid out, encoded in row chunks and written before the next is read, so
peak memory is about the largest tensor plus a constant. The file is written to a temp file
beside the output and renamed at the end; identical input gives byte-identical output.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from aios import CONTRACT_VERSION, __version__
from aios.errors import InvalidModelError, UnsupportedArchitectureError, UsageError
from aios.models import ModelHandle, resolve_model
from convert import gguf_sparsity as sparsity
from convert import gguf_tensors as gt
from convert.gguf_tokenizer import read_tokenizer

# What each architecture row needs beyond the name map: (layout rule, HF tensor suffix).
# Rules are applied to the torch tensor before encoding (see gguf_tensors).
LAYOUT_RULES: dict[str, tuple[tuple[str, str], ...]] = {
    "falcon": (("falcon_qkv", "self_attention.query_key_value"),),
    "falcon-new-decoder": (("falcon_qkv", "self_attention.query_key_value"),),
    "llama": (("rope_q", "self_attn.q_proj"), ("rope_k", "self_attn.k_proj")),
    "gpt2": (("transpose", "attn.c_attn.weight"), ("transpose", "attn.c_proj.weight"),
             ("transpose", "mlp.c_fc.weight"), ("transpose", "mlp.c_proj.weight")),
}  # fmt: skip
EXPORT_MODEL_TYPES = ("falcon", "RefinedWebModel", "RefinedWeb", "llama", "mistral", "gpt2")
# HF buffers that are not weights
SKIP = re.compile(r"(rotary_emb\.inv_freq|\.attn\.bias|\.attn\.masked_bias)$")
# activation names that llama.cpp's kernels treat as the same function
ACT_FAMILY = {"gelu_new": "gelu", "gelu_pytorch_tanh": "gelu", "gelu_fast": "gelu",
              "gelu_python": "gelu", "gelu_accurate": "gelu", "swish": "silu"}  # fmt: skip
# how llama.cpp's CPU kernels deviate from the exact function, per activation family
LLAMA_CPP_ACT_NOTES = {
    "gelu": "llama.cpp's CPU backend evaluates GELU as the tanh approximation read from an fp16 "
            "lookup table, so its logits differ from transformers' by about 1e-3 to 1e-2 at f32",
}


def activation_family(name: str) -> str:
    return ACT_FAMILY.get(name.lower(), name.lower())


@dataclass(frozen=True)
class GGUFExportConfig:
    """Converter config, embedded in every artifact (``aios.provenance``)."""

    outtype: str = "f16"
    sparsity_map: str | None = None  # file name only in provenance (paths are machine-specific)
    version: int = 1


@dataclass
class PlannedTensor:
    name: str  # GGUF name
    source: str | None  # HF tensor name (None for tensors we create, e.g. ffn_active)
    shape: tuple[int, ...]  # numpy order, after the layout rule
    source_dtype: str
    outtype: str  # "f32", "f16", "bf16", "q8_0", "q4_0"
    nbytes: int
    rule: str | None = None
    fallback: str | None = None  # why outtype differs from the requested type


@dataclass
class ExportResult:
    output: Path | None  # None for a dry run
    config: GGUFExportConfig
    arch: str
    plan: list[PlannedTensor]
    metadata: dict[str, object]  # the aios.* keys written
    warnings: list[str] = field(default_factory=list)
    llama_cpp_loadable: bool = True

    @property
    def fallbacks(self) -> list[str]:
        return [f"{p.name}: {p.fallback} -> {p.outtype.upper()}" for p in self.plan if p.fallback]

    @property
    def llama_cpp_status(self) -> str:
        if not self.llama_cpp_loadable:
            return "does not load it"
        if not self.metadata.get("aios.llama_cpp.activation_matches", True):
            return "loads it but runs a different FFN activation"
        return "loads and runs it"

    @property
    def total_bytes(self) -> int:
        return sum(p.nbytes for p in self.plan)


def export_gguf(model: str | ModelHandle, output: str | Path, config: GGUFExportConfig, *,
                dry_run: bool = False, progress: Callable[[int, int, str], None] | None = None) -> ExportResult:
    """Export ``model`` to ``output``; with ``dry_run`` only plan and report."""
    if config.outtype not in gt.OUTTYPES:
        raise UsageError(f"--outtype must be one of {', '.join(gt.OUTTYPES)}, not '{config.outtype}'.")
    handle = model if isinstance(model, ModelHandle) else resolve_model(model)
    _check_exportable(handle)
    masks = _load_masks(handle, config)
    plan = plan_tensors(handle, config.outtype, masks)
    tok = read_tokenizer(handle.path, handle.facts.vocab_size)  # type: ignore[arg-type]
    result = ExportResult(None, config, handle.arch.gguf_arch.lower(), plan, {})
    result.metadata = _aios_metadata(handle, config, result, masks)
    if tok is None:
        result.warnings.append("no tokenizer.json: the file has no vocabulary, so llama.cpp cannot load it")
        result.llama_cpp_loadable = False
    else:
        result.warnings += tok.notes
    out = Path(output)
    if dry_run:
        return result
    if out.is_dir():
        raise UsageError(f"-o {out} is a folder; pass a file name such as {out / 'model.gguf'}.")
    out.parent.mkdir(parents=True, exist_ok=True)
    _write(handle, out, plan, tok, result, masks, progress)
    result.output = out
    return result


def _check_exportable(handle: ModelHandle) -> None:
    if handle.kind == "gguf" or handle.path is None or not handle.has_weights:
        raise InvalidModelError(
            f"'{handle.spec}' is not an HF model folder with weights; GGUF export reads config.json "
            "and safetensors (pass the folder, or fetch the model first)."
        )
    if handle.arch.name not in LAYOUT_RULES or handle.config.get("model_type") not in EXPORT_MODEL_TYPES:
        raise UnsupportedArchitectureError(
            f"GGUF export supports falcon, llama, mistral and gpt2; '{handle.config.get('model_type')}' "
            "is not one of them."
        )
    rope = handle.config.get("rope_parameters") or handle.config.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type", "default")) not in ("default", "linear"):
        raise UnsupportedArchitectureError(
            f"RoPE scaling '{rope.get('rope_type', rope.get('type'))}' is not supported by the GGUF export yet."
        )
    if handle.config.get("alibi"):
        raise UnsupportedArchitectureError("Falcon with ALiBi positions is not supported by llama.cpp's falcon graph.")


def _load_masks(handle: ModelHandle, config: GGUFExportConfig) -> dict[int, np.ndarray]:
    if not config.sparsity_map:
        return {}
    masks = sparsity.load_sparsity_map(config.sparsity_map)
    sparsity.check_masks(masks, handle.facts.n_layers, handle.facts.d_ffn, config.sparsity_map)
    return masks


# --- plan ----------------------------------------------------------------------------------


def plan_tensors(handle: ModelHandle, outtype: str, masks: dict[int, np.ndarray]) -> list[PlannedTensor]:
    """Every tensor to write, in llama.cpp's order, from safetensors headers only."""
    import gguf

    arch, facts = handle.arch, handle.facts
    tmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.gguf_arch], facts.n_layers)
    plan: list[PlannedTensor] = []
    for info in handle.tensor_inventory():
        if SKIP.search(info.name):
            continue
        name = tmap.get_name(info.name, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise UnsupportedArchitectureError(
                f"Tensor '{info.name}' has no GGUF name for {arch.gguf_arch.lower()}; "
                "this model variant is not supported by the GGUF export."
            )
        if info.dtype not in ("F32", "F16", "BF16"):
            raise InvalidModelError(f"Tensor '{info.name}' is {info.dtype}; export reads F32/F16/BF16 weights.")
        rule = next((r for r, suffix in LAYOUT_RULES[arch.name] if suffix in info.name), None)
        shape = tuple(reversed(info.shape)) if rule == "transpose" else info.shape
        out, why = gt.choose_type(shape, outtype)
        plan.append(PlannedTensor(name, info.name, shape, info.dtype, out, gt.encoded_nbytes(shape, out), rule, why))
    for i, m in masks.items():
        plan.append(PlannedTensor(sparsity.TENSOR_NAME.format(i=i), None, m.shape, "BOOL", "f32", 4 * m.size))
    names = [p.name for p in plan]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise InvalidModelError(f"Two source tensors map to GGUF tensor '{dup}'.")
    return sorted(plan, key=_order_key)


def _order_key(p: PlannedTensor) -> tuple:
    """token/position embeddings, then blocks in order, then the output norm and head."""
    m = re.match(r"blk\.(\d+)\.", p.name)
    if m:
        return (1, int(m.group(1)), p.name)
    return (0 if p.name.startswith(("token_embd", "position_embd")) else 2, 0, p.name)


# --- metadata ------------------------------------------------------------------------------


def _hparams(w, handle: ModelHandle, outtype: str) -> None:
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


def _aios_metadata(handle: ModelHandle, config: GGUFExportConfig, result: ExportResult,
                   masks: dict[int, np.ndarray]) -> dict[str, object]:
    f = handle.facts
    runs = handle.llama_cpp_activation or "unknown"
    matches = activation_family(f.activation) == activation_family(runs)
    meta: dict[str, object] = {
        "aios.contract_version": CONTRACT_VERSION,
        "aios.ffn_activation": f.activation,
        "aios.llama_cpp.ffn_activation": runs,
        "aios.llama_cpp.activation_matches": matches,
        "aios.export.outtype": config.outtype,
        "aios.export.fallback_count": sum(1 for p in result.plan if p.fallback),
    }
    if matches and activation_family(runs) in LLAMA_CPP_ACT_NOTES:
        meta["aios.llama_cpp.activation_note"] = LLAMA_CPP_ACT_NOTES[activation_family(runs)]
    if f.activation_threshold is not None:
        meta["aios.ffn_activation_threshold"] = f.activation_threshold
    if result.fallbacks:
        meta["aios.export.fallbacks"] = result.fallbacks
    if not matches:
        msg = (f"the model's FFN activation is '{f.activation}' but llama.cpp hard-codes '{runs}' for "
               f"{handle.arch.gguf_arch.lower()}: llama.cpp (and transformers' GGUF loader) would compute "
               "it wrongly; it runs correctly in aios-run (reads aios.ffn_activation) and in transformers "
               "from the source folder")
        result.warnings.append(msg)
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
        result.warnings.append("the sparsity map adds blk.N.ffn_active tensors: llama.cpp refuses such "
                               "files (wrong number of tensors); the file is for the AIOS runtime")
        result.llama_cpp_loadable = False
    meta["aios.provenance"] = json.dumps(_provenance(handle, config), sort_keys=True)
    return meta


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


# --- writing -------------------------------------------------------------------------------


def _source_rows(handle: ModelHandle, p: PlannedTensor, masks: dict[int, np.ndarray]):
    """A function (start, stop) -> float32 rows of the laid-out tensor; reads the source once."""
    if p.source is None:  # ffn_active mask
        layer = int(p.name.split(".")[1])
        data = sparsity.mask_tensor(masks[layer])
        return lambda a, b: data
    f = handle.facts
    t = handle.tensor(p.source)
    if p.rule == "falcon_qkv":
        t = gt.falcon_qkv(t, f.n_heads, f.n_kv_heads, f.head_dim)
    elif p.rule == "rope_q":
        t = gt.rope_interleave(t, f.n_heads)
    elif p.rule == "rope_k":
        t = gt.rope_interleave(t, f.n_kv_heads)
    elif p.rule == "transpose":
        t = t.T
    assert tuple(t.shape) == p.shape, (p.name, tuple(t.shape), p.shape)
    if t.ndim == 1:
        return lambda a, b: t.float().numpy()
    return lambda a, b: t[a:b].float().contiguous().numpy()


def _write(handle, out: Path, plan, tok, result: ExportResult, masks, progress) -> None:
    import gguf

    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    os.close(fd)
    try:
        w = gguf.GGUFWriter(tmp, gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH[handle.arch.gguf_arch]])
        _hparams(w, handle, result.config.outtype)
        if tok is not None:
            tok.add_to(w)
        add_metadata(w, result.metadata)
        for p in plan:
            w.add_tensor_info(p.name, p.shape, np.dtype(np.float32), p.nbytes, raw_dtype=gt.ggml_type(p.outtype))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        for k, p in enumerate(plan):
            rows = _source_rows(handle, p, masks)
            w.write_tensor_data(gt.EncodedTensor(rows, p.shape, p.outtype, p.nbytes))  # type: ignore[arg-type]
            del rows
            if progress:
                progress(k + 1, len(plan), p.name)
        w.close()
        finalize(Path(tmp), out)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def finalize(tmp: Path, out: Path) -> None:
    """fsync the finished temp file, give it normal permissions, rename it to ``out``."""
    with open(tmp, "rb+") as fh:
        os.fsync(fh.fileno())
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(tmp, 0o666 & ~mask)
    os.replace(tmp, out)
