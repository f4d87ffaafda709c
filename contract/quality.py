"""The quality gate: held-out perplexity of the checked model against a baseline.

A conversion can satisfy R1–R5 and still ruin the model (a 2-step relufy: perplexity +53 %).
``check --baseline SOURCE`` runs both models on the held-out protocol every converter reports
(``aios.evaluation.pydoc_split``: the fixtures' held-out split of ``pydoc_data.topics``, each
model's own tokenizer; perplexity by ``aios.fixtures.train.heldout_perplexity``, stride-128
windows; a GGUF in the runtime by ``runtime.perplexity``, the same protocol) and the gate fails when perplexity / baseline perplexity > ``max_ratio``.

Without a baseline, artifacts whose provenance recorded perplexities (relufy and alias cards,
an aliased GGUF's ``aios.alias.*`` keys) show them as ``declared``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from aios.errors import AiosError
from aios.models import ModelHandle, resolve_model
from contract.result import Evidence, Quality

DEFAULT_MAX_PPL_RATIO = 1.10
PROTOCOL = "held-out perplexity, pydoc_data.topics held-out split, stride-128 windows (aios.evaluation)"


def heldout_perplexity(handle: ModelHandle, model=None, tokenizer=None) -> tuple[float, dict[str, Any], Any]:
    """(perplexity, held-out description, token ids) of ``handle`` by the converters' protocol.

    A GGUF is run as stored by the runtime (``runtime.perplexity``: quantized blocks in place,
    alias and low-rank formats applied), never through transformers' dequantizing loader, which
    random-initializes tensors it does not know; a folder runs in transformers.
    """
    from aios.evaluation import pydoc_split
    from aios.fixtures import train as fixture_recipe

    tokenizer = tokenizer if tokenizer is not None else handle.load_tokenizer()
    tokens = pydoc_split(tokenizer, "heldout")
    if handle.kind == "gguf":
        from runtime.model import Model
        from runtime.perplexity import perplexity

        assert handle.path is not None
        ppl = perplexity(Model(handle.path), tokens.ids.tolist(), window=fixture_recipe.SEQ_LEN)["perplexity"]
        return float(ppl), tokens.describe(), tokens.ids
    model = model if model is not None else handle.load_torch()
    return float(fixture_recipe.heldout_perplexity(model, tokens.ids)), tokens.describe(), tokens.ids


def measured_quality(handle: ModelHandle, baseline: str | ModelHandle, max_ratio: float = DEFAULT_MAX_PPL_RATIO,
                     *, model=None, tokenizer=None,
                     progress: Callable[[str], None] | None = None) -> Quality:
    """Run ``handle`` and ``baseline`` on the held-out text; ``met`` is ratio ≤ ``max_ratio``.

    A model that cannot be measured (no weights, weights transformers cannot load, different
    tokenizers) gives ``met=None`` and the reason: the gate then exits 3, never passes.
    """
    base = baseline if isinstance(baseline, ModelHandle) else resolve_model(baseline)
    q = Quality(evidence=Evidence.measured, baseline=base.name, max_ratio=max_ratio, source=PROTOCOL)
    try:
        if progress:
            progress(f"quality: held-out perplexity of {handle.name}")
        ppl, heldout, ids = heldout_perplexity(handle, model, tokenizer)
        if progress:
            progress(f"quality: held-out perplexity of the baseline {base.name}")
        base_ppl, base_heldout, base_ids = heldout_perplexity(base)
    except AiosError as e:
        q.reason = e.message
        return q
    q.perplexity, q.baseline_perplexity, q.heldout = round(ppl, 4), round(base_ppl, 4), heldout
    if len(ids) != len(base_ids) or bool((ids != base_ids).any()):
        q.reason = (f"{handle.name} and the baseline {base.name} tokenize the held-out text differently "
                    f"({heldout['tokens']} vs {base_heldout['tokens']} tokens); their perplexities are not "
                    "comparable.")
        return q
    q.ratio = round(ppl / base_ppl, 4)
    q.met = q.ratio <= max_ratio
    return q


def declared_quality(handle: ModelHandle) -> Quality | None:
    """The perplexities an artifact's provenance recorded at conversion (``declared``), if any."""
    if handle.path is None:
        return None
    if handle.kind == "gguf" and handle.store is not None:
        after = handle.store.field("aios.alias.heldout_perplexity")
        before = handle.store.field("aios.alias.source_heldout_perplexity")
        if isinstance(after, (int, float)) and isinstance(before, (int, float)):
            prov = _json(handle.store.field("aios.alias.provenance"))
            return _declared(float(after), float(before), (prov.get("source") or {}).get("name"),
                             prov.get("heldout") or {}, f"GGUF keys aios.alias.* of {handle.path.name}")
        source = (_json(handle.store.field("aios.provenance")).get("source") or {}).get("name")
        if isinstance(source, str) and source:  # a converted file names its source, no perplexities
            return Quality(evidence=Evidence.declared, baseline=source,
                           source=f"aios.provenance names the source; pass --baseline {source} to measure")
        return None
    if not handle.path.is_dir():
        return None
    relufy = _json_file(handle.path / "aios_relufy.json")
    if relufy:
        m = relufy.get("metrics") or {}
        after = (m.get("after") or {}).get("heldout_perplexity")
        before = (m.get("before") or {}).get("heldout_perplexity")
        if isinstance(after, (int, float)) and isinstance(before, (int, float)):
            return _declared(after, before, (relufy.get("source") or {}).get("name"),
                             (relufy.get("data") or {}).get("heldout") or {}, "aios_relufy.json")
    alias = _json_file(handle.path / "aios_alias.json")
    if alias:
        after, before = alias.get("heldout_perplexity"), alias.get("source_heldout_perplexity")
        if isinstance(after, (int, float)) and isinstance(before, (int, float)):
            prov = alias.get("provenance") or {}
            return _declared(after, before, (prov.get("source") or {}).get("name"),
                             alias.get("heldout") or {}, "aios_alias.json")
    return None


def _declared(after: float, before: float, source: str | None, heldout: dict, where: str) -> Quality:
    return Quality(evidence=Evidence.declared, perplexity=round(after, 4), baseline=source,
                   baseline_perplexity=round(before, 4),
                   ratio=round(after / before, 4) if before > 0 else None,
                   heldout=heldout if isinstance(heldout, dict) else {},
                   source=f"recorded at conversion ({where}); pass --baseline to measure")


def _json(raw: object) -> dict:
    if not isinstance(raw, str):
        return {}
    try:
        out = json.loads(raw)
    except ValueError:
        return {}
    return out if isinstance(out, dict) else {}


def _json_file(path) -> dict:
    try:
        return _json(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except (OSError, UnicodeDecodeError):
        return {}
