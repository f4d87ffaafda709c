"""FFN activation statistics measured by running the model: the one R1 implementation.

Hook point: the *input* of each block's FFN output projection (``ffn_down`` in the
architecture row). That tensor is act(up(x)) for plain FFNs and act(gate(x)) * up(x) for
gated ones, i.e. exactly the vector whose zeros let a sparse kernel skip down-projection
rows. The relufy converter and sparsity maps reuse these statistics.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from aios.models import ModelHandle


@dataclass
class FfnActivity:
    """Per-layer counts over every calibration token (shapes in comments)."""

    n_layers: int
    d_ffn: int
    tokens: int = 0
    zeros: np.ndarray = field(default=None)  # type: ignore[assignment]  # (L,) exact zeros
    near_zeros: np.ndarray = field(default=None)  # type: ignore[assignment]  # (L,) |x| < eps
    neuron_active: np.ndarray = field(default=None)  # type: ignore[assignment]  # (L, d_ffn) x != 0
    eps: float = 1e-3

    def __post_init__(self) -> None:
        if self.zeros is None:
            self.zeros = np.zeros(self.n_layers, np.int64)
            self.near_zeros = np.zeros(self.n_layers, np.int64)
            self.neuron_active = np.zeros((self.n_layers, self.d_ffn), np.int64)

    @property
    def zero_fraction(self) -> np.ndarray:  # (L,)
        return self.zeros / max(1, self.tokens * self.d_ffn)

    @property
    def near_zero_fraction(self) -> np.ndarray:  # (L,)
        return self.near_zeros / max(1, self.tokens * self.d_ffn)

    @property
    def neuron_frequency(self) -> np.ndarray:  # (L, d_ffn): fraction of tokens a neuron fires
        return self.neuron_active / max(1, self.tokens)

    @property
    def mean_zero_fraction(self) -> float:
        return float(self.zero_fraction.mean())

    @property
    def mean_near_zero_fraction(self) -> float:
        return float(self.near_zero_fraction.mean())


def _module(model, dotted: str):
    m = model
    for part in dotted.split("."):
        m = getattr(m, part)
    return m


def measure_ffn_activity(
    handle: ModelHandle,
    texts: Sequence[str],
    *,
    max_tokens: int = 128,
    eps: float = 1e-3,
    model=None,
    tokenizer=None,
    progress: Callable[[int, int], None] | None = None,
) -> FfnActivity:
    """Run ``texts`` (one sequence each, truncated to ``max_tokens``) and count FFN zeros."""
    import torch

    model = model if model is not None else handle.load_torch()
    tokenizer = tokenizer if tokenizer is not None else handle.load_tokenizer()
    arch, facts = handle.arch, handle.facts
    stats = FfnActivity(facts.n_layers, facts.d_ffn, eps=eps)
    hooks = []

    def make_hook(layer: int):
        def hook(_module, args):
            x = args[0].detach().reshape(-1, args[0].shape[-1])  # (tokens, d_ffn)
            is_zero = x == 0
            stats.zeros[layer] += int(is_zero.sum())
            stats.near_zeros[layer] += int((x.abs() < eps).sum())
            stats.neuron_active[layer] += (~is_zero).sum(0).cpu().numpy()

        return hook

    for i in range(facts.n_layers):
        down = _module(model, arch.block(i, arch.ffn_down))
        hooks.append(down.register_forward_pre_hook(make_hook(i)))
    try:
        with torch.inference_mode():
            for k, text in enumerate(texts):
                ids = tokenizer(text, return_tensors="pt", truncation=True, max_length=max_tokens)
                n = int(ids["input_ids"].shape[1])
                if n == 0:
                    continue
                model(input_ids=ids["input_ids"], use_cache=False)
                stats.tokens += n
                if progress:
                    progress(k + 1, len(texts))
    finally:
        for h in hooks:
            h.remove()
    return stats
