"""The sparsity-map run: measure frequencies, search the skip count, measure the result.

Orchestration only (read ``convert/sparsity_map/__init__.py`` for the method and file format;
the search itself is ``convert/sparsity_map/search.py``).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, Callable

import numpy as np
import torch

from aios import __version__
from aios.data import CALIBRATION_FILE, load_heldout, load_texts, texts_sha256
from aios.evaluation import pydoc_split
from aios.fixtures import train as fixture_recipe
from aios.measure.ffn import measure_ffn_activity
from aios.models import ModelHandle, resolve_model
from aios.models.from_gguf import hf_source
from convert import evaluation as ev
from convert.relufication.run import source_sha256
from convert.sparsity_map import search as ss


class NeuronMask:
    """Forward pre-hooks zeroing skipped neurons at the input of every FFN output projection."""

    def __init__(self, handle: ModelHandle, model: torch.nn.Module) -> None:
        arch = handle.arch
        self._keep: list[torch.Tensor | None] = [None] * handle.facts.n_layers
        downs = [model.get_submodule(arch.block(i, arch.ffn_down)) for i in range(handle.facts.n_layers)]
        self._hooks = [m.register_forward_pre_hook(self._hook(i)) for i, m in enumerate(downs)]

    def _hook(self, i: int):
        def hook(_module, args):
            keep = self._keep[i]
            if keep is None:
                return None
            return (args[0] * keep.to(args[0].dtype), *args[1:])  # (B, T, d_ffn) * (d_ffn,)

        return hook

    def set(self, keep: np.ndarray | None) -> None:
        """``keep`` (L, d_ffn) bool, or None for no masking."""
        n = len(self._keep)
        self._keep = [None] * n if keep is None else [torch.from_numpy(row.copy()) for row in keep]

    def remove(self) -> None:
        for h in self._hooks:
            h.remove()


def heldout_paragraphs() -> list[str]:
    """The fixtures' held-out topics as paragraphs (texts for the false-negative rate)."""
    docs = fixture_recipe.split_texts("heldout")
    return [p.strip() for doc in docs for p in doc.split("\n\n") if p.strip()]


def build(model_spec: str, cfg, calibration,
          progress: Callable[[str], None]) -> tuple[dict[str, Any], np.ndarray]:
    """(header, keep (L, d_ffn) bool) for ``model_spec`` under ``cfg`` (a SparsityMapConfig)."""
    budget_pct = cfg.budget()
    handle = hf_source(resolve_model(model_spec), progress)  # a GGUF: its dequantized HF twin
    handle.require_weights("A sparsity map")
    model = handle.load_torch()
    tokenizer = handle.load_tokenizer()
    calib = load_texts(calibration)
    progress(f"measuring neuron frequencies on {len(calib)} calibration texts")
    stats = measure_ffn_activity(handle, calib, max_tokens=cfg.max_tokens, model=model, tokenizer=tokenizer)
    freq = stats.neuron_frequency  # (L, d_ffn)
    order = ss.skip_order(freq)
    heldout = pydoc_split(tokenizer, "heldout")
    ppl_without = ev.heldout_perplexity(model, heldout)
    progress(f"held-out perplexity without a map: {ppl_without:.4f}; "
             f"searching ({cfg.mode}, < {budget_pct} %)")
    mask = NeuronMask(handle, model)
    ppl_at: dict[int, float] = {0: ppl_without}

    def measure(k: int) -> float:
        mask.set(ss.keep_masks(order, k, freq.shape))
        ppl_at[k] = ev.heldout_perplexity(model, heldout)
        change = (ppl_at[k] - ppl_without) / ppl_without
        progress(f"  skip {k:>8} neurons ({k / freq.size:6.1%}): ppl {ppl_at[k]:.4f} ({change:+.3%})")
        return change

    try:
        k, probes = ss.search_skip_count(freq.size, measure, budget_pct / 100, cfg.resolution)
    finally:
        mask.remove()
    keep = ss.keep_masks(order, k, freq.shape)
    progress("measuring false negatives on held-out text")
    fnr = {}
    for name, texts in (("heldout", heldout_paragraphs()), ("bundled", load_heldout())):
        active = measure_ffn_activity(handle, texts, max_tokens=cfg.max_tokens, model=model,
                                      tokenizer=tokenizer).neuron_active
        fnr[name] = ss.false_negative_rate(active, keep)
    kept = keep.sum(axis=1)
    header = {
        "format_version": 1,
        "mode": cfg.mode,
        "budget_pct": budget_pct,
        "calibration_sha256": texts_sha256(calib),
        "calibration_source": str(calibration) if calibration else CALIBRATION_FILE.name,
        "calibration_tokens": stats.tokens,
        "model": handle.name,
        "model_sha256": source_sha256(handle) if handle.kind != "gguf" else None,
        "activation": handle.facts.activation,
        "n_layers": int(freq.shape[0]),
        "d_ffn": int(freq.shape[1]),
        "per_layer_kept": [int(x) for x in kept],
        "per_layer_skip_fraction": [round(1 - float(x) / freq.shape[1], 6) for x in kept],
        "skip_fraction": round(k / freq.size, 6),
        "heldout_ppl_without": round(ppl_without, 6),
        "heldout_ppl_with": round(ppl_at[k], 6),
        "ppl_change_pct": round(100 * (ppl_at[k] - ppl_without) / ppl_without, 6),
        "heldout": heldout.describe(),
        "false_negative_rate": round(fnr["heldout"], 6),
        "false_negative_rate_bundled_heldout": round(fnr["bundled"], 6),
        "search": [{"skipped": p.skipped, "change_pct": round(100 * p.change, 6), "ok": p.ok}
                   for p in probes],
        "config": asdict(cfg),
        "tool_version": __version__,
    }
    return header, keep
