"""GGUF exports of an aliased HF folder: aliased (for ``aios-run``) or de-aliased (for llama.cpp).

* **aliased**: the standard tensors of ``aios-convert gguf`` for every un-aliased matrix,
  plus each group's canonical once (``blk.<anchor>.<t>.canonical``) and the members' deltas
  (``blk.N.<t>.delta`` dense or Q8_0, ``blk.N.<t>.delta.lr_u`` / ``.lr_v`` low-rank), with
  the group records (GGUF names) in ``aios.alias.groups``. llama.cpp cannot run it (the
  members' ``.weight`` tensors are absent); ``aios-run`` applies the deltas on the fly.
* **de-aliased** (``--dealias``): every ``W_i = W_c + δ_i`` materialized into a temporary
  standard HF folder, then exported by ``aios-convert gguf`` unchanged, so llama.cpp loads it.

With ``sparse_down`` (``aios-convert alias ... --gguf OUT --sparse-down``) every FFN down
projection is stored neuron-major (d_ffn rows of d_model, quantized along d_model) so aios-run's
sparse modes read only the firing neurons' rows: an un-aliased one as ``blk.N.ffn_down.t``
(``convert.gguf.plan.neuron_major_down``, as ``aios-convert gguf --sparse-down``), an aliased
group's canonical as ``blk.A.ffn_down.canonical.t`` and its members' deltas as
``blk.N.ffn_down.delta.t`` (dense, or Q8_0 quantized again along d_model: a second rounding of the
folder's Q8_0 delta, not its blocks bit for bit) or, low-rank, ``blk.N.ffn_down.delta.lr_u``
(d_model × R, as is: read whole) and ``blk.N.ffn_down.delta.lr_v.t`` (Vᵀ, d_ffn rows of R, typed
by the fallback rules on rows of R values: read per firing neuron). The group records name these
tensors; ``aios.sparse_down.*`` declares the layout.

Layouts: llama.cpp's row permutations (Falcon QKV regroup, Llama q/k RoPE order) are applied
to the canonical, dense and Q8_0 deltas, and to the row factor ``lr_u`` of low-rank deltas
(``P(U V) = (P U) V``); ``lr_v`` is stored as is. A Q8_0 delta is dequantized and quantized
again on write, which reproduces its blocks bit for bit (a Q8_0 block's largest value is
127·d exactly, so the scale and every quant come back unchanged).
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch

from aios.errors import InvalidModelError, UnsupportedArchitectureError, UsageError
from aios.models import ModelHandle, resolve_model
from aios.models import alias_format as af
from convert.gguf import (ExportPlan, ExportResult, GGUFExportConfig, PlannedTensor, aios_metadata,
                          check_exportable, check_outtype, export_gguf, gguf_name, gguf_name_map,
                          plan_tensor, plan_tensors, provenance, write_plan)
from convert.gguf.plan import SPARSE_DOWN, neuron_major_down
from convert.gguf.tensors import EncodedTensor, apply_layout, choose_type, encoded_nbytes, like_types
from convert.gguf.tokenizer import read_tokenizer


NEURON_MAJOR_DOWN = re.compile(r"blk\.\d+\.ffn_down\.weight")  # the GGUF names --sparse-down transposes


def export_alias_gguf(folder: str | Path | ModelHandle, output: str | Path, *, outtype: str = "f32",
                      dealias: bool = False, sparse_down: bool = False,
                      like: str | Path | None = None) -> ExportResult:
    """The aliased GGUF of an aliased folder (canonical + deltas, for aios-run), or with
    ``dealias`` the standard one llama.cpp loads. ``like`` (a GGUF, e.g. the quantized file the
    model came from): each tensor in the type that file has for it (``aios-convert gguf
    --like``'s rule); an aliased file's canonical takes its first member's type, dense deltas
    their member's, low-rank factors ``outtype``."""
    handle = folder if isinstance(folder, ModelHandle) else resolve_model(str(folder))
    groups = af.groups_of(handle)
    if not groups:
        raise InvalidModelError(f"'{handle.spec}' has no alias groups; run aios-convert alias on it first.")
    check_outtype(outtype)
    if sparse_down and dealias:
        raise UsageError("--sparse-down applies to the aliased GGUF (--gguf); the de-aliased file (--dealias) is "
                         "the standard layout for llama.cpp.")
    out = Path(output)
    if out.is_dir():
        raise UsageError(f"{out} is a folder; pass a file name such as {out / 'model.gguf'}.")
    if dealias:
        return _dealiased(handle, groups, out, outtype, like)
    return _aliased(handle, groups, out, outtype, sparse_down, like)


def _dealiased(handle: ModelHandle, groups: list[af.Group], out: Path, outtype: str,
               like: str | Path | None = None) -> ExportResult:
    from safetensors.torch import save_file

    assert handle.path is not None
    out.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".dealias.", dir=out.parent))
    # named like the source so general.name and the provenance do not carry the random temp name
    # (identical input -> identical bytes)
    tmp = scratch / handle.path.name
    tmp.mkdir()
    try:
        alias_names = af.stored_alias_names(groups)
        state = {n: handle.tensor(n) for n in handle.store.inventory if n not in alias_names}  # type: ignore[union-attr]
        dtype = {n: handle.store.inventory[g.canonical].dtype for g in groups for n in [g.canonical]}  # type: ignore[union-attr]
        for g in groups:
            want = {"F16": torch.float16, "BF16": torch.bfloat16}.get(dtype[g.canonical], torch.float32)
            for name, W in af.materialized([g], af.tensor_getter(handle)):
                state[name] = torch.from_numpy(W).to(want)
        save_file({k: v.contiguous() for k, v in sorted(state.items())}, str(tmp / "model.safetensors"),
                  metadata={"format": "pt"})
        for n in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
            if (handle.path / n).is_file():
                shutil.copyfile(handle.path / n, tmp / n)
        return export_gguf(str(tmp), out, GGUFExportConfig(outtype, like=str(like) if like else None))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def check_sparse_down_layout(handle: ModelHandle) -> None:
    """--sparse-down's refusal, as aios-convert gguf --sparse-down refuses it: a model whose down
    projections are stored with a layout transpose (GPT-2's Conv1D) has no neuron-major file."""
    if handle.arch.transposed_linear:
        raise UsageError(f"--sparse-down is not available for {handle.arch.name} (its Conv1D down projections "
                         "are stored with a layout transpose); export the aliased GGUF without it.")


def _aliased(handle: ModelHandle, groups: list[af.Group], out: Path, outtype: str,
             sparse_down: bool = False, like: str | Path | None = None) -> ExportResult:
    if not handle.arch.runtime:
        raise UnsupportedArchitectureError(
            f"Aliased GGUF export supports falcon and llama-family models (what aios-run runs); "
            f"'{handle.arch.name}' can still be exported with --dealias.")
    check_exportable(handle)  # same acceptance rules as aios-convert gguf
    if sparse_down:
        check_sparse_down_layout(handle)
    # the standard tensors, planned exactly as aios-convert gguf plans them, plus the groups
    like_map, file_type = like_types(like) if like else (None, None)
    plan = ExportPlan(handle, outtype, plan_tensors(handle, outtype, exclude=af.stored_alias_names(groups),
                                                    like=like_map), file_type=file_type)
    if sparse_down:
        plan.tensors = neuron_major_down(handle, plan.tensors, outtype, keep_types=like_map is not None)
    gguf_groups = [_plan_group(plan, g, outtype, sparse_down, like_map) for g in groups]
    plan.sort()
    # recorded as an aios-convert gguf export of the standard tensors (sparse_down only when on)
    config = GGUFExportConfig(outtype, sparse_down=sparse_down, like=str(like) if like else None)
    result = ExportResult(None, config, handle.arch.gguf_arch.lower(), plan.tensors, {})
    result.metadata, warnings, _ = aios_metadata(handle, outtype, plan.fallbacks, provenance(handle, config))
    result.warnings += warnings
    sidecar = handle.path / af.SIDECAR if handle.path else None  # type: ignore[operator]
    report = json.loads(sidecar.read_text()) if sidecar and sidecar.is_file() else {}
    result.metadata.update(alias_metadata(gguf_groups, report))
    result.metadata.update(_ratio_metadata(handle, plan, gguf_groups))
    result.llama_cpp_loadable = False
    result.warnings.append("aliased GGUF: the members' weights are canonical + delta, which llama.cpp cannot run; "
                           "run it with aios-run, or export a standard file with --dealias")
    if sparse_down:
        from convert.gguf.metadata import sparse_down_keys

        result.metadata.update(sparse_down_keys(handle.facts.n_layers, SPARSE_DOWN_FORMAT))
        result.warnings.append(SPARSE_DOWN_WARNING)
    plan.metadata = result.metadata
    plan.tokenizer = read_tokenizer(handle.path, handle.facts.vocab_size)  # type: ignore[arg-type]
    write_plan(plan, out)
    result.output = out
    return result


def _plan_group(plan: ExportPlan, g: af.Group, outtype: str, sparse_down: bool = False,
                like: dict[str, tuple[str, str | None]] | None = None) -> af.Group:
    """Add group ``g``'s canonical (once) and its members' deltas to ``plan``; the group's
    record with GGUF names. Layout rules apply to the canonical, dense and Q8_0 deltas and
    to ``lr_u``; ``lr_v`` is stored as is. With ``sparse_down`` an FFN down group is stored
    neuron-major: the canonical, dense/Q8_0 deltas and ``lr_v`` transposed, named ``<name>.t``."""
    handle = plan.handle
    tmap = gguf_name_map(handle)
    label = handle.arch.gguf_arch.lower()
    rule = handle.arch.layout_rule(g.type)
    neuron_major = sparse_down and bool(NEURON_MAJOR_DOWN.fullmatch(gguf_name(tmap, g.members[0].weight, label)))

    def add(hf: str, gname: str, rule: str | None, force: str | None = None, q8_scales: str | None = None,
            transposed: bool = False, like_of: str | None = None) -> str:
        p = plan_tensor(handle, gname, hf, outtype, rule=rule, force_type=force)
        if like and like_of in like and force is None and len(p.shape) > 1:  # the source's type, blocks permitting
            force = choose_type(p.shape, like[like_of][0])[0]
            p = plan_tensor(handle, gname, hf, outtype, rule=rule, force_type=force)
        if transposed:  # neuron-major: the laid-out matrix transposed, typed by the rules on its new rows
            shape = tuple(reversed(p.shape))
            typ, why = choose_type(shape, force or outtype)
            p = PlannedTensor(SPARSE_DOWN.format(base=gname), hf, shape, p.source_dtype, typ,
                              encoded_nbytes(shape, typ), rule, why)
        p.data = _delta_data(handle, p, q8_scales, transposed)
        plan.tensors.append(p)
        return p.name

    first = gguf_name(tmap, g.members[0].weight, label)
    gcan = add(g.canonical, af.canonical_name(first), rule, transposed=neuron_major, like_of=first)
    members = []
    for m in g.members:
        gw = gguf_name(tmap, m.weight, label)
        if m.encoding == "q8_0":  # quants + scales, dequantized and quantized again bit for bit
            names: tuple[str, ...] = (add(m.tensors[0], f"{gw[: -len('.weight')]}.delta", rule, force="q8_0",
                                          q8_scales=m.tensors[1], transposed=neuron_major),)
        else:  # U (lr_u) stays as is when neuron-major: U·z reads all of it anyway
            names = tuple(add(hf, gn, None if gn.endswith(".lr_v") else rule,
                              transposed=neuron_major and not gn.endswith(".lr_u"),
                              like_of=gw if m.encoding == "dense" else None)
                          for hf, gn in zip(m.tensors, af.delta_names(gw, m.encoding)))
        members.append(af.Member(m.layer, gw, m.encoding, names, m.rank))
    return af.Group(g.type, gcan, tuple(members), g.canonical_init)


def _delta_data(handle: ModelHandle, p: PlannedTensor, q8_scales: str | None, transposed: bool = False):
    """The writer's data callable for an alias tensor: read (and for Q8_0 deltas dequantize)
    the stored tensor, apply the layout rule (then transpose it, neuron-major), encode to the
    planned type."""
    def data():
        get = af.tensor_getter(handle)
        if q8_scales is not None:
            arr = af.q8_dequantize(get(p.source).astype(np.int8), get(q8_scales).astype(np.float16))
        else:
            arr = get(p.source)
        t = apply_layout(torch.from_numpy(np.ascontiguousarray(arr, np.float32)), p.rule, handle.facts)
        rows = (t.T if transposed else t).contiguous().numpy()
        assert rows.shape == p.shape, (p.name, rows.shape, p.shape)
        return EncodedTensor(lambda a, b: rows[a:b], p.shape, p.outtype, p.nbytes)

    return data


def _ratio_metadata(handle: ModelHandle, plan: ExportPlan, groups: list[af.Group]) -> dict[str, object]:
    """``aios.alias.*`` aliasing ratios measured on the planned (stored) bytes."""
    f, tmap = handle.facts, gguf_name_map(handle)
    by_name = {p.name: p.nbytes for p in plan.tensors}

    def plain(layer: int, t: str) -> int | None:
        n = tmap.get_name(handle.arch.block(layer, t), try_suffixes=(".weight", ".bias"))
        if n and n not in by_name:  # --sparse-down: the same matrix stored neuron-major
            n = SPARSE_DOWN.format(base=n.removesuffix(".weight"))
        return by_name.get(n) if n else None

    ratio = af.aliasing_ratio(groups, by_name.__getitem__, plain, f.core_zone, f.n_layers, handle.arch.shareable)
    return {"aios.alias.core_aliasing_ratio": round(ratio.core_ratio, 6),
            "aios.alias.model_aliasing_ratio": round(ratio.model_ratio, 6),
            "aios.alias.core_zone": [f.core_zone.start, f.core_zone.stop - 1]}


SPARSE_DOWN_FORMAT = ("FFN down projections stored neuron-major (row j = neuron j's output weights, quantized "
                      "along d_model): un-aliased blk.N.ffn_down.t; aliased canonical <name>.canonical.t + delta "
                      "<name>.delta.t (dense/Q8_0) or <name>.delta.lr_u (d_model x R, as is) + <name>.delta.lr_v.t "
                      "(d_ffn x R); exact-sparse runs read only firing neurons' rows (and lr_u whole)")
SPARSE_DOWN_WARNING = ("--sparse-down stores every FFN down projection neuron-major (blk.N.ffn_down.t, "
                       "canonical.t, delta.t, delta.lr_v.t): the file is for aios-run (all modes); llama.cpp cannot "
                       "load it, as it cannot load any aliased file")


def alias_metadata(groups: list[af.Group], report: dict) -> dict[str, object]:
    """``aios.alias.*`` keys: group records, config, the converter's measured quality."""
    cfg = report.get("config", {})
    meta: dict[str, object] = {
        af.GGUF_GROUPS_KEY: af.dumps(groups),
        "aios.alias.group_count": len(groups),
        "aios.alias.delta_encodings": sorted({m.encoding for g in groups for m in g.members}),
        "aios.alias.ratio_definition": af.RATIO_DEFINITION,
    }
    if cfg:
        meta["aios.alias.config"] = json.dumps(cfg, sort_keys=True)
    if "zone_thresholds" in report:
        meta["aios.alias.zone_thresholds"] = json.dumps(report["zone_thresholds"], sort_keys=True)
    for key in ("source_heldout_perplexity", "heldout_perplexity", "perplexity_delta"):
        if key in report:
            meta[f"aios.alias.{key}"] = float(report[key])
    if "provenance" in report:
        meta["aios.alias.provenance"] = json.dumps(
            {**report["provenance"], "mode": report.get("mode"), "heldout": report.get("heldout")}, sort_keys=True)
    return meta
