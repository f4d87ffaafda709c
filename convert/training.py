"""Recovery fine-tuning math: schedules and the activation-L1 penalty.

Pure training mechanics with no files, CLI, processes or model resolution (``convert/relufy.py``
and ``convert/engine.py`` do those).

* Learning rate: linear warmup to the peak, then cosine decay to ``min_lr_frac`` × peak.
* Activation L1 (ProSparse-style, progressive): the penalty weight is 0 for the first
  ``l1_start`` fraction of the steps, then rises smoothly (half-cosine) to ``l1`` at the
  ``l1_full`` fraction and stays there, so the model first recovers from the activation
  swap and is then pushed towards sparser activations a little at a time.
* The penalty is λ × Σ_l ρ_l·(mean|a_l| / rms(a_l)) / Σ_l ρ_l, where ``a_l`` is the input
  of block l's FFN output projection (the very tensor R1 counts zeros in) and ρ_l its
  nonzero fraction (a weight, no gradient): in a fine-tune, the fraction of the previous step
  over the whole global batch (all micro-batches, all processes; ``convert/engine.py``), so
  that the update does not depend on how the batch is split.
  - Normalising the L1 norm by the RMS makes it scale-free: a plain L1 can be satisfied by
    shrinking the activations and growing the output projection (ReLU is positively
    homogeneous), which costs nothing and sparsifies nothing; mean|a|/rms(a) only falls when
    mass moves into fewer neurons (≈ 0.56 at 50 % zeros for a half-normal ReLU output,
    ≈ 0.25 at 90 %).
  - Weighting layers by their density pushes the dense layers (typically the first) and
    spares layers that are already sparse, instead of driving those to dead neurons; on
    tiny-falcon it gives more zeros at the same perplexity than a plain mean over layers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


def lr_at(step: int, steps: int, peak: float, warmup: int, min_lr_frac: float) -> float:
    """Learning rate of 0-based ``step``: linear warmup, then cosine to ``min_lr_frac``·peak."""
    if step < warmup:
        return peak * (step + 1) / warmup
    t = min(1.0, (step - warmup) / max(1, steps - warmup))
    return peak * (min_lr_frac + (1 - min_lr_frac) * 0.5 * (1 + math.cos(math.pi * t)))


def l1_at(step: int, steps: int, final: float, start: float, full: float) -> float:
    """Progressive activation-L1 weight: 0 before ``start``·steps, half-cosine up to ``final``
    at ``full``·steps, constant after."""
    if final <= 0:
        return 0.0
    s0, s1 = start * steps, max(start * steps + 1, full * steps)
    if step < s0:
        return 0.0
    t = min(1.0, (step - s0) / (s1 - s0))
    return final * 0.5 * (1 - math.cos(math.pi * t))


def anneal_at(step: int, steps: int, frac: float) -> float:
    """Weight of the new activation at 0-based ``step``: rises linearly to 1 at ``frac``·steps
    (1 from the first step when ``frac`` is 0)."""
    span = frac * steps
    return 1.0 if span <= 0 else min(1.0, (step + 1) / span)


class ActivationAnneal(torch.nn.Module):
    """(1 − α)·old(x) + α·new(x): the FFN activation of a warm-started relufy moving from the
    source's smooth function to ReLU during recovery (``alpha`` set each step); at α = 1 it is
    ``new`` exactly, the activation the saved model runs."""

    def __init__(self, old: torch.nn.Module, new: torch.nn.Module) -> None:
        super().__init__()
        self.old, self.new, self.alpha = old, new, 0.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.alpha >= 1.0:
            return self.new(x)
        if self.alpha <= 0.0:
            return self.old(x)
        return torch.lerp(self.old(x), self.new(x), self.alpha)


class ActivationTap:
    """Forward pre-hooks on FFN output projections that keep their input for the penalty.

    ``l1_penalty()`` returns the density-weighted mean over layers of mean|a| / rms(a) of the
    last forward pass (differentiable; see the module docstring); ``zero_fraction()`` the
    exact-zero fraction of the same tensors.
    """

    def __init__(self, modules: list[torch.nn.Module]) -> None:
        self._acts: list[torch.Tensor | None] = [None] * len(modules)
        self._hooks = [m.register_forward_pre_hook(self._hook(i)) for i, m in enumerate(modules)]

    def _hook(self, i: int):
        def hook(_module, args):
            self._acts[i] = args[0]  # (B, T, d_ffn)

        return hook

    def l1_penalty(self, density: list[float] | None = None) -> torch.Tensor:
        """Density-weighted mean of mean|a|/rms(a) over layers.

        ``density`` (one weight per layer) is given by the training engine: the nonzero
        fractions of the previous step reduced over every micro-batch and process, so all
        micro-batches of a step, on any number of processes, use the same weights. Without
        it, this batch's own densities are used.
        """
        acts = [a.float() for a in self._acts if a is not None]  # each (B, T, d_ffn)
        assert acts, "no FFN activations captured: run a forward pass first"
        ratio = torch.stack([a.abs().mean() / a.pow(2).mean().sqrt().clamp_min(1e-6) for a in acts])
        if density is None:
            w = torch.stack([(a != 0).float().mean() for a in acts]).detach()
        else:
            w = torch.tensor(density, dtype=ratio.dtype, device=ratio.device)
        w = w.clamp_min(1e-6)  # (L,)
        return (w * ratio).sum() / w.sum()

    @torch.no_grad()
    def density(self) -> list[float]:
        """Nonzero fraction of each layer's captured activations (one float per layer)."""
        return [float((a != 0).float().mean()) for a in self._acts if a is not None]

    @torch.no_grad()
    def zero_fraction(self) -> float:
        acts = [a for a in self._acts if a is not None]
        return float(torch.stack([(a == 0).float().mean() for a in acts]).mean())

    def clear(self) -> None:
        self._acts = [None] * len(self._acts)

    def remove(self) -> None:
        for h in self._hooks:
            h.remove()
        self.clear()


@dataclass
class StepStats:
    step: int  # 0-based step just finished
    loss: float  # language-model loss (without the penalty)
    penalty: float  # λ × l1_penalty() added to the loss
    l1: float  # λ used
    lr: float
    zero_fraction: float  # exact zeros in this batch's FFN activations
