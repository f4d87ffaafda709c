"""The GGUF spine every GGUF writer in ``convert`` shares, in four explicit steps:

1. **plan** (:mod:`convert.gguf.plan`): every tensor the file will hold — GGUF name, shape,
   type after the fallback rules, byte size, source — from file headers only;
2. **tensors** (:mod:`convert.gguf.tensors`): llama.cpp's layouts applied to each source
   tensor and its rows encoded chunk by chunk (gguf-py's quantizers, ours for K-quants);
3. **metadata** (:mod:`convert.gguf.metadata`): architecture keys from the architecture row,
   the tokenizer (:mod:`convert.gguf.tokenizer`), ``aios.*`` keys and provenance;
4. **atomic writer** (:mod:`convert.gguf.writer`): temp file, fsync, rename.

``aios-convert gguf`` (:mod:`convert.gguf.export`) is the plain pipeline. Exporters that add
or replace tensors (alias canonical + deltas, svd-residual factors, sparsity masks) build the
standard plan with :func:`plan_tensors`, transform its list of :class:`PlannedTensor`, and
write it with :func:`write_plan`. The converters that rewrite an existing GGUF (``layout``,
``sparsify``) go through :func:`rewrite_gguf`: the source's keys and their own, tensors copied
byte for byte (:class:`RawTensor`) or re-encoded. See docs/design.md, "How to add a converter".
"""

from convert.gguf.export import ExportResult, check_output_file, check_outtype, export_gguf
from convert.gguf.metadata import add_metadata, aios_metadata, provenance
from convert.gguf.plan import (ExportPlan, GGUFExportConfig, PlannedTensor, check_exportable,
                               fallback_lines, gguf_name, gguf_name_map, plan_tensor, plan_tensors,
                               tensor_order)
from convert.gguf.tensors import OUTTYPES
from convert.gguf.writer import (RawTensor, ReservedKey, TensorOut, atomic_output, finalize, rewrite_gguf,
                                 write_gguf_file, write_plan)

__all__ = [
    "OUTTYPES", "ExportPlan", "ExportResult", "GGUFExportConfig", "PlannedTensor", "RawTensor",
    "ReservedKey", "TensorOut", "add_metadata", "aios_metadata", "atomic_output", "check_exportable",
    "check_output_file", "check_outtype", "export_gguf", "fallback_lines", "finalize", "gguf_name",
    "gguf_name_map", "plan_tensor", "plan_tensors", "provenance", "rewrite_gguf", "tensor_order",
    "write_gguf_file", "write_plan",
]
