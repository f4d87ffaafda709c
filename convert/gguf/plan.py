"""Step 1 of the GGUF spine: the plan — every tensor a GGUF will hold, from file headers only.

A plan is a list of :class:`PlannedTensor` (GGUF name, shape, output type, byte size, where
the data comes from) plus what the file declares (metadata, tokenizer). Exporters that add,
drop or replace tensors — alias canonical/delta members, svd-residual factors, sparsity masks —
transform a plan made by :func:`plan_tensors` instead of reimplementing it, so every GGUF we
write names, types and orders its standard tensors the same way.

A tensor's data is either read from the source model (``source`` names the HF tensor, and
``rule`` the llama.cpp layout applied to it: see :mod:`convert.gguf.tensors`) and encoded to
``outtype`` as it is written, or produced by ``data`` (a callable returning an array or an
object with ``nbytes``/``tofile``) for tensors an exporter computes itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import numpy as np

from aios.errors import InvalidModelError, UnsupportedArchitectureError
from aios.models import ModelHandle
from aios.models.architectures import exportable_model_types
from convert.gguf import sparsity
from convert.gguf import tensors as gt

# HF buffers that are not weights
SKIP = re.compile(r"(rotary_emb\.inv_freq|\.attn\.bias|\.attn\.masked_bias)$")


@dataclass(frozen=True)
class GGUFExportConfig:
    """Converter config, embedded in every artifact (``aios.provenance``)."""

    outtype: str = "f16"
    sparsity_map: str | None = None  # file name only in provenance (paths are machine-specific)
    version: int = 1
    # store each FFN down projection neuron-major (blk.N.ffn_down.t) instead of ffn_down.weight,
    # so exact-sparse runs read only the rows of firing neurons in any type (aios-run only)
    sparse_down: bool = False
    # a GGUF whose per-tensor types the export copies (``--like``: a Q4_K_M user gets the same
    # mix back); file name only in provenance. ``outtype`` then types the tensors it lacks.
    like: str | None = None


@dataclass
class PlannedTensor:
    name: str  # GGUF name
    source: str | None  # HF tensor name (None for tensors an exporter creates, e.g. ffn_active)
    shape: tuple[int, ...]  # numpy order, after the layout rule
    source_dtype: str
    outtype: str  # one of gt.OUTTYPES
    nbytes: int
    rule: str | None = None  # layout rule applied to the source (see convert.gguf.tensors)
    fallback: str | None = None  # why outtype differs from the requested type
    # the data, when it does not come from ``source``: () -> array or EncodedTensor-like
    data: Callable[[], Any] | None = field(default=None, repr=False, compare=False)


@dataclass
class ExportPlan:
    """A GGUF about to be written: the source model, the requested type, tensors, metadata."""

    handle: ModelHandle
    outtype: str  # the requested type (llama.cpp's general.file_type follows it)
    tensors: list[PlannedTensor]
    file_type: int | None = None  # general.file_type when not ``outtype``'s (``--like``: the source's)
    metadata: dict[str, object] = field(default_factory=dict)  # the aios.* keys
    tokenizer: Any = None  # convert.gguf.tokenizer.TokenizerMeta or None

    @property
    def fallbacks(self) -> list[str]:
        return fallback_lines(self.tensors)

    @property
    def total_bytes(self) -> int:
        return sum(p.nbytes for p in self.tensors)

    def sort(self) -> None:
        """llama.cpp's order (stable): see :func:`tensor_order`."""
        self.tensors.sort(key=lambda p: tensor_order(p.name))


def fallback_lines(tensors: Iterable[PlannedTensor]) -> list[str]:
    """One ``name: why -> TYPE`` line per tensor whose type differs from the requested one."""
    return [f"{p.name}: {p.fallback} -> {p.outtype.upper()}" for p in tensors if p.fallback]


def fallback_summary(tensors: Iterable[PlannedTensor]) -> list[str]:
    """``fallback_lines`` for a console: a fallback repeated in several blocks (same tensor, reason
    and type) is one line, ``blk.N.ffn_down.weight in blocks 0-31: why -> TYPE`` (a 7B export had
    ~100 lines); the file's metadata keeps one entry per tensor."""
    groups: dict[tuple[str, str, str], list[tuple[int | None, str]]] = {}
    for p in tensors:
        if p.fallback:
            m = re.fullmatch(r"blk\.(\d+)\.(.+)", p.name)
            key = (f"blk.N.{m.group(2)}" if m else p.name, p.fallback, p.outtype.upper())
            groups.setdefault(key, []).append((int(m.group(1)) if m else None, p.name))
    out = []
    for (name, why, kind), members in groups.items():
        if len(members) == 1:
            out.append(f"{members[0][1]}: {why} -> {kind}")
            continue
        layers = sorted(i for i, _ in members if i is not None)
        span = (f"{layers[0]}-{layers[-1]}" if layers == list(range(layers[0], layers[-1] + 1))
                else ", ".join(map(str, layers)))
        out.append(f"{name} in blocks {span}: {why} -> {kind}")
    return out


def check_exportable(handle: ModelHandle) -> None:
    """Refuse, in one sentence, a model the GGUF export cannot write correctly."""
    if handle.kind == "gguf" or handle.path is None or not handle.has_weights:
        raise InvalidModelError(
            f"'{handle.spec}' is not an HF model folder with weights; GGUF export reads config.json "
            "and safetensors (pass the folder, or fetch the model first)."
        )
    if handle.config.get("model_type") not in handle.arch.export_model_types:
        names = exportable_model_types()
        raise UnsupportedArchitectureError(
            f"GGUF export supports {', '.join(names[:-1])} and {names[-1]}; "
            f"'{handle.config.get('model_type')}' is not one of them."
        )
    rope = rope_parameters(handle.config)
    if rope.get("rope_type", rope.get("type", "default")) not in handle.arch.rope_scaling_types:
        raise UnsupportedArchitectureError(
            f"RoPE scaling '{rope.get('rope_type', rope.get('type'))}' is not supported by the GGUF export yet."
        )
    if handle.config.get("alibi"):
        raise UnsupportedArchitectureError("Falcon with ALiBi positions is not supported by llama.cpp's falcon graph.")


def gguf_name_map(handle: ModelHandle):
    """gguf-py's HF -> GGUF tensor name map for the handle's architecture and depth."""
    import gguf

    return gguf.get_tensor_name_map(gguf.MODEL_ARCH[handle.arch.gguf_arch], handle.facts.n_layers)


def gguf_name(tmap, hf_name: str, arch_label: str) -> str:
    name = tmap.get_name(hf_name, try_suffixes=(".weight", ".bias"))
    if name is None:
        raise UnsupportedArchitectureError(
            f"Tensor '{hf_name}' has no GGUF name for {arch_label}; "
            "this model variant is not supported by the GGUF export."
        )
    return name


def plan_tensor(handle: ModelHandle, gname: str, source: str, outtype: str, *,
                rule: str | None = None, force_type: str | None = None) -> PlannedTensor:
    """One tensor read from ``source``: laid out by ``rule``, typed by the fallback rules
    (or exactly ``force_type``)."""
    info = handle.store.inventory[source]  # type: ignore[union-attr]
    shape = tuple(reversed(info.shape)) if rule == "transpose" else tuple(info.shape)
    typ, why = (force_type, None) if force_type else gt.choose_type(shape, outtype)
    return PlannedTensor(gname, source, shape, info.dtype, typ, gt.encoded_nbytes(shape, typ), rule, why)


def plan_tensors(handle: ModelHandle, outtype: str, masks: dict[int, np.ndarray] | None = None, *,
                 exclude: Iterable[str] = (),
                 like: dict[str, tuple[str, str | None]] | None = None) -> list[PlannedTensor]:
    """Every standard tensor (HF tensors in ``exclude`` left out) and the sparsity masks, in
    llama.cpp's order, from safetensors headers only. ``like`` (``gt.like_types``): the type of
    each named tensor (its blocks permitting), ``outtype`` for the others."""
    arch = handle.arch
    tmap = gguf_name_map(handle)
    skip = set(exclude)
    plan: list[PlannedTensor] = []
    for info in handle.tensor_inventory():
        if SKIP.search(info.name) or info.name in skip:
            continue
        name = gguf_name(tmap, info.name, arch.gguf_arch.lower())
        if info.dtype not in ("F32", "F16", "BF16"):
            raise InvalidModelError(f"Tensor '{info.name}' is {info.dtype}; export reads F32/F16/BF16 weights.")
        p = plan_tensor(handle, name, info.name, outtype, rule=arch.layout_rule(info.name))
        if like and name in like and len(p.shape) > 1:
            want, why = like[name]
            typ, fits = gt.choose_type(p.shape, want)
            p = plan_tensor(handle, name, info.name, outtype, rule=p.rule, force_type=typ)
            p.fallback = fits or why
        plan.append(p)
    for kind in arch.generated_tensors:
        plan.extend(GENERATED_TENSORS[kind](handle))
    for i, m in (masks or {}).items():
        data = sparsity.mask_tensor(m)
        plan.append(PlannedTensor(sparsity.TENSOR_NAME.format(i=i), None, m.shape, "BOOL", "f32", 4 * m.size,
                                  data=_rows_of(data, m.shape)))
    names = [p.name for p in plan]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise InvalidModelError(f"Two source tensors map to GGUF tensor '{dup}'.")
    return sorted(plan, key=lambda p: tensor_order(p.name))


def rope_parameters(config: dict, layer_type: str = "full_attention") -> dict:
    """The RoPE dict of an HF config: ``rope_scaling`` (transformers 4) or ``rope_parameters``
    (transformers 5, which also holds ``rope_theta``, per layer type for models with local and
    global layers: Gemma 3); empty when neither is set."""
    rope = config.get("rope_scaling") or config.get("rope_parameters") or {}
    return rope.get(layer_type, rope) if isinstance(rope.get(layer_type), dict) else rope


def llama3_rope_factors(config: dict, head_dim: int) -> np.ndarray | None:
    """Llama 3.1's per-frequency RoPE divisors (llama.cpp's ``rope_freqs`` tensor), or None
    when the config has no ``llama3`` scaling.

    Frequencies whose wavelength is shorter than ``original_max_position_embeddings /
    high_freq_factor`` keep their value (divisor 1), longer than ``... / low_freq_factor`` are
    divided by ``factor``, and those between are interpolated smoothly (Meta's published
    formula, the one transformers' ``rope_type="llama3"`` applies to its inverse frequencies).
    """
    rope = rope_parameters(config)
    if rope.get("rope_type", rope.get("type")) != "llama3":
        return None
    base = float(rope.get("rope_theta", config.get("rope_theta", 10000.0)))
    factor = float(rope.get("factor", 8.0))
    low, high = float(rope.get("low_freq_factor", 1.0)), float(rope.get("high_freq_factor", 4.0))
    old_ctx = float(rope.get("original_max_position_embeddings", 8192))
    inv_freq = base ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    wavelen = 2 * np.pi / inv_freq
    with np.errstate(divide="ignore", invalid="ignore"):  # high == low: no band in between
        smooth = (old_ctx / wavelen - low) / (high - low)
        mid = 1 / ((1 - smooth) / factor + smooth)
    out = np.where(wavelen < old_ctx / high, 1.0, np.where(wavelen > old_ctx / low, factor, mid))
    return out.astype(np.float32)


def _rope_freqs(handle: ModelHandle) -> list[PlannedTensor]:
    factors = llama3_rope_factors(handle.config, handle.facts.head_dim)
    if factors is None:
        return []
    return [PlannedTensor("rope_freqs.weight", None, factors.shape, "F32", "f32", factors.nbytes,
                          data=lambda: factors)]


# Tensors an export computes from the config, by the name rows use in ``generated_tensors``.
GENERATED_TENSORS: dict[str, Callable[[ModelHandle], list[PlannedTensor]]] = {
    "rope_freqs": _rope_freqs,
}


SPARSE_DOWN = "{base}.t"  # the neuron-major down projection, named after the tensor it replaces


def neuron_major_down(handle: ModelHandle, tensors: list[PlannedTensor], outtype: str,
                      keep_types: bool = False) -> list[PlannedTensor]:
    """``tensors`` with every ``blk.N.ffn_down.weight`` (d_model rows of d_ffn) replaced by
    ``blk.N.ffn_down.t`` (d_ffn rows of d_model): one neuron's output weights are one row,
    quantized along d_model, so a skipped neuron's bytes are never read. Types follow the
    same fallback rules as every other tensor (the row length is now d_model); ``keep_types``
    (``--like``): each takes the type planned for the tensor it replaces, not ``outtype``."""
    out = []
    for p in tensors:
        if p.source is None or not re.fullmatch(r"blk\.\d+\.ffn_down\.weight", p.name) or p.rule is not None:
            out.append(p)
            continue
        t = plan_tensor(handle, SPARSE_DOWN.format(base=p.name.removesuffix(".weight")), p.source,
                        p.outtype if keep_types else outtype, rule="transpose")
        out.append(t)
    return sorted(out, key=lambda p: tensor_order(p.name))


def _rows_of(data: np.ndarray, shape: tuple[int, ...]):
    return lambda: gt.EncodedTensor(lambda a, b: data, shape, "f32", 4 * data.size)


def tensor_order(name: str) -> tuple:
    """Sort key of llama.cpp's order: token/position embeddings, then blocks in order (by
    name within a block), then the output norm and head."""
    m = re.match(r"blk\.(\d+)\.", name)
    if m:
        return (1, int(m.group(1)), name)
    return (0 if name.startswith(("token_embd", "position_embd")) else 2, 0, name)
