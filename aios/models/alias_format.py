"""The canonical + delta (R3 alias) format: names, metadata, the aliasing ratio, materialization.

One module shared by the converter (``convert/alias/posthoc.py``), the checker
(``contract/checks/r3_aliasing.py``), the GGUF writer and the torch loader, so they all
read the same structure and compute the aliasing ratio the same way.

Storage (HF folder and GGUF alike; names below in HF form, GGUF uses llama.cpp names):

* The canonical ``W_c`` of a group is stored **once**, as ``<anchor>.<matrix>.canonical``
  where the anchor is the group's first member (e.g. ``transformer.h.0.mlp.dense_h_to_4h
  .canonical``, GGUF ``blk.0.ffn_up.canonical``). The members' own ``.weight`` tensors are
  removed — safetensors refuses shared storage, so, as its own convention does for tied
  tensors, the duplicates are dropped and recorded in the metadata.
* Member ``i``'s delta ``δ_i`` is named after the tensor it extends (docs/design.md, "GGUF extensions"):
  ``dense``   ``<member>.delta``                        (same type as the canonical)
  ``lowrank`` ``<member>.delta.lr_u`` (n_out, R) and ``<member>.delta.lr_v`` (R, n_in),
              δ = lr_u @ lr_v
  ``q8_0``    GGUF: ``<member>.delta`` of type Q8_0; safetensors has no Q8_0, so
              ``<member>.delta.q8`` (I8, n_out × n_in) + ``<member>.delta.q8_scale``
              (F16, n_out × n_in/32): exactly the bytes of GGUF's Q8_0 blocks
  ``none``    no tensor: ``W_i = W_c``
* The group records live in one JSON string: safetensors ``__metadata__["aios.alias"]`` or
  GGUF key ``aios.alias.groups``; each is ``{"type": <HF relative name>, "canonical": name,
  "canonical_init": "mean"|"medoid", "members": [{"layer": i, "weight": removed name,
  "delta": {"encoding": ..., "tensors": [...], "rank": R}}]}``.

Aliasing ratio (the R3 metric, defined here once)::

    ratio = Σ_{core members m} (B_m − C_g/k_g − D_m)  /  Σ_{core layers l, shareable t} B_{l,t}

``B`` is the bytes the member's matrix would take stored on its own (= the canonical's
bytes: same shape and type), ``C_g`` the canonical's bytes, charged **pro rata** to the
``k_g`` members of its group (members outside the core zone carry their share too, so a
canonical shared with the whole depth costs the core zone only its share), ``D_m`` the
stored bytes of the member's delta. The denominator is every shareable matrix of the core
layers (for falcon and llama that is every 2-D weight of a block), aliased or not. The same
formula over all layers gives the model-wide ratio, reported beside it so a layout that
saves in the core zone by spending elsewhere shows up.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import numpy as np

from aios import quant
from aios.errors import InvalidModelError

HF_METADATA_KEY = "aios.alias"
GGUF_GROUPS_KEY = "aios.alias.groups"
SIDECAR = "aios_alias.json"  # converter report + provenance in an aliased HF folder
ENCODINGS = ("dense", "lowrank", "q8_0", "none")
QK = quant.block_size("q8_0")  # q8_0 deltas use ggml's Q8_0 blocks (fp16 scale + QK int8)


@dataclass(frozen=True)
class Member:
    layer: int
    weight: str  # the removed tensor name W_i would have
    encoding: str
    tensors: tuple[str, ...] = ()  # stored delta tensors (see module docstring)
    rank: int | None = None


@dataclass(frozen=True)
class Group:
    type: str  # HF relative matrix name, e.g. "mlp.dense_h_to_4h.weight"
    canonical: str
    members: tuple[Member, ...]
    canonical_init: str = "mean"

    def to_json(self) -> dict[str, Any]:
        return {"type": self.type, "canonical": self.canonical, "canonical_init": self.canonical_init,
                "members": [{"layer": m.layer, "weight": m.weight,
                             "delta": {"encoding": m.encoding, "tensors": list(m.tensors),
                                       **({"rank": m.rank} if m.rank else {})}} for m in self.members]}


def dumps(groups: Iterable[Group]) -> str:
    return json.dumps([g.to_json() for g in groups], sort_keys=True, separators=(",", ":"))


def loads(text: str, where: str) -> list[Group]:
    """Parse the group records; malformed records are one clear error naming ``where``."""
    try:
        raw = json.loads(text)
        groups = []
        for g in raw:
            members = []
            for m in g["members"]:
                d = m["delta"]
                if d["encoding"] not in ENCODINGS:
                    raise ValueError(f"unknown delta encoding {d['encoding']!r}")
                members.append(Member(int(m["layer"]), str(m["weight"]), str(d["encoding"]),
                                      tuple(str(t) for t in d.get("tensors", ())), d.get("rank")))
            if not members:
                raise ValueError("a group without members")
            groups.append(Group(str(g["type"]), str(g["canonical"]), tuple(members),
                                str(g.get("canonical_init", "mean"))))
        return groups
    except (ValueError, KeyError, TypeError, RecursionError) as e:  # RecursionError: hostile nesting
        raise InvalidModelError(f"{where} has an invalid alias record ({e}); re-run aios-convert alias.") from e


def delta_names(weight: str, encoding: str) -> tuple[str, ...]:
    """Stored delta tensor names for a member whose own tensor would be ``weight``."""
    base = weight[: -len(".weight")] if weight.endswith(".weight") else weight
    return {"dense": (f"{base}.delta",), "lowrank": (f"{base}.delta.lr_u", f"{base}.delta.lr_v"),
            "q8_0": (f"{base}.delta.q8", f"{base}.delta.q8_scale"), "none": ()}[encoding]


def canonical_name(anchor_weight: str) -> str:
    base = anchor_weight[: -len(".weight")] if anchor_weight.endswith(".weight") else anchor_weight
    return f"{base}.canonical"


def groups_of(handle) -> list[Group]:
    """Alias groups stored in a model (HF folder or GGUF); [] for ordinary checkpoints."""
    store = handle.store
    if store is None:
        return []
    if handle.kind == "gguf":
        text = store.field(GGUF_GROUPS_KEY)
    else:
        text = None
        for meta in store.shard_metadata():
            text = meta.get(HF_METADATA_KEY) or text
    return loads(text, str(handle.path)) if text else []


# --- aliasing ratio --------------------------------------------------------------------------


@dataclass
class RatioReport:
    core_ratio: float
    model_ratio: float
    core_bytes: int  # denominator: shareable matrices of the core layers, stored independently
    core_saved: int
    model_bytes: int
    model_saved: int
    per_member: list[dict] = field(default_factory=list)  # layer, type, B, canonical share, D, saved

    def to_dict(self) -> dict[str, Any]:
        return {"core_aliasing_ratio": round(self.core_ratio, 6), "model_aliasing_ratio": round(self.model_ratio, 6),
                "core_bytes": self.core_bytes, "core_bytes_saved": self.core_saved,
                "model_bytes": self.model_bytes, "model_bytes_saved": self.model_saved,
                "definition": RATIO_DEFINITION, "per_member": self.per_member}


RATIO_DEFINITION = ("Σ_core members (B − C/k − D) / Σ_core layers, shareable matrices B: B = bytes of the "
                    "matrix stored on its own, C = canonical bytes charged pro rata to the k group members, "
                    "D = stored delta bytes")


def aliasing_ratio(groups: list[Group], nbytes: Callable[[str], int], plain_bytes: Callable[[int, str], int | None],
                   core: Iterable[int], n_layers: int, types: Iterable[str]) -> RatioReport:
    """The aliasing ratio of the module docstring.

    ``nbytes(stored_name)`` gives a stored tensor's bytes; ``plain_bytes(layer, type)`` the
    bytes of an un-aliased matrix (None when the model has no such matrix).
    """
    core = set(core)
    aliased: dict[tuple[int, str], dict] = {}
    for g in groups:
        C, k = nbytes(g.canonical), len(g.members)
        for m in g.members:
            D = sum(nbytes(t) for t in m.tensors)
            aliased[(m.layer, g.type)] = {"layer": m.layer, "type": g.type, "bytes_alone": C,
                                          "canonical_share": C / k, "delta_bytes": D,
                                          "saved": C - C / k - D, "encoding": m.encoding}
    core_b = core_s = model_b = model_s = 0.0
    for layer in range(n_layers):
        for t in types:
            rec = aliased.get((layer, t))
            b = rec["bytes_alone"] if rec else plain_bytes(layer, t)
            if b is None:
                continue
            s = rec["saved"] if rec else 0.0
            model_b, model_s = model_b + b, model_s + s
            if layer in core:
                core_b, core_s = core_b + b, core_s + s
    return RatioReport(core_s / core_b if core_b else 0.0, model_s / model_b if model_b else 0.0,
                       int(core_b), int(round(core_s)), int(model_b), int(round(model_s)),
                       sorted(aliased.values(), key=lambda r: (r["layer"], r["type"])))


def ratio_of(handle, groups: list[Group] | None = None) -> RatioReport:
    """The aliasing ratio of a stored model (HF folder or GGUF), from its own tensor bytes."""
    groups = groups_of(handle) if groups is None else groups
    inv = handle.store.inventory

    def plain(layer: int, t: str) -> int | None:
        name = handle.stored_name(handle.arch.block(layer, t))
        if name is None and t == handle.arch.ffn_down + ".weight" and f"blk.{layer}.ffn_down.t" in inv:
            name = f"blk.{layer}.ffn_down.t"  # a --sparse-down GGUF: the same matrix stored neuron-major
        return inv[name].nbytes if name else None

    return aliasing_ratio(groups, lambda n: inv[n].nbytes, plain, handle.facts.core_zone,
                          handle.facts.n_layers, handle.arch.shareable)


def tensor_getter(handle) -> Callable[[str], np.ndarray]:
    """Read a stored tensor as numpy: float32, except safetensors Q8 quants/scales kept raw."""
    def get(name: str) -> np.ndarray:
        t = handle.tensor(name)
        if isinstance(t, np.ndarray):  # GGUF: dequantized by gguf-py
            return t.astype(np.float32)
        import torch

        return t.numpy() if ".delta.q8" in name and t.dtype in (torch.int8, torch.float16) else t.float().numpy()

    return get


def spectral_norm(x: np.ndarray, exact_limit: int = 4_000_000) -> float:
    """Largest singular value: exact (SVD) up to ``exact_limit`` elements, else 50 power iterations."""
    if x.size <= exact_limit:
        return float(np.linalg.norm(x.astype(np.float64), 2))
    v = np.random.default_rng(0).standard_normal(x.shape[1])
    for _ in range(50):
        v = x.T @ (x @ v)
        v /= np.linalg.norm(v)
    return float(np.linalg.norm(x @ v))


def delta_norms(handle, groups: list[Group]) -> list[dict]:
    """Measured ‖δ_i‖/‖W_c‖ of every member from the stored tensors: Frobenius (the R3 criterion
    as CONTRACT.md states it) and spectral (the contract prose writes ‖·‖₂; shown beside it)."""
    get = tensor_getter(handle)
    out = []
    for g in groups:
        Wc = get(g.canonical)
        cn, cs = float(np.linalg.norm(Wc)), spectral_norm(Wc)
        for m in g.members:
            d = delta_dense(m, get)
            out.append({"type": g.type, "layer": m.layer, "encoding": m.encoding,
                        "rel_delta_norm": round(float(np.linalg.norm(d)) / cn if d is not None else 0.0, 6),
                        "rel_delta_spectral": round(spectral_norm(d) / cs if d is not None else 0.0, 6)})
    return out


# --- materialization -------------------------------------------------------------------------


def q8_dequantize(q: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """int8 (n, m) quants and float16 (n, m/32) scales -> float32 (n, m)."""
    n, m = q.shape
    return (q.reshape(n, m // QK, QK).astype(np.float32) * scale.astype(np.float32)[:, :, None]).reshape(n, m)


def q8_quantize(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float32 (n, m) -> (int8 quants, float16 scales), bit-identical to gguf-py's Q8_0."""
    from gguf import GGMLQuantizationType, quants

    n, m = x.shape
    if m % QK:
        raise InvalidModelError(f"q8_0 deltas need a row length divisible by {QK}; this matrix has {m}.")
    raw = quants.quantize(np.ascontiguousarray(x, np.float32), GGMLQuantizationType.Q8_0)
    blocks = raw.reshape(n, m // QK, 2 + QK)
    scale = np.ascontiguousarray(blocks[:, :, :2]).view(np.float16).reshape(n, m // QK)
    q = np.ascontiguousarray(blocks[:, :, 2:]).view(np.int8).reshape(n, m)
    return q, scale


def delta_dense(member: Member, get: Callable[[str], np.ndarray]) -> np.ndarray | None:
    """δ_i as float32 (None for ``none``); ``get`` reads a stored tensor as float32 numpy."""
    if member.encoding == "none":
        return None
    if member.encoding == "dense":
        return get(member.tensors[0])
    if member.encoding == "lowrank":
        # U·V in float64, then rounded: each product of two float32 values is exact in float64, so
        # the result no longer depends on the BLAS's summation order (an AMD EPYC's OpenBLAS and
        # a Xeon's gave different float32 bits, and so different de-aliased GGUF bytes)
        U, V = get(member.tensors[0]), get(member.tensors[1])
        return (U.astype(np.float64) @ V.astype(np.float64)).astype(np.float32)
    if len(member.tensors) == 1:  # GGUF stores Q8_0 natively; ``get`` dequantizes it
        return get(member.tensors[0])
    return q8_dequantize(get(member.tensors[0]).astype(np.int8), get(member.tensors[1]).astype(np.float16))


def materialized(groups: list[Group], get: Callable[[str], np.ndarray]):
    """Yield (removed weight name, W_i = W_c + δ_i float32) for every member, one at a time."""
    for g in groups:
        Wc = get(g.canonical)
        for m in g.members:
            d = delta_dense(m, get)
            yield m.weight, (Wc + d if d is not None else Wc.copy())


def stored_alias_names(groups: list[Group]) -> set[str]:
    return {g.canonical for g in groups} | {t for g in groups for m in g.members for t in m.tensors}


def load_aliased_torch(handle, dtype=None):
    """An HF folder written by ``aios-convert alias`` as a stock transformers model.

    transformers does not know the alias tensors, so the model is built from its config and
    loaded from a state dict in which every member's ``W_i = W_c + δ_i`` is materialized
    (one float32 copy of the model in memory).
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    groups = groups_of(handle)
    store = handle.store
    alias_names = stored_alias_names(groups)
    get = tensor_getter(handle)

    cfg = AutoConfig.from_pretrained(str(handle.path))
    torch.manual_seed(0)  # the random init is overwritten; seeded only so nothing varies
    model = AutoModelForCausalLM.from_config(cfg)
    want = dtype or torch.float32
    state = {n: store.get(n) for n in store.inventory if n not in alias_names}
    for name, W in materialized(groups, get):
        state[name] = torch.from_numpy(W)
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {"lm_head.weight"} if getattr(cfg, "tie_word_embeddings", False) else set()
    if set(missing) - tied or unexpected:
        raise InvalidModelError(
            f"{handle.path}: the alias tensors do not rebuild the model (missing {sorted(missing)[:3]}, "
            f"unexpected {sorted(unexpected)[:3]}).")
    if tied:
        model.tie_weights()
    return model.to(want).eval()
