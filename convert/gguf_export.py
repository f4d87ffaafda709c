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

import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from aios.errors import InvalidModelError, UnsupportedArchitectureError, UsageError
from aios.models import ModelHandle, resolve_model
from aios.models.alias_format import groups_of
from convert import gguf_sparsity as sparsity
from convert import gguf_tensors as gt
from convert.gguf_metadata import add_metadata, aios_metadata, write_hparams
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
    if groups_of(handle):
        raise UsageError(
            f"'{handle.spec}' is an aliased folder (canonical + delta weights); export it with "
            f"`aios-convert alias {handle.spec} --gguf OUT.gguf` (aliased, runs in aios-run) or "
            "`--dealias OUT.gguf` (standard GGUF llama.cpp loads)."
        )
    masks = _load_masks(handle, config)
    plan = plan_tensors(handle, config.outtype, masks)
    tok = read_tokenizer(handle.path, handle.facts.vocab_size)  # type: ignore[arg-type]
    result = ExportResult(None, config, handle.arch.gguf_arch.lower(), plan, {})
    result.metadata, warnings, result.llama_cpp_loadable = aios_metadata(handle, config, result.fallbacks, masks)
    result.warnings += warnings
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


@dataclass(frozen=True)
class TensorOut:
    """One tensor of a GGUF being written: its header entry and a callable producing its data
    (an array, or a ``gt.EncodedTensor`` that encodes row chunks while it is written)."""

    name: str
    shape: tuple[int, ...]
    outtype: str
    nbytes: int
    data: Callable[[], object]


def write_gguf_file(out: Path, handle: ModelHandle, outtype: str, tok, metadata: dict[str, object],
                    tensors: list[TensorOut], progress: Callable[[int, int, str], None] | None = None) -> None:
    """Hyperparameters, tokenizer, ``aios.*`` metadata and ``tensors`` written to a temp file
    beside ``out``, fsynced and renamed: every GGUF writer (export, alias, svd-residual) goes
    through here, so none leaves a partial file under the final name."""
    import gguf

    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    os.close(fd)
    try:
        w = gguf.GGUFWriter(tmp, gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH[handle.arch.gguf_arch]])
        write_hparams(w, handle, outtype)
        if tok is not None:
            tok.add_to(w)
        add_metadata(w, metadata)
        for t in tensors:
            w.add_tensor_info(t.name, t.shape, np.dtype(np.float32), t.nbytes, raw_dtype=gt.ggml_type(t.outtype))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        for k, t in enumerate(tensors):
            w.write_tensor_data(t.data())  # type: ignore[arg-type]
            if progress:
                progress(k + 1, len(tensors), t.name)
        w.close()
        finalize(Path(tmp), out)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _write(handle, out: Path, plan, tok, result: ExportResult, masks, progress) -> None:
    def data(p):
        return lambda: gt.EncodedTensor(_source_rows(handle, p, masks), p.shape, p.outtype, p.nbytes)

    tensors = [TensorOut(p.name, p.shape, p.outtype, p.nbytes, data(p)) for p in plan]
    write_gguf_file(out, handle, result.config.outtype, tok, result.metadata, tensors, progress)


def finalize(tmp: Path, out: Path) -> None:
    """fsync the finished temp file, give it normal permissions, rename it to ``out``."""
    with open(tmp, "rb+") as fh:
        os.fsync(fh.fileno())
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(tmp, 0o666 & ~mask)
    os.replace(tmp, out)
