"""GGUF exports of an aliased HF folder: aliased (for ``aios-run``) or de-aliased (for llama.cpp).

* **aliased**: the standard tensors of ``aios-convert gguf`` for every un-aliased matrix,
  plus each group's canonical once (``blk.<anchor>.<t>.canonical``) and the members' deltas
  (``blk.N.<t>.delta`` dense or Q8_0, ``blk.N.<t>.delta.lr_u`` / ``.lr_v`` low-rank), with
  the group records (GGUF names) in ``aios.alias.groups``. llama.cpp cannot run it (the
  members' ``.weight`` tensors are absent); ``aios-run`` applies the deltas on the fly.
* **de-aliased** (``--dealias``): every ``W_i = W_c + δ_i`` materialized into a temporary
  standard HF folder, then exported by ``aios-convert gguf`` unchanged, so llama.cpp loads it.

Layouts: llama.cpp's row permutations (Falcon QKV regroup, Llama q/k RoPE order) are applied
to the canonical, dense and Q8_0 deltas, and to the row factor ``lr_u`` of low-rank deltas
(``P(U V) = (P U) V``); ``lr_v`` is stored as is. A Q8_0 delta is dequantized and quantized
again on write, which reproduces its blocks bit for bit (a Q8_0 block's largest value is
127·d exactly, so the scale and every quant come back unchanged).
"""

from __future__ import annotations

import copy
import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch

from aios.errors import InvalidModelError, UnsupportedArchitectureError, UsageError
from aios.models import ModelHandle, resolve_model
from aios.models import alias_format as af
from convert import gguf_export as ge
from convert import gguf_tensors as gt
from convert.gguf_metadata import aios_metadata
from convert.gguf_tokenizer import read_tokenizer


def export_alias_gguf(folder: str | Path | ModelHandle, output: str | Path, *, outtype: str = "f32",
                      dealias: bool = False) -> ge.ExportResult:
    handle = folder if isinstance(folder, ModelHandle) else resolve_model(str(folder))
    groups = af.groups_of(handle)
    if not groups:
        raise InvalidModelError(f"'{handle.spec}' has no alias groups; run aios-convert alias on it first.")
    if outtype not in gt.OUTTYPES:
        raise UsageError(f"--outtype must be one of {', '.join(gt.OUTTYPES)}, not '{outtype}'.")
    out = Path(output)
    if out.is_dir():
        raise UsageError(f"{out} is a folder; pass a file name such as {out / 'model.gguf'}.")
    return _dealiased(handle, groups, out, outtype) if dealias else _aliased(handle, groups, out, outtype)


def _dealiased(handle: ModelHandle, groups: list[af.Group], out: Path, outtype: str) -> ge.ExportResult:
    from safetensors.torch import save_file

    assert handle.path is not None
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".dealias.", dir=out.parent))
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
        return ge.export_gguf(str(tmp), out, ge.GGUFExportConfig(outtype))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _gguf_name(tmap, hf_weight: str) -> str:
    name = tmap.get_name(hf_weight, try_suffixes=(".weight", ".bias"))
    if name is None:
        raise UnsupportedArchitectureError(f"'{hf_weight}' has no GGUF name.")
    return name


def _rule(handle: ModelHandle, hf_weight: str) -> str | None:
    return next((r for r, suffix in ge.LAYOUT_RULES[handle.arch.name] if suffix in hf_weight), None)


def _aliased(handle: ModelHandle, groups: list[af.Group], out: Path, outtype: str) -> ge.ExportResult:
    import gguf

    if handle.arch.name not in ("falcon", "llama"):
        raise UnsupportedArchitectureError(
            f"Aliased GGUF export supports falcon and llama-family models (what aios-run runs); "
            f"'{handle.arch.name}' can still be exported with --dealias.")
    ge._check_exportable(handle)  # noqa: SLF001  same acceptance rules as aios-convert gguf
    alias_names = af.stored_alias_names(groups)
    inventory = handle.tensor_inventory()
    shim = copy.copy(handle)  # the standard tensors only, planned exactly as aios-convert gguf does
    shim.tensor_inventory = lambda: [t for t in inventory if t.name not in alias_names]  # type: ignore[method-assign]
    plan = ge.plan_tensors(shim, outtype, {})
    tmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH[handle.arch.gguf_arch], handle.facts.n_layers)
    inv = handle.store.inventory  # type: ignore[union-attr]
    get = af.tensor_getter(handle)
    rows: dict[str, tuple[str, str | None]] = {}  # GGUF name -> (HF name, layout rule)
    gguf_groups = []

    def add(hf: str, gname: str, kind: str, rule: str | None) -> None:
        shape = tuple(inv[hf].shape)
        if kind == "q8_0":
            typ, why = "q8_0", None
        else:
            typ, why = gt.choose_type(shape, outtype)
        plan.append(ge.PlannedTensor(gname, hf, shape, inv[hf].dtype, typ, gt.encoded_nbytes(shape, typ), rule, why))
        rows[gname] = (hf, rule)

    for g in groups:
        anchor = _gguf_name(tmap, g.members[0].weight)
        rule = _rule(handle, g.type)
        gcan = af.canonical_name(anchor)
        add(g.canonical, gcan, "canonical", rule)
        members = []
        for m in g.members:
            gw = _gguf_name(tmap, m.weight)
            base = gw[: -len(".weight")]
            if m.encoding == "q8_0":
                names = (f"{base}.delta",)
                add(m.tensors[0], names[0], "q8_0", rule)
                rows[names[0]] = (m.tensors[0] + "|" + m.tensors[1], rule)  # dequantized from both
            else:
                names = af.delta_names(gw, m.encoding)
                for hf, gn in zip(m.tensors, names):
                    add(hf, gn, m.encoding, None if gn.endswith(".lr_v") else rule)
            members.append(af.Member(m.layer, gw, m.encoding, names, m.rank))
        gguf_groups.append(af.Group(g.type, gcan, tuple(members), g.canonical_init))
    plan.sort(key=ge._order_key)  # noqa: SLF001

    f = handle.facts

    def source(p: ge.PlannedTensor):
        if p.name not in rows:
            return ge._source_rows(handle, p, {})  # noqa: SLF001
        hf, rule = rows[p.name]
        if "|" in hf:
            q, s = hf.split("|")
            arr = af.q8_dequantize(get(q).astype(np.int8), get(s).astype(np.float16))
        else:
            arr = get(hf)
        t = torch.from_numpy(np.ascontiguousarray(arr, np.float32))
        if rule == "falcon_qkv":
            t = gt.falcon_qkv(t, f.n_heads, f.n_kv_heads, f.head_dim)
        elif rule == "rope_q":
            t = gt.rope_interleave(t, f.n_heads)
        elif rule == "rope_k":
            t = gt.rope_interleave(t, f.n_kv_heads)
        arr = t.contiguous().numpy()
        assert arr.shape == p.shape, (p.name, arr.shape, p.shape)
        return lambda a, b: arr[a:b]

    result = ge.ExportResult(None, ge.GGUFExportConfig(outtype), handle.arch.gguf_arch.lower(), plan, {})
    result.metadata, warnings, _ = aios_metadata(handle, result.config, result.fallbacks, {})
    result.warnings += warnings
    sidecar = handle.path / af.SIDECAR if handle.path else None  # type: ignore[operator]
    report = json.loads(sidecar.read_text()) if sidecar and sidecar.is_file() else {}
    result.metadata.update(alias_metadata(gguf_groups, report))
    by_name = {p.name: p.nbytes for p in plan}

    def plain(layer: int, t: str) -> int | None:
        n = tmap.get_name(handle.arch.block(layer, t), try_suffixes=(".weight", ".bias"))
        return by_name.get(n) if n else None

    ratio = af.aliasing_ratio(gguf_groups, by_name.__getitem__, plain, f.core_zone, f.n_layers, handle.arch.shareable)
    result.metadata["aios.alias.core_aliasing_ratio"] = round(ratio.core_ratio, 6)
    result.metadata["aios.alias.model_aliasing_ratio"] = round(ratio.model_ratio, 6)
    result.metadata["aios.alias.core_zone"] = [f.core_zone.start, f.core_zone.stop - 1]
    result.llama_cpp_loadable = False
    result.warnings.append("aliased GGUF: the members' weights are canonical + delta, which llama.cpp cannot run; "
                           "run it with aios-run, or export a standard file with --dealias")
    tok = read_tokenizer(handle.path, f.vocab_size)  # type: ignore[arg-type]
    out.parent.mkdir(parents=True, exist_ok=True)
    def data(p):
        return lambda: gt.EncodedTensor(source(p), p.shape, p.outtype, p.nbytes)

    ge.write_gguf_file(out, handle, outtype, tok, result.metadata,
                       [ge.TensorOut(p.name, p.shape, p.outtype, p.nbytes, data(p)) for p in plan])
    result.output = out
    return result


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
