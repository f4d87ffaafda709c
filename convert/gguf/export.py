"""``aios-convert gguf``: an HF model (the architecture rows with ``export_model_types``) as a
GGUF llama.cpp loads, through the spine: plan -> tensors -> metadata -> atomic writer.

Standard tensor names and keys come from gguf-py (``TensorNameMap``, ``GGUFWriter``); we add
``aios.*`` keys: the FFN activation as the model really computes it, what llama.cpp would run
instead, per-tensor type fallbacks, an optional sparsity map, and provenance.

Streaming: the plan is built from file headers only; each tensor is then read (safetensors
mmap), laid out, encoded in row chunks and written before the next is read, so peak memory is
about the largest tensor plus a constant. Identical input gives byte-identical output.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from aios.errors import UsageError
from aios.models import ModelHandle, resolve_model
from aios.models.alias_format import groups_of
from aios.models.from_gguf import hf_source
from convert.gguf import sparsity
from convert.gguf import tensors as gt
from convert.gguf.metadata import aios_metadata, provenance, sparse_down_metadata
from convert.gguf.plan import (
    ExportPlan,
    GGUFExportConfig,
    PlannedTensor,
    check_exportable,
    fallback_lines,
    neuron_major_down,
    plan_tensors,
)
from convert.gguf.tokenizer import read_tokenizer
from convert.gguf.writer import Progress, write_plan


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
        return fallback_lines(self.plan)

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


def check_outtype(outtype: str) -> None:
    if outtype not in gt.OUTTYPES:
        raise UsageError(f"--outtype must be one of {', '.join(gt.OUTTYPES)}, not '{outtype}'.")


def check_output_file(out: Path) -> None:
    if out.is_dir():
        raise UsageError(f"-o {out} is a folder; pass a file name such as {out / 'model.gguf'}.")


def export_gguf(model: str | ModelHandle, output: str | Path, config: GGUFExportConfig, *,
                dry_run: bool = False, progress: Progress | None = None) -> ExportResult:
    """Export ``model`` to ``output``; with ``dry_run`` only plan and report."""
    check_outtype(config.outtype)
    handle = model if isinstance(model, ModelHandle) else resolve_model(model)
    handle = hf_source(handle, None if progress is None else lambda message: progress(0, 1, message))
    check_exportable(handle)
    if groups_of(handle):
        raise UsageError(
            f"'{handle.spec}' is an aliased folder (canonical + delta weights); export it with "
            f"`aios-convert alias {handle.spec} --gguf OUT.gguf` (aliased, runs in aios-run) or "
            "`--dealias OUT.gguf` (standard GGUF llama.cpp loads)."
        )
    masks = _load_masks(handle, config)
    like, file_type = gt.like_types(config.like) if config.like else (None, None)
    plan = ExportPlan(handle, config.outtype, plan_tensors(handle, config.outtype, masks, like=like),
                      file_type=file_type)
    if config.sparse_down:
        if handle.arch.transposed_linear:
            raise UsageError(f"--sparse-down is for the architectures aios-run runs; '{handle.arch.name}' is not one.")
        plan.tensors = neuron_major_down(handle, plan.tensors, config.outtype, keep_types=like is not None)
    plan.tokenizer = read_tokenizer(handle.path, handle.facts.vocab_size)  # type: ignore[arg-type]
    result = ExportResult(None, config, handle.arch.gguf_arch.lower(), plan.tensors, {})
    result.metadata, warnings, result.llama_cpp_loadable = aios_metadata(
        handle, config.outtype, plan.fallbacks, provenance(handle, config), masks, config.sparsity_map)
    if config.sparse_down:
        extra, warning = sparse_down_metadata(handle.facts.n_layers)
        result.metadata.update(extra)
        result.llama_cpp_loadable = False
        warnings.append(warning)
    plan.metadata = result.metadata
    result.warnings += warnings
    if plan.tokenizer is None:
        result.warnings.append("no tokenizer.json: the file has no vocabulary, so llama.cpp cannot load it")
        result.llama_cpp_loadable = False
    else:
        result.warnings += plan.tokenizer.notes
    out = Path(output)
    if dry_run:
        return result
    check_output_file(out)
    write_plan(plan, out, progress)
    result.output = out
    return result


def _load_masks(handle: ModelHandle, config: GGUFExportConfig) -> dict[int, np.ndarray]:
    if not config.sparsity_map:
        return {}
    masks = sparsity.load_sparsity_map(config.sparsity_map)
    sparsity.check_masks(masks, handle.facts.n_layers, handle.facts.d_ffn, config.sparsity_map)
    return masks
