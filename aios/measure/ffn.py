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


# An early decision on the whole calibration set (runtime.measure, R1 on a GGUF): stop once the
# set's mean exact-zero fraction is known to lie on one side of R1's floor. The interval is
# DECISION_Z standard errors of the ratio estimator wide; a stop is looked for after each forward
# pass (at most ~50 looks for the bundled set), so even with the looks counted separately
# (Bonferroni) the chance of deciding the other way than the whole set would is below 0.2 %
# under the normal approximation, which DECISION_MIN_TEXTS texts make reasonable.
DECISION_Z = 4.0
DECISION_MIN_TEXTS = 24


@dataclass(frozen=True)
class SetEstimate:
    """The calibration set's mean exact-zero fraction estimated from the texts measured so far,
    a simple random sample of the set (runtime.measure runs the texts in a seeded random order):
    the ratio estimator with the finite-population correction (Cochran, Sampling Techniques,
    §6.3), whose interval closes to the measured value once every text is measured."""

    value: float  # measured over the texts so far
    low: float
    high: float
    texts: int  # measured
    of: int  # in the set

    def settles(self, floor: float) -> bool:
        """Whether pass/fail against ``floor`` is known for the whole set."""
        if self.texts >= self.of:
            return True
        return self.texts >= DECISION_MIN_TEXTS and (self.low >= floor or self.high < floor)


def set_estimate(text_zeros: Sequence[float], text_tokens: Sequence[int], set_texts: int,
                 set_tokens: int, z: float = DECISION_Z) -> SetEstimate:
    """``text_zeros[i]``: text i's exact zeros summed over layers / (n_layers × d_ffn), i.e. its
    zero fraction times its tokens ``text_tokens[i]``; ``set_texts``/``set_tokens``: the whole set."""
    y, n = np.asarray(text_zeros, np.float64), np.asarray(text_tokens, np.float64)
    k = len(y)
    value = float(y.sum() / n.sum()) if k and n.sum() else 0.0
    if k >= set_texts:
        return SetEstimate(value, value, value, k, set_texts)
    if k < 2:
        return SetEstimate(value, 0.0, 1.0, k, set_texts)
    s2 = float(((y - value * n) ** 2).sum() / (k - 1))
    se = float(np.sqrt((1.0 - k / set_texts) * s2 / k)) / (set_tokens / set_texts)
    return SetEstimate(value, max(0.0, value - z * se), min(1.0, value + z * se), k, set_texts)


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
    # per text measured, in the order run (runtime.measure): its exact zeros over all layers /
    # (n_layers × d_ffn), and its tokens; with the whole set's size, for set_estimate
    text_zeros: list[float] = field(default_factory=list)
    text_tokens: list[int] = field(default_factory=list)
    set_texts: int = 0
    set_tokens: int = 0
    # a file whose projection inputs are cut too (sparsify --scope all): per input site
    # (runtime.thresholds.INPUT_SITES), [zeros after the cut, values seen] over every layer it cuts
    site_counts: dict = field(default_factory=dict)

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

    @property
    def site_zero_fraction(self) -> dict[str, float]:
        """Per cut input site, the exact-zero fraction of its inputs (after the cut)."""
        return {s: z / max(1, n) for s, (z, n) in self.site_counts.items()}

    def set_estimate(self) -> SetEstimate | None:
        """The whole set's mean exact-zero fraction from the texts measured (None where the
        measurement did not record texts one by one)."""
        if not self.text_tokens or not self.set_texts:
            return None
        return set_estimate(self.text_zeros, self.text_tokens, self.set_texts, self.set_tokens)


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
    batch_size: int = 32,
    model=None,
    tokenizer=None,
    progress: Callable[[int, int], None] | None = None,
) -> FfnActivity:
    """Run ``texts`` (one sequence each, truncated to ``max_tokens``) and count FFN zeros.

    Sequences are batched by similar length and right-padded; padded positions are masked
    out of every count (with causal attention they do not affect the real positions).
    """
    import torch

    model = model if model is not None else handle.load_torch()
    tokenizer = tokenizer if tokenizer is not None else handle.load_tokenizer()
    arch, facts = handle.arch, handle.facts
    stats = FfnActivity(facts.n_layers, facts.d_ffn, eps=eps)
    current_mask: list = [None]  # (B, T) bool of real tokens for the running batch
    hooks = []

    def make_hook(layer: int):
        def hook(_module, args):
            x = args[0].detach()  # (B, T, d_ffn)
            x = x[current_mask[0]] if current_mask[0] is not None else x.reshape(-1, x.shape[-1])
            is_zero = x == 0  # (tokens, d_ffn)
            stats.zeros[layer] += int(is_zero.sum())
            stats.near_zeros[layer] += int((x.abs() < eps).sum())
            stats.neuron_active[layer] += (~is_zero).sum(0).cpu().numpy()

        return hook

    encoded = [
        # slice instead of truncation=True: that flag leaves a fast tokenizer's backend
        # truncating for every later caller sharing the object
        tokenizer(t, add_special_tokens=True)["input_ids"][:max_tokens]
        for t in texts
    ]
    order = sorted((i for i, ids in enumerate(encoded) if ids), key=lambda i: len(encoded[i]))
    for i in range(facts.n_layers):
        down = _module(model, arch.block(i, arch.ffn_down))
        hooks.append(down.register_forward_pre_hook(make_hook(i)))
    done = 0
    device = next(model.parameters()).device  # runs where the model is (a trainer's GPU too)
    try:
        with torch.inference_mode():
            for b0 in range(0, len(order), batch_size):
                batch = [encoded[i] for i in order[b0 : b0 + batch_size]]
                T = max(len(ids) for ids in batch)
                input_ids = torch.zeros((len(batch), T), dtype=torch.long)
                mask = torch.zeros((len(batch), T), dtype=torch.bool)
                for r, ids in enumerate(batch):
                    input_ids[r, : len(ids)] = torch.tensor(ids)
                    mask[r, : len(ids)] = True
                input_ids, mask = input_ids.to(device), mask.to(device)
                current_mask[0] = mask
                model(input_ids=input_ids, attention_mask=mask.long(), use_cache=False)
                stats.tokens += int(mask.sum())
                done += len(batch)
                if progress:
                    progress(done, len(order))
    finally:
        for h in hooks:
            h.remove()
    return stats
