"""The svd-residual GGUF: the standard export plan with each factorized matrix replaced by its
factors and residual, the ``aios.lowrank.*`` keys, and the result the command reports."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from convert.lowrank.config import SvdResidualConfig
from convert.lowrank.factorize import NEURON_MAJOR_DOWN


@dataclass
class TensorRow:
    name: str  # base name, e.g. blk.0.attn_qkv
    shape: tuple[int, int]
    rank: int
    energy_kept: float
    sqnr_db: float
    output_sqnr_db: float | None
    bits_per_weight: float
    residual_type: str
    residual_layout: str
    notes: list[str]


@dataclass
class SvdResidualResult:
    output: Path
    config: SvdResidualConfig
    rows: list[TensorRow]
    metadata: dict[str, object]
    calibration: dict | None
    warnings: list[str]
    total_bytes: int
    measured: dict | None = None  # held-out perplexity and MB/token from the runtime
    report_path: Path | None = None

    @property
    def bits_per_weight(self) -> float:
        params = sum(r.shape[0] * r.shape[1] for r in self.rows)
        return sum(r.bits_per_weight * r.shape[0] * r.shape[1] for r in self.rows) / max(1, params)

    def to_json(self) -> dict:
        return {"tool": "aios-convert svd-residual", "output": self.output.name, "config": asdict(self.config),
                "selection": self.config.selection, "calibration": self.calibration,
                "bits_per_weight_factorized": self.bits_per_weight, "tensor_bytes": self.total_bytes,
                "tensors": [asdict(r) for r in self.rows], "measured": self.measured,
                "evidence": {"tensors": "measured (reconstruction of the stored tensors)",
                             "measured": "measured (the GGUF run in aios-run: perplexity and byte counter)"},
                "warnings": self.warnings}


def lowrank_metadata(rows: list[TensorRow], cfg: SvdResidualConfig, calib: dict | None) -> dict[str, object]:
    """The ``aios.lowrank.*`` keys (per-tensor values as parallel arrays)."""
    meta: dict[str, object] = {
        "aios.lowrank.format": "W = lr_u (n_out x r) @ lr_v (r x n_in) + residual; residual rows (n_out x n_in) "
                               "or flat (n_out*n_in,) row-major in 256-value K-quant blocks; no .weight",
        "aios.lowrank.method": cfg.method,
        "aios.lowrank.selection": cfg.selection,
        "aios.lowrank.residual": cfg.residual if not cfg.like or cfg.residual == "none" else f"like {cfg.like}",
        "aios.lowrank.factor_type": cfg.factor_type,
        "aios.lowrank.tensors": [r.name for r in rows],
        "aios.lowrank.ranks": [r.rank for r in rows],
        "aios.lowrank.energy_kept": [round(r.energy_kept, 6) for r in rows],
        "aios.lowrank.bits_per_weight": [round(r.bits_per_weight, 4) for r in rows],
        "aios.lowrank.residual_types": [r.residual_type for r in rows],
        "aios.lowrank.residual_layouts": [r.residual_layout for r in rows],
        "aios.lowrank.runtime": "aios-run only: llama.cpp finds no blk.N.X.weight and cannot load this file",
        "aios.llama_cpp.loadable": False,
    }
    notes = [f"{r.name}: {n}" for r in rows for n in r.notes]
    if notes:
        meta["aios.lowrank.fallbacks"] = notes
    if cfg.sparse_down:
        from convert.gguf.metadata import sparse_down_keys

        meta.update(sparse_down_keys(sum(1 for r in rows if NEURON_MAJOR_DOWN.fullmatch(r.name + ".weight")),
                                     SPARSE_DOWN_FORMAT))
    if calib:
        meta["aios.lowrank.calibration"] = json.dumps(calib, sort_keys=True)
    return meta


SPARSE_DOWN_FORMAT = ("blk.N.ffn_down = lr_u (d_model x r) @ lr_v + residual with lr_v.t (d_ffn x r) = lr_vᵀ and "
                      "residual.t (d_ffn x d_model) = residualᵀ stored neuron-major (row j = neuron j, the residual "
                      "quantized along d_model), so exact-sparse runs read only firing neurons' rows of lr_v.t and "
                      "residual.t, and lr_u whole")
SPARSE_DOWN_WARNING = ("--sparse-down stores every FFN down projection's lr_v and residual neuron-major "
                       "(blk.N.ffn_down.lr_v.t, .residual.t): the file is for aios-run (all modes); llama.cpp cannot "
                       "load it, as it cannot load any svd-residual file")


def write_lowrank_gguf(handle, out: Path, tensors, entries, rows, cfg: SvdResidualConfig,
                       calib) -> SvdResidualResult:
    """The standard plan ``tensors`` with each factorized matrix replaced by its factors and
    residual (``entries``: GGUF name -> [(name, type, shape, .npy file)]), written to ``out``."""
    from convert.gguf import ExportPlan, PlannedTensor, aios_metadata, provenance, write_plan
    from convert.gguf.tokenizer import read_tokenizer

    plan = ExportPlan(handle, cfg.outtype, [])
    for p in tensors:
        if p.name not in entries:
            plan.tensors.append(p)
            continue
        for name, t, shape, f in entries[p.name]:
            nbytes = int(np.load(f, mmap_mode="r").nbytes)
            plan.tensors.append(PlannedTensor(name, None, shape, p.source_dtype, t, nbytes,
                                              data=lambda f=f: np.load(f, mmap_mode="r")))
    plan.sort()
    converter_config = asdict(cfg)
    for key in ("sparse_down", "like"):  # recorded only when on: older exports keep their bytes
        if not converter_config[key]:
            del converter_config[key]
    prov = provenance(handle, command="aios-convert svd-residual", converter_config=converter_config)
    meta, warnings, _ = aios_metadata(handle, cfg.outtype, plan.fallbacks, prov)
    if cfg.sparse_down:
        warnings.append(SPARSE_DOWN_WARNING)
    meta.update(lowrank_metadata(rows, cfg, calib))
    plan.metadata = meta
    plan.tokenizer = read_tokenizer(handle.path, handle.facts.vocab_size)
    write_plan(plan, out)
    return SvdResidualResult(out, cfg, rows, meta, calib, warnings, plan.total_bytes)
