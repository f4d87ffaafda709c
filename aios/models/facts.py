"""Architecture facts of one model, derived from its config through its architecture row."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Mapping

from aios.errors import InvalidModelError
from aios.models import ffn_cut
from aios.models.architectures import Architecture


@dataclass(frozen=True)
class ArchFacts:
    architecture: str  # row name
    model_type: str
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_ffn: int
    activation: str  # FFN activation as the config (or GGUF metadata) names it
    activation_key: str  # where it was read from (config key or GGUF key)
    activation_threshold: float | None  # for thresholded ReLU (fatrelu)
    gated_ffn: bool
    parallel_attn: bool
    vocab_size: int | None
    max_context: int | None
    tied_embeddings: bool
    # calibrated per-layer FFN thresholds (aios-convert sparsify, GGUF aios.ffn_threshold.site;
    # an HF folder's config.json aios_ffn_threshold, aios/models/ffn_cut.py): where the cut is
    # made ("gate" or "down_in"), None when the model has none
    ffn_threshold_site: str | None = None

    @property
    def attention_kind(self) -> str:
        if self.n_kv_heads == 1:
            return "MQA"
        if self.n_kv_heads < self.n_heads:
            return "GQA"
        return "MHA"

    @property
    def core_zone(self) -> range:
        """Core-zone layer indices ⌊0.4L⌋ … ⌊0.6L⌋ inclusive (docs/design.md, "The contract", R3)."""
        return range(int(0.4 * self.n_layers), int(0.6 * self.n_layers) + 1)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["attention_kind"] = self.attention_kind
        d["core_zone"] = [self.core_zone.start, self.core_zone.stop - 1]
        return d


def _first(config: Mapping[str, Any], keys: tuple[str, ...]) -> tuple[str | None, Any]:
    for k in keys:
        if config.get(k) is not None:
            return k, config[k]
    return None, None


def _int(config: Mapping[str, Any], keys: tuple[str, ...], what: str) -> int:
    key, value = _first(config, keys)
    if key is None:
        raise InvalidModelError(
            f"config.json lacks the {what} ({' or '.join(keys)}); the model config is incomplete."
        )
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise InvalidModelError(f"config.json has an invalid {what}: {key}={value!r}.")
    return value


def facts_from_hf_config(arch: Architecture, config: Mapping[str, Any]) -> ArchFacts:
    """Derive the facts exactly as the HF modelling code does for this architecture."""
    n_layers = _int(config, arch.n_layers_keys, "number of layers")
    d_model = _int(config, arch.d_model_keys, "hidden size")
    n_heads = _int(config, arch.n_heads_keys, "number of attention heads")
    if arch.d_ffn_keys and _first(config, arch.d_ffn_keys)[0] is not None:
        d_ffn = _int(config, arch.d_ffn_keys, "FFN size")
    else:
        d_ffn = arch.d_ffn_default_mult * d_model
    if arch.mqa_flag_key and config.get(arch.mqa_flag_key, False):
        n_kv = 1
    elif _first(config, arch.kv_heads_keys)[0] is not None:
        n_kv = _int(config, arch.kv_heads_keys, "number of KV heads")
    else:
        n_kv = n_heads
    if _first(config, arch.head_dim_keys)[0] is not None:
        head_dim = _int(config, arch.head_dim_keys, "head dimension")
    else:
        head_dim = d_model // n_heads
    act_key, act = _first(config, arch.activation_keys)
    if act_key is None:
        act_key, act = f"{arch.activation_keys[0]} (default)", arch.default_activation
    threshold = config.get("hidden_act_param") if str(act).lower() == "fatrelu" else None
    parallel = (
        bool(config.get(arch.parallel_attn_key, arch.parallel_attn_default))
        if arch.parallel_attn_key
        else arch.parallel_attn_default
    )
    _, vocab = _first(config, ("vocab_size",))
    _, ctx = _first(config, arch.context_keys)
    return ArchFacts(
        architecture=arch.name,
        model_type=str(config.get("model_type")),
        n_layers=n_layers,
        d_model=d_model,
        n_heads=n_heads,
        n_kv_heads=n_kv,
        head_dim=head_dim,
        d_ffn=d_ffn,
        activation=str(act),
        activation_key=act_key,
        activation_threshold=float(threshold) if threshold is not None else None,
        gated_ffn=arch.gated_ffn,
        parallel_attn=parallel,
        vocab_size=vocab,
        max_context=ctx,
        tied_embeddings=bool(config.get(arch.tied_key, arch.tied_default)),
        ffn_threshold_site=ffn_cut.SITE if ffn_cut.from_config(config, n_layers) is not None else None,
    )
