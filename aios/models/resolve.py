"""Resolve a MODEL argument to a :class:`ModelHandle` — the one entry point for every command.

Order (docs/design.md, "MODEL resolution"): a local path (HF folder or ``.gguf`` file) ->
a hub id present in the local Hugging Face cache -> a built-in alias (which may itself be
cached or bundled).
Nothing is downloaded here; ``aios-contract fetch`` does that explicitly.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from aios.errors import InvalidModelError, ModelNotFoundError, UsageError
from aios.models import architectures
from aios.models.aliases import ALIASES, Alias, find_alias
from aios.models.facts import ArchFacts, facts_from_hf_config
from aios.models.handle import ModelHandle
from aios.models.hub import find_in_cache, hub_cache_dir, looks_like_hub_id
from aios.models.tensors import GGUFStore, PickleStore, SafetensorsStore

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


def resolve_model(spec: str, *, allow_pickle: bool = False) -> ModelHandle:
    """Turn what the user typed into a handle, or raise one clear :class:`AiosError`.

    Pickled PyTorch weights are refused unless ``allow_pickle`` (the ``--allow-pickle``
    option); even then they are read with ``torch.load(weights_only=True)``, which refuses
    any pickle that would call code (:class:`aios.models.tensors.PickleStore`).
    """
    spec = str(spec).strip()
    if not spec:
        # an unset CI variable (`check $MODEL`) must not silently check something else: usage, exit 2
        raise UsageError("MODEL is empty; pass a folder, a .gguf file, a hub id or an alias "
                         "(the bundled model by its name: tiny-falcon).")
    path = Path(spec).expanduser()
    if path.exists():
        return _from_path(spec, path, allow_pickle=allow_pickle)
    if _looks_like_path(spec):
        raise ModelNotFoundError(f"No such file or folder: {spec}.")
    if looks_like_hub_id(spec):
        cached = find_in_cache(spec)
        if cached is not None:
            handle = _from_path(spec, cached, kind="hub-cache")
            handle.hub_id = spec
            return handle
    alias = find_alias(spec)
    if alias is not None:
        return _from_alias(spec, alias)
    names = ", ".join(a.name for a in ALIASES)
    if looks_like_hub_id(spec):
        raise ModelNotFoundError(
            f"'{spec}' is not in the local Hugging Face cache ({hub_cache_dir()}); run "
            f"`aios-contract fetch {spec}` to download it, or pass a local folder."
        )
    raise ModelNotFoundError(
        f"'{spec}' is not a file, a folder, a hub id (org/name) or a built-in alias ({names})."
    )


def _looks_like_path(spec: str) -> bool:
    return spec.startswith((".", "/", "~")) or spec.endswith((".gguf", ".safetensors", ".json"))


def _from_path(spec: str, path: Path, kind: str = "hf-folder", allow_pickle: bool = False) -> ModelHandle:
    if path.is_file():
        if path.suffix == ".gguf":
            return _from_gguf(spec, path)
        if path.suffix == ".safetensors" or path.name == "config.json":
            return _from_folder(spec, path.parent, kind)
        if path.suffix in PICKLE_SUFFIXES:
            if allow_pickle and (path.parent / "config.json").is_file():
                return _from_folder(spec, path.parent, kind, allow_pickle)
            raise InvalidModelError(_pickle_refusal(path))
        raise InvalidModelError(
            f"{path} is neither a .gguf file nor a model folder; pass the folder holding "
            "config.json and *.safetensors, or a .gguf file."
        )
    return _from_folder(spec, path, kind, allow_pickle)


def _pickle_refusal(where: Path) -> str:
    return (
        f"{where} holds only pickled PyTorch weights, which can execute code when loaded; "
        "convert them to safetensors first (e.g. with transformers' save_pretrained), or pass "
        "--allow-pickle to read plain tensors with torch's weights-only loader."
    )


def _read_config(folder: Path) -> dict[str, Any]:
    cfg_path = folder / "config.json"
    try:
        config = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError) as e:  # RecursionError: deep nesting
        raise InvalidModelError(f"{cfg_path} is not valid JSON ({e}); fix or re-download it.") from None
    if not isinstance(config, dict):
        raise InvalidModelError(f"{cfg_path} does not hold a JSON object.")
    return config


def _from_folder(spec: str, folder: Path, kind: str, allow_pickle: bool = False) -> ModelHandle:
    ggufs = sorted(folder.glob("*.gguf"))
    if not (folder / "config.json").is_file():
        if len(ggufs) == 1:
            return _from_gguf(spec, ggufs[0])
        raise InvalidModelError(
            f"{folder} is not a model folder: it has no config.json"
            + (f" and {len(ggufs)} .gguf files (pass one of them)." if ggufs else ".")
        )
    config = _read_config(folder)
    arch = architectures.for_hf_config(config)
    facts = facts_from_hf_config(arch, config)
    has_st = any(folder.glob("*.safetensors")) or (folder / "model.safetensors.index.json").exists()
    if not has_st:
        if any(p.suffix in PICKLE_SUFFIXES for p in folder.iterdir()):
            if not allow_pickle:
                raise InvalidModelError(_pickle_refusal(folder))
            store = PickleStore(folder)  # torch.load(weights_only=True): refuses code
            handle = ModelHandle(spec, kind, arch, facts, config, path=folder, store=store)  # type: ignore[arg-type]
            handle.notes.append("Weights read from pickle files with torch's weights-only loader (--allow-pickle).")
            return handle
        raise InvalidModelError(
            f"{folder} has a config.json but no .safetensors weights; the download is "
            "incomplete or the weights were never saved."
        )
    store = SafetensorsStore(folder)
    _ = store.inventory  # validate every header now: bad files fail at resolution time
    return ModelHandle(spec, kind, arch, facts, config, path=folder, store=store)  # type: ignore[arg-type]


def _from_alias(spec: str, alias: Alias) -> ModelHandle:
    if alias.local_path is not None:
        if not alias.local_path.is_dir():
            raise ModelNotFoundError(
                f"The bundled model '{alias.name}' is missing from {alias.local_path}; "
                "reinstall the package or run `python -m aios.fixtures.train`."
            )
        handle = _from_folder(spec, alias.local_path, "alias")
        handle.notes.append(alias.note)
        return handle
    assert alias.hub_id is not None
    cached = find_in_cache(alias.hub_id)
    if cached is not None:
        handle = _from_path(spec, cached, kind="hub-cache")
        handle.hub_id = alias.hub_id
        return handle
    arch = architectures.for_hf_config(alias.config)
    facts = facts_from_hf_config(arch, alias.config)
    handle = ModelHandle(spec, "alias", arch, facts, dict(alias.config), hub_id=alias.hub_id)
    handle.notes.append(
        f"Built-in facts for {alias.hub_id} (published config); weights not on this machine."
    )
    if alias.note:
        handle.notes.append(alias.note)
    return handle


def _from_gguf(spec: str, path: Path) -> ModelHandle:
    store = GGUFStore(path)
    gguf_arch = store.field("general.architecture")
    if not isinstance(gguf_arch, str):
        raise InvalidModelError(f"{path} has no general.architecture key; it is not a model GGUF.")
    names = set(store.iter_names())
    arch = architectures.for_gguf_arch(gguf_arch, has_attn_norm_2="blk.0.attn_norm_2.weight" in names)
    facts, config = _facts_from_gguf(store, arch, gguf_arch)
    handle = ModelHandle(spec, "gguf", arch, facts, config, path=path, store=store)
    runs = handle.llama_cpp_activation
    if (runs and facts.activation_key == "aios.ffn_activation"
            and architectures.activation_family(facts.activation) != architectures.activation_family(runs)):
        handle.notes.append(
            f"Declared FFN activation '{facts.activation}' differs from what llama.cpp runs for "
            f"'{gguf_arch}' ('{runs}'); llama.cpp would execute this model incorrectly."
        )
    return handle


def _facts_from_gguf(store: GGUFStore, arch, g: str) -> tuple[ArchFacts, dict[str, Any]]:
    def need(key: str) -> int:
        v = store.field(f"{g}.{key}")
        if not isinstance(v, int) or v <= 0:
            raise InvalidModelError(f"{store.path} lacks a valid '{g}.{key}' key.")
        return v

    n_layers = need("block_count")
    d_model = need("embedding_length")
    n_heads = need("attention.head_count")
    kv = store.field(f"{g}.attention.head_count_kv")
    n_kv = int(kv) if isinstance(kv, int) and kv > 0 else n_heads
    declared = store.field("aios.ffn_activation")
    act = declared if isinstance(declared, str) else arch.llama_cpp_ffn_activation
    key_dim = store.field(f"{g}.attention.key_length")
    vocab = store.field(f"{g}.vocab_size")
    if not isinstance(vocab, int):
        tok = store.reader.get_field("tokenizer.ggml.tokens")
        vocab = len(tok.data) if tok is not None else None
    threshold = store.field("aios.ffn_activation_threshold")
    facts = ArchFacts(
        architecture=arch.name,
        model_type=g,
        n_layers=n_layers,
        d_model=d_model,
        n_heads=n_heads,
        n_kv_heads=n_kv,
        head_dim=int(key_dim) if isinstance(key_dim, int) and key_dim > 0 else d_model // n_heads,
        d_ffn=need("feed_forward_length"),
        activation=str(act or arch.default_activation),
        activation_key="aios.ffn_activation" if isinstance(declared, str) else f"llama.cpp default for {g}",
        activation_threshold=float(threshold) if isinstance(threshold, (int, float)) else None,
        gated_ffn=arch.gated_ffn,
        parallel_attn=arch.parallel_attn_default,
        vocab_size=vocab,
        max_context=store.field(f"{g}.context_length"),
        tied_embeddings="output.weight" not in set(store.iter_names()),
        ffn_threshold_site=_threshold_site(store),
    )
    return facts, {"gguf_architecture": g, **{k: v for k, v in facts.__dict__.items()}}


def _threshold_site(store: GGUFStore) -> str | None:
    """``aios.ffn_threshold.site`` of a sparsified GGUF (runtime/thresholds.py), None without one."""
    site = store.field("aios.ffn_threshold.site")
    return site if isinstance(site, str) else None
