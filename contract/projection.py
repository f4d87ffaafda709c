"""Projected MB/token from the model's own bytes plus measured sparsity and aliasing.

Labelled *projected* everywhere: it is a model of savings, not a measurement. The
runtime (aios-run bench) measures the real figure.

    MB/token ≈ weight reads + KV-cache reads + activation spill
    weights  = Σ tensors read per token (embedding: one row; LM head: whole matrix)
    sparse   : FFN down rows of zero activations are skipped  → down × (1 − s);
               gated FFN: up rows too (gate computed first)   → up × (1 − s), unless the
               zeros are cut at the down input (sparsify --site down_in)
               cut projection inputs (sparsify --scope all), each site's measured zeros
               s_site: q/k/v × (1 − s_attn_in), o × (1 − s_attn_out), gate/up × (1 − s_ffn_in)
               (a sparse kernel reads the rows of nonzero inputs: sparsify --input-major)
    aliasing : core-zone shareable bytes × (1 − aliasing ratio); an already aliased model
               (aios-convert alias) is baselined on its de-aliased bytes, each member matrix
               counted as stored alone, and its members outside the core zone projected at
               their stored share (canonical / k + delta)
    KV       = L × H_kv × d_head × C × 4 bytes at context C
"""

from __future__ import annotations

import re
from collections import defaultdict

from aios.models import ModelHandle
from contract.checks.r2_kv_cache import kv_bytes
from contract.checks.r4_activation_footprint import footprint
from contract.result import Projection, ProjectionTerm, RequirementResult, Status
from contract.spec import tiers

_EMBED = re.compile(r"(word_embeddings|embed_tokens|wte|token_embd)\.weight$")
_HEAD = re.compile(r"(^lm_head|^output)\.weight$")
# a GGUF layer matrix by the input site it reads (stored as is, or input-major: ``.t``)
_SITE_ROLE = re.compile(r"^blk\.\d+\.(attn_q|attn_k|attn_v|attn_qkv|attn_output|ffn_gate|ffn_up|ffn_down)\.(weight|t)$")
_ROLE_OF = {"attn_q": "attn_in", "attn_k": "attn_in", "attn_v": "attn_in", "attn_qkv": "attn_in",
            "attn_output": "attn_out", "ffn_gate": "ffn_gate", "ffn_up": "ffn_up", "ffn_down": "ffn_down"}
ROLES = ("ffn_up", "ffn_gate", "ffn_down", "attn_in", "attn_out", "other")


# ``aios-convert gguf --sparse-down`` stores a layer's down projection neuron-major under this name
# (convert/gguf/plan.py); it is the ffn_down role, whose rows sparse execution skips
NEURON_MAJOR_DOWN = "blk.{i}.ffn_down.t"
# ``aios-convert svd-residual --sparse-down``: the parts of a low-rank down projection whose rows are
# neurons (V transposed, the residual transposed): ffn_down role too; U is read whole ("other")
NEURON_MAJOR_LOWRANK_DOWN = ("blk.{i}.ffn_down.lr_v.t", "blk.{i}.ffn_down.residual.t")


def weight_bytes_by_role(handle: ModelHandle) -> tuple[dict[str, float], str]:
    """Bytes read per token by role: embedding_row, head, ffn_up, ffn_gate, ffn_down, core_shareable, other."""
    f, arch = handle.facts, handle.arch
    roles: dict[str, float] = defaultdict(float)
    core_names = {arch.block(i, r) for i in f.core_zone for r in arch.shareable}
    ffn = {"ffn_up": arch.ffn_up, "ffn_gate": arch.ffn_gate, "ffn_down": arch.ffn_down}
    if handle.has_weights:
        by_hf: dict[str, tuple[str, float]] = {}
        inv = {t.name: t for t in handle.tensor_inventory()}
        aliased = _alias_members(handle, roles, core_names, ffn)
        for name in aliased:
            inv.pop(name, None)
        for i in range(f.n_layers):
            for role, rel in ffn.items():
                if rel:
                    n = handle.stored_name(arch.block(i, rel + ".weight"))
                    if n is None and role == "ffn_down" and NEURON_MAJOR_DOWN.format(i=i) in inv:
                        n = NEURON_MAJOR_DOWN.format(i=i)  # the same matrix, stored transposed
                    if n is None and role == "ffn_down":
                        for part in (p.format(i=i) for p in NEURON_MAJOR_LOWRANK_DOWN):
                            if part in inv:
                                by_hf[part] = (role, inv[part].nbytes)
                    if n:
                        by_hf[n] = (role, inv[n].nbytes)
        core_stored = {handle.stored_name(n) for n in core_names} - {None}
        if arch.ffn_down + ".weight" in arch.shareable:  # a neuron-major down shares as the standard one
            core_stored |= {NEURON_MAJOR_DOWN.format(i=i) for i in f.core_zone} & inv.keys()
        embed = None
        for name, t in inv.items():
            if _EMBED.search(name):
                embed = t
                roles["embedding_row"] += t.nbytes / max(1, t.shape[0])
                continue
            if _HEAD.search(name):
                roles["head"] += t.nbytes
                continue
            role = by_hf.get(name, (None,))[0]
            if role is None and (m := _SITE_ROLE.match(name)):
                role = _ROLE_OF[m.group(1)]
            if name in core_stored:
                roles["core_shareable"] += t.nbytes  # counted once; sparsity applied below via share
                roles[f"core:{role or 'other'}"] += t.nbytes
            elif role:
                roles[role] += t.nbytes
            else:
                roles["other"] += t.nbytes
        if f.tied_embeddings and "head" not in roles and embed is not None:
            roles["head"] += embed.nbytes
        return dict(roles), "tensor bytes from the model's files"
    # no weights: analytic from config, 2 bytes per parameter (fp16/bf16 checkpoints)
    b = 2
    hd = f.head_dim
    attn = f.d_model * f.n_heads * hd * 2 + f.d_model * f.n_kv_heads * hd * 2
    per = {"ffn_up": f.d_model * f.d_ffn, "ffn_down": f.d_model * f.d_ffn}
    if f.gated_ffn:
        per["ffn_gate"] = f.d_model * f.d_ffn
    n_core = len(f.core_zone)
    for role, n in per.items():
        roles[role] += n * b * (f.n_layers - n_core)
        roles[f"core:{role}"] += n * b * n_core
    roles["other"] += attn * b * (f.n_layers - n_core)
    roles["core:other"] += attn * b * n_core
    roles["core_shareable"] = sum(v for k, v in roles.items() if k.startswith("core:"))
    roles["embedding_row"] = f.d_model * b
    roles["head"] = (f.vocab_size or 0) * f.d_model * b
    return dict(roles), "parameter counts from config × 2 bytes (no weights on this machine)"


def _alias_members(handle: ModelHandle, roles: dict[str, float], core_names: set[str], ffn: dict) -> set[str]:
    """Add an aliased model's member matrices to ``roles`` at their stand-alone bytes.

    The stored canonical and delta tensors would otherwise count as "other" bytes and the
    projection would baseline the model on its own (already shared) bytes: 0 % saving. Each
    member goes to the bucket its un-aliased matrix would (``core:<role>`` or ``<role>``)
    and, outside the core zone (whose saving the R3 ratio carries), its stored saving is
    recorded under ``alias_saved:<bucket>``. Returns the stored tensor names consumed.
    """
    from aios.models import alias_format as AF

    groups = AF.groups_of(handle)
    if not groups:
        return set()
    arch = handle.arch
    role_of = {rel + ".weight": role for role, rel in ffn.items() if rel}
    for rec in AF.ratio_of(handle, groups).per_member:
        role = role_of.get(rec["type"], "other")
        core = arch.block(rec["layer"], rec["type"]) in core_names
        bucket = f"core:{role}" if core else role
        roles[bucket] += rec["bytes_alone"]
        if core:
            roles["core_shareable"] += rec["bytes_alone"]
        else:
            roles[f"alias_saved:{bucket}"] += rec["saved"]
    return AF.stored_alias_names(groups)


def project(handle: ModelHandle, results: dict[str, RequirementResult], context: int, tier: str) -> Projection:
    f = handle.facts
    roles, basis = weight_bytes_by_role(handle)
    r1 = results.get("R1")
    s = 0.0
    sparse_basis = "no exact zeros measured: nothing skipped"
    if r1 is not None and r1.metric("mean_exact_zero_fraction") is not None:
        s = float(r1.metric("mean_exact_zero_fraction").value)  # type: ignore[arg-type, union-attr]
        sparse_basis = f"measured exact-zero fraction s = {s:.4f}"
    r3 = results.get("R3")
    alias_ratio = 0.0
    if r3 is not None and r3.metric("aliasing_ratio") is not None:
        alias_ratio = float(r3.metric("aliasing_ratio").value or 0.0)  # type: ignore[union-attr]

    def g(k: str) -> float:
        return roles.get(k, 0.0)

    def site(name: str) -> float:  # a cut input site's measured zeros (R1's run), 0 where not cut
        m = r1.metric(f"{name}_exact_zero_fraction") if r1 is not None else None
        return float(m.value) if m is not None and m.value is not None else 0.0  # type: ignore[arg-type]

    # a file cut at the down projection's input (aios-convert sparsify's down_in site) has zeros
    # after the up projection: only its down rows are skipped
    sparse_roles = ["ffn_down"] + (["ffn_up"] if f.gated_ffn and f.ffn_threshold_site != "down_in" else [])
    keep = {r: (1 - s) if r in sparse_roles else 1.0 for r in ROLES}
    s_in = {x: site(x) for x in ("attn_in", "attn_out", "ffn_in")}
    for role, x in (("attn_in", "attn_in"), ("attn_out", "attn_out"), ("ffn_gate", "ffn_in"), ("ffn_up", "ffn_in")):
        if role not in sparse_roles:
            keep[role] = 1 - s_in[x]
    if any(s_in.values()):
        sparse_basis += "; input sites " + ", ".join(f"{x} {v:.4f}" for x, v in s_in.items())
    ffn_base = sum(g(r) for r in ("ffn_up", "ffn_gate", "ffn_down"))
    ffn_proj = sum((g(r) - g(f"alias_saved:{r}")) * keep[r] for r in ("ffn_up", "ffn_gate", "ffn_down"))
    attn_base = g("attn_in") + g("attn_out")
    attn_proj = sum((g(r) - g(f"alias_saved:{r}")) * keep[r] for r in ("attn_in", "attn_out"))
    ffn_basis = sparse_basis
    if any(k.startswith("alias_saved:") for k in roles):
        ffn_basis += "; aliased members at their stored share (canonical / k + delta)"
    core_base = g("core_shareable")
    core_sparse = sum(g(f"core:{r}") * keep[r] for r in ROLES)
    core_proj = core_sparse * (1 - alias_ratio)
    kv = kv_bytes(f.n_layers, f.n_kv_heads, f.head_dim, context)
    _, act = footprint(f.d_model, f.d_ffn, f.gated_ffn)
    spill = 0.0 if results.get("R4") and results["R4"].status == Status.passed else act * f.n_layers
    terms = [
        ProjectionTerm(term="weights: embedding row + head + attention/norms",
                       baseline_bytes=g("embedding_row") + g("head") + g("other"),
                       projected_bytes=g("embedding_row") + g("head") + g("other") - g("alias_saved:other"),
                       basis=basis),
        ProjectionTerm(term="weights: attention projections outside core zone", baseline_bytes=attn_base,
                       projected_bytes=attn_proj, basis=sparse_basis),
        ProjectionTerm(term="weights: FFN outside core zone", baseline_bytes=ffn_base,
                       projected_bytes=ffn_proj, basis=ffn_basis),
        ProjectionTerm(term="weights: core zone", baseline_bytes=core_base, projected_bytes=core_proj,
                       basis=f"{sparse_basis}; aliasing ratio {alias_ratio:.3f}"),
        ProjectionTerm(term="KV cache reads", baseline_bytes=kv, projected_bytes=kv,
                       basis=f"L × H_kv × d_head × C × 4 at C = {context}"),
        ProjectionTerm(term="activation spill", baseline_bytes=spill, projected_bytes=spill,
                       basis="0 when R4's footprint fits L2, else footprint × L"),
    ]
    base = sum(t.baseline_bytes for t in terms)
    proj = sum(t.projected_bytes for t in terms)
    spec_range = next((t["spec_projected_reduction"] for t in tiers() if t["id"] == tier), None)
    return Projection(
        context=context,
        formula=(__doc__ or "").split("\n\n", 2)[2].strip() if __doc__ else "",
        terms=terms,
        baseline_mb_per_token=round(base / 1e6, 4),
        projected_mb_per_token=round(proj / 1e6, 4),
        projected_reduction=round(1 - proj / base, 4) if base else 0.0,
        spec_projected_reduction=spec_range,
        note="Projection from this model's bytes and measured sparsity/aliasing; the contract's own "
             "per-tier claim is shown beside it. Neither is a measurement: run `aios-run bench`.",
    )
