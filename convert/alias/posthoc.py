"""``aios-convert alias``: one canonical weight + per-layer deltas (R3), post-hoc.

Pipeline (trained aliasing in ``convert/alias/train.py`` reuses the analysis and the writer):

1. **Analysis** (streamed: one Gram matrix per matrix type, every tensor read once, by the
   checker's own ``aios.measure.similarity``): layer × layer cosine, ‖W_i − W_j‖/‖W_j‖,
   the candidate group (the layers of ``--zones``), its canonical (group mean or medoid) and
   each layer's cosine to it. A layer joins when its cosine to the canonical clears its zone
   threshold (docs/design.md, "Aliasing zones"; ``min_cosine`` overrides) and the group
   passes the bytes-saved condition: canonical + deltas < the members stored on their own.
2. **Perplexity budget**: types are tried best-similarity first; with ``budget_ppl`` each is
   kept only if the *measured* held-out perplexity change stays within the budget.
3. **Write**: an HF folder in the alias format (``aios.models.alias_format``), with the
   report and provenance in ``aios_alias.json``; optionally an aliased GGUF for ``aios-run``
   and a de-aliased standard GGUF for llama.cpp (``convert/alias/export.py``).

Memory: one Gram matrix per type while analysing; the written folder is built in memory
(safetensors writes one file from a dict), so about one copy of the model, plus the
transformers model for perplexity.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from aios import CONTRACT_VERSION, __version__
from aios.errors import InvalidModelError, UnsupportedArchitectureError, UsageError
from aios.measure.similarity import cosine_from_gram, streamed_gram
from aios.models import ModelHandle, resolve_model
from aios.models import alias_format as af
from aios.models.from_gguf import gguf_source_of, hf_source
from contract.spec import zone_threshold
from convert.alias.config import CANONICAL_MODES
from convert.relufication.run import source_sha256

ProgressFn = Callable[[str], None]
COPY_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
              "special_tokens_map.json", "vocab.json", "merges.txt", "tokenizer.model")


@dataclass(frozen=True)
class AliasConfig:
    """Converter config (versioned, embedded in every artifact)."""

    zones: str = "core"  # core | all | A-B (inclusive layer range)
    delta: str = "lowrank:8"  # dense | lowrank:R | q8_0 | none
    canonical: str = "mean"  # mean | medoid
    types: tuple[str, ...] | None = None  # short matrix names (e.g. q_proj); None = all shareable
    min_cosine: float | None = None  # None: the contract's zone thresholds
    budget_ppl: float | None = None  # max held-out perplexity increase (absolute), None = no search
    require_bytes_saved: bool = True
    version: int = 1


def parse_delta(spec: str) -> tuple[str, int | None]:
    m = re.fullmatch(r"lowrank:(\d+)", spec)
    if m:
        if int(m.group(1)) < 1:
            raise UsageError("--delta lowrank:R needs a rank R ≥ 1.")
        return "lowrank", int(m.group(1))
    if spec in ("dense", "q8_0", "none"):
        return spec, None
    raise UsageError(f"--delta must be dense, lowrank:R (e.g. lowrank:8), q8_0 or none, not '{spec}'.")


def zone_layers(zones: str, n_layers: int, core: range) -> list[int]:
    if zones == "core":
        return list(core)
    if zones == "all":
        return list(range(n_layers))
    m = re.fullmatch(r"(\d+)-(\d+)", zones)
    if not m or not (0 <= int(m.group(1)) < int(m.group(2)) < n_layers):
        raise UsageError(f"--zones must be core, all or a layer range A-B with 0 ≤ A < B < {n_layers}, "
                         f"not '{zones}'.")
    return list(range(int(m.group(1)), int(m.group(2)) + 1))


def short_name(rel: str) -> str:
    """``mlp.dense_h_to_4h.weight`` -> ``dense_h_to_4h`` (what --types takes)."""
    return rel.split(".")[-2]


def selected_types(handle: ModelHandle, cfg: AliasConfig) -> list[str]:
    """The shareable matrix types ``cfg.types`` selects (all of the architecture's by default)."""
    shareable = list(handle.arch.shareable)
    if cfg.types is None:
        return shareable
    by_short = {short_name(t): t for t in shareable}
    bad = [t for t in cfg.types if t not in by_short]
    if bad:
        raise UsageError(f"--types: '{bad[0]}' is not a shareable matrix of {handle.arch.name}; "
                         f"choose from {', '.join(by_short)}.")
    return [by_short[t] for t in cfg.types]


# --- analysis (pure on Gram matrices) ------------------------------------------------------


@dataclass
class TypeAnalysis:
    type: str
    shape: tuple[int, int]
    dtype: str
    bytes_per_layer: int
    cosine: list[list[float]]  # (L, L)
    zone: list[int]
    members: list[int]  # layers clearing their threshold against the canonical
    canonical_init: str
    medoid: int | None
    cos_to_canonical: dict[int, float]
    rel_delta_to_canonical: dict[int, float]  # ‖W_i − W_c‖/‖W_c‖
    rejected: str | None = None  # why this type is not aliased (None = candidate)


def canonical_stats(G: np.ndarray, members: list[int], init: str) -> tuple[dict, dict, int | None]:
    """cos(W_i, W_c) and ‖W_i − W_c‖/‖W_c‖ for every layer, with W_c the members' mean or medoid."""
    g = np.asarray(members)
    if init == "medoid":
        sub = G[np.ix_(g, g)]
        cost = np.diag(sub).sum() - 2 * sub.sum(0) + len(g) * np.diag(sub)  # Σ_i ‖W_i − W_j‖²
        j = int(g[int(np.argmin(cost))])
        ip, c2 = G[:, j], G[j, j]
    else:
        j = None
        ip, c2 = G[:, g].sum(1) / len(g), G[np.ix_(g, g)].sum() / len(g) ** 2  # <W_i, W̄>, ‖W̄‖²
    d = np.diag(G)
    cos = ip / np.sqrt(np.clip(d * c2, 1e-300, None))
    rel = np.sqrt(np.clip(d - 2 * ip + c2, 0, None)) / np.sqrt(max(c2, 1e-300))
    L = len(d)
    return ({i: float(cos[i]) for i in range(L)}, {i: float(rel[i]) for i in range(L)}, j)


def select_members(G: np.ndarray, zone: list[int], thresholds: dict[int, float], init: str) -> list[int]:
    """Drop layers below their threshold against the canonical of the rest until stable."""
    members = list(zone)
    while len(members) >= 2:
        cos, _, _ = canonical_stats(G, members, init)
        keep = [i for i in members if cos[i] >= thresholds[i]]
        if keep == members:
            return members
        if not keep:
            return []
        members = keep if len(keep) < len(members) else members[:-1]
    return members if len(members) >= 2 else []


def delta_nbytes(shape: tuple[int, int], itemsize: int, encoding: str, rank: int | None) -> int:
    n, m = shape
    return {"dense": n * m * itemsize, "lowrank": (rank or 0) * (n + m) * itemsize,
            "q8_0": n * m + n * m // af.QK * 2, "none": 0}[encoding]


def analyse(handle: ModelHandle, cfg: AliasConfig, progress: ProgressFn | None = None) -> list[TypeAnalysis]:
    """Similarity, groups and canonical per matrix type (module docstring, step 1)."""
    f = handle.facts
    zone = zone_layers(cfg.zones, f.n_layers, f.core_zone)
    encoding, rank = parse_delta(cfg.delta)
    out = []
    for rel in selected_types(handle, cfg):
        names = [handle.stored_name(handle.arch.block(i, rel)) for i in range(f.n_layers)]
        if any(n is None for n in names):
            continue
        info = handle.store.inventory[names[0]]  # type: ignore[union-attr]
        if len(info.shape) != 2:
            continue
        if progress:
            progress(f"analysing {short_name(rel)} across {f.n_layers} layers")
        G = streamed_gram(handle.tensor_rows, names, info.shape[0], info.shape[1])  # (L, L)
        thr = {i: cfg.min_cosine if cfg.min_cosine is not None else zone_threshold(i, f.n_layers) for i in zone}
        members = select_members(G, zone, thr, cfg.canonical)
        cos, rel_d, medoid = canonical_stats(G, members or zone, cfg.canonical)
        itemsize = info.nbytes // max(1, info.n_elements)
        ta = TypeAnalysis(rel, tuple(info.shape), info.dtype, info.nbytes,  # type: ignore[arg-type]
                          np.round(cosine_from_gram(G), 6).tolist(), zone, members, cfg.canonical, medoid,
                          cos, rel_d)
        if not members:
            ta.rejected = "fewer than two layers clear the zone cosine threshold against the canonical"
        elif encoding == "q8_0" and info.shape[1] % af.QK:
            ta.rejected = f"row length {info.shape[1]} is not a multiple of {af.QK} (q8_0 deltas)"
        else:
            k = len(members)
            stored = info.nbytes + k * delta_nbytes(ta.shape, itemsize, encoding, rank)
            if cfg.require_bytes_saved and stored >= k * info.nbytes:
                ta.rejected = (f"canonical + {k} {encoding} deltas ({stored:,} B) would not be smaller than "
                               f"the {k} matrices alone ({k * info.nbytes:,} B)")
        out.append(ta)
    return sorted(out, key=lambda a: -np.mean([a.cos_to_canonical[i] for i in (a.members or a.zone)]))


# --- building groups (pure on arrays) ------------------------------------------------------


def encode_delta(d: np.ndarray, encoding: str, rank: int | None) -> list[np.ndarray]:
    """Stored tensors of δ (float32 in; see alias_format for names and layouts)."""
    if encoding == "dense":
        return [d]
    if encoding == "lowrank":
        U, S, Vt = np.linalg.svd(d.astype(np.float64), full_matrices=False)
        r = min(rank or 1, len(S))
        s = np.sqrt(S[:r])
        return [(U[:, :r] * s).astype(np.float32), (s[:, None] * Vt[:r]).astype(np.float32)]
    if encoding == "q8_0":
        return list(af.q8_quantize(d))
    return []


def decode_delta(parts: list[np.ndarray], encoding: str) -> np.ndarray | None:
    if encoding == "dense":
        return parts[0]
    if encoding == "lowrank":
        return parts[0] @ parts[1]
    if encoding == "q8_0":
        return af.q8_dequantize(*parts)
    return None


@dataclass
class BuiltGroup:
    group: af.Group
    tensors: dict[str, np.ndarray]  # canonical + delta tensors to store
    approx: dict[int, np.ndarray]  # layer -> W_c + δ_i as the artifact reconstructs it
    rel_delta: dict[int, float]  # stored ‖δ_i‖/‖W_c‖
    rel_error: dict[int, float]  # ‖W_i − (W_c + δ_i)‖/‖W_i‖ (what the encoding lost)


def build_group(rel: str, weights: dict[int, np.ndarray], canonical: np.ndarray, names: dict[int, str],
                encoding: str, rank: int | None, init: str) -> BuiltGroup:
    """Canonical + encoded deltas for ``weights`` (layer -> W_i float32) sharing ``canonical``."""
    layers = sorted(weights)
    cname = af.canonical_name(names[layers[0]])
    tensors = {cname: canonical}
    members, approx, rel_d, rel_e = [], {}, {}, {}
    cn = float(np.linalg.norm(canonical))
    for i in layers:
        parts = encode_delta(weights[i] - canonical, encoding, rank)
        dn = af.delta_names(names[i], encoding)
        tensors.update(zip(dn, parts))
        d = decode_delta(parts, encoding)
        approx[i] = canonical + d if d is not None else canonical.copy()
        rel_d[i] = float(np.linalg.norm(d)) / cn if d is not None else 0.0
        rel_e[i] = float(np.linalg.norm(weights[i] - approx[i])) / max(float(np.linalg.norm(weights[i])), 1e-30)
        members.append(af.Member(i, names[i], encoding, dn, parts[0].shape[1] if encoding == "lowrank" else None))
    return BuiltGroup(af.Group(rel, cname, tuple(members), init), tensors, approx, rel_d, rel_e)


# --- the command -----------------------------------------------------------------------------


@dataclass
class AliasResult:
    output: Path
    config: AliasConfig
    report: dict[str, Any]  # what aios_alias.json holds
    gguf: Path | None = None
    dealiased_gguf: Path | None = None
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # plain text; the command prints them on stderr
    gguf_sparse_down: bool = False  # ``gguf`` stores its FFN down projections neuron-major


def check_source(handle: ModelHandle) -> None:
    if handle.kind == "gguf" or handle.path is None or not handle.path.is_dir() or not handle.has_weights:
        handle.require_weights("Aliasing")
        raise InvalidModelError(f"alias needs an HF safetensors folder; '{handle.spec}' is a {handle.kind}. "
                                "Convert from the original HF checkpoint.")
    if af.groups_of(handle):
        raise InvalidModelError(f"{handle.path} is already aliased; alias the original (independent-weight) model.")
    if not handle.arch.shareable:
        raise UnsupportedArchitectureError(f"Architecture '{handle.arch.name}' lists no shareable matrices.")


def check_output(out: Path) -> None:
    if out.exists():
        raise UsageError(f"{out} already exists; choose another output path or remove it.")


def alias(model: str | ModelHandle, out: str | Path, cfg: AliasConfig, *, outtype: str = "f32",
          gguf: str | Path | None = None, dealias: str | Path | None = None,
          progress: ProgressFn | None = None) -> AliasResult:
    """Post-hoc aliasing of ``model`` into the HF folder ``out`` (module docstring)."""
    from aios.evaluation import pydoc_split
    from convert import evaluation as ev

    encoding, rank = parse_delta(cfg.delta)
    if cfg.canonical not in CANONICAL_MODES:
        raise UsageError(f"--canonical must be {' or '.join(CANONICAL_MODES)}, not '{cfg.canonical}'.")
    if cfg.budget_ppl is not None and cfg.budget_ppl < 0:
        raise UsageError("--budget-ppl must be ≥ 0 (an absolute perplexity increase).")
    out = Path(out)
    check_output(out)
    say = progress or (lambda _m: None)
    handle = model if isinstance(model, ModelHandle) else resolve_model(str(model))
    handle = hf_source(handle, say)  # a llama.cpp GGUF: its dequantized HF twin (made once, cached)
    check_source(handle)
    analysis = analyse(handle, cfg, say)
    torch.manual_seed(0)
    tm = handle.load_torch(dtype="float32")
    tok = handle.load_tokenizer()
    heldout = pydoc_split(tok, "heldout")
    base_ppl = ev.heldout_perplexity(tm, heldout)
    say(f"held-out perplexity of the source: {base_ppl:.3f}")
    built: list[BuiltGroup] = []
    ppl = base_ppl
    for ta in analysis:
        if ta.rejected:
            continue
        names = {i: handle.arch.block(i, ta.type) for i in ta.members}
        W = {i: handle.tensor(names[i]).float().numpy() for i in ta.members}
        canon = W[ta.medoid].copy() if ta.medoid is not None else np.mean([W[i] for i in ta.members], 0)
        bg = build_group(ta.type, W, canon.astype(np.float32), names, encoding, rank, cfg.canonical)
        old = _swap(tm, bg.approx, names)
        if cfg.budget_ppl is not None:
            trial = ev.heldout_perplexity(tm, heldout)
            say(f"{short_name(ta.type)}: {len(ta.members)} layers share a canonical, perplexity {trial:.3f}")
            if trial - base_ppl > cfg.budget_ppl:
                _swap(tm, old, names)
                ta.rejected = f"perplexity +{trial - base_ppl:.3f} exceeds the budget {cfg.budget_ppl}"
                continue
            ppl = trial
        built.append(bg)
    if cfg.budget_ppl is None and built:
        ppl = ev.heldout_perplexity(tm, heldout)
    report = {"command": "aios-convert alias", "mode": "post-hoc", "config": asdict(cfg),
              "heldout": heldout.describe(), "source_heldout_perplexity": round(base_ppl, 4),
              "heldout_perplexity": round(ppl, 4), "perplexity_delta": round(ppl - base_ppl, 4),
              "zone_thresholds": {str(i): cfg.min_cosine if cfg.min_cosine is not None
                                  else zone_threshold(i, handle.facts.n_layers)
                                  for i in zone_layers(cfg.zones, handle.facts.n_layers, handle.facts.core_zone)},
              "analysis": [_analysis_json(a) for a in analysis]}
    return finish(handle, out, built, report, outtype=outtype, gguf=gguf, dealias=dealias, config=cfg)


def _swap(tm: torch.nn.Module, weights: dict[int, np.ndarray], names: dict[int, str]) -> dict[int, np.ndarray]:
    """Put ``weights`` into the torch model; returns the previous values."""
    old = {}
    params = dict(tm.named_parameters())
    with torch.no_grad():
        for i, W in weights.items():
            p = params[names[i]]
            old[i] = p.detach().numpy().copy()
            p.copy_(torch.from_numpy(W))
    return old


def _analysis_json(a: TypeAnalysis) -> dict[str, Any]:
    return {"type": a.type, "shape": list(a.shape), "zone_layers": a.zone, "members": a.members,
            "canonical_init": a.canonical_init, "medoid": a.medoid,
            "cos_to_canonical": {str(i): round(a.cos_to_canonical[i], 6) for i in a.zone},
            "rel_delta_to_canonical": {str(i): round(a.rel_delta_to_canonical[i], 6) for i in a.zone},
            "aliased": a.rejected is None, "rejected": a.rejected, "cosine_matrix": a.cosine}


def finish(handle: ModelHandle, out: Path, built: list[BuiltGroup], report: dict[str, Any], *, outtype: str,
           gguf, dealias, config) -> AliasResult:
    """Write the folder atomically, measure its ratio by the shared definition, export GGUFs."""
    write_folder(handle, out, built, report)
    return finish_exports(out, report, config, outtype=outtype, gguf=gguf, dealias=dealias)


def no_groups_note(out: Path) -> str:
    """What ``--gguf``/``--dealias`` say when aliasing kept every matrix (nothing to export)."""
    return (f"no alias groups formed (every matrix type was kept: see the table), so no "
            f"GGUF was written from {out}; lower --min-cosine, widen --zones or alias other --types, or export "
            "the source with aios-convert gguf.")


def finish_exports(out: Path, report: dict[str, Any], config, *, outtype: str, gguf, dealias) -> AliasResult:
    result = AliasResult(out, config, report)
    if (gguf or dealias) and not report.get("groups"):
        result.warnings.append(no_groups_note(out))
    elif gguf or dealias:
        from convert.alias.export import export_alias_gguf

        if gguf:
            result.gguf = export_alias_gguf(out, gguf, outtype=outtype).output
        if dealias:
            result.dealiased_gguf = export_alias_gguf(out, dealias, outtype=outtype, dealias=True).output
    return result


def write_folder(handle: ModelHandle, out: Path, built: list[BuiltGroup], report: dict[str, Any],
                 state: dict[str, torch.Tensor] | None = None) -> None:
    """The aliased HF folder, built in a temp folder and renamed; ``state`` overrides the
    source's un-aliased tensors (a trained run changes them too)."""
    from safetensors.torch import save_file

    assert handle.path is not None
    removed = {m.weight for bg in built for m in bg.group.members}
    tensors: dict[str, torch.Tensor] = {}
    for info in handle.tensor_inventory():
        if info.name not in removed:
            tensors[info.name] = state[info.name].to(handle.tensor(info.name).dtype) if state is not None \
                else handle.tensor(info.name)
    src_dtype = {info.name: info.dtype for info in handle.tensor_inventory()}
    for bg in built:
        want = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}.get(
            src_dtype[bg.group.members[0].weight], torch.float32)  # canonical/deltas keep the source type
        for name, arr in bg.tensors.items():
            t = torch.from_numpy(np.ascontiguousarray(arr))
            tensors[name] = t if ".delta.q8" in name else t.to(want)
        report.setdefault("delta_norms", []).extend(
            {"type": bg.group.type, "layer": i, "rel_delta_norm": round(bg.rel_delta[i], 6),
             "rel_reconstruction_error": round(bg.rel_error[i], 6)} for i in sorted(bg.rel_delta))
    report.setdefault("delta_norms", [])
    groups = [bg.group for bg in built]
    report["groups"] = json.loads(af.dumps(groups))
    report["provenance"] = {"tool": "aios-toolchain", "tool_version": __version__,
                            "contract_version": CONTRACT_VERSION,
                            "source": {"name": handle.name, "architecture": handle.arch.name,
                                       "sha256": source_sha256(handle),
                                       **({"gguf": g} if (g := gguf_source_of(handle.path)) else {})}}
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        save_file({k: v.contiguous() for k, v in sorted(tensors.items())}, str(tmp / "model.safetensors"),
                  # one key only: safetensors writes __metadata__ from a hash map, so with two keys
                  # their order (and the file's bytes) varied from run to run
                  metadata={af.HF_METADATA_KEY: af.dumps(groups)})
        for n in COPY_FILES:
            if (handle.path / n).is_file():
                shutil.copyfile(handle.path / n, tmp / n)
        ratio = af.ratio_of(resolve_model(str(tmp)))  # the checker's definition, on the written bytes
        report["aliasing"] = ratio.to_dict()
        (tmp / af.SIDECAR).write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
        umask = os.umask(0)
        os.umask(umask)
        for p in tmp.iterdir():
            p.chmod(0o666 & ~umask)
        tmp.chmod(0o777 & ~umask)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def with_overrides(cfg: AliasConfig, **kw) -> AliasConfig:
    return replace(cfg, **{k: v for k, v in kw.items() if v is not None})
