"""Software memory counter: exact bytes touched per token, by term and by layer.

Terms follow the AIOS decomposition (DESIGN §1):
  weights     – bytes of every weight row a kernel reads (rows skipped by sparsity are not read)
  kv_cache    – K and V entries read by attention (plus the new entry written)
  activations – intermediate vectors written and read back between kernels (2 × size)
Attention compute is not a byte term and is not counted.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

TERMS = ("weights", "kv_cache", "activations")


@dataclass
class ByteCounter:
    enabled: bool = True
    totals: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    per_layer: dict[int, dict[str, int]] = field(default_factory=lambda: defaultdict(lambda: defaultdict(int)))
    per_tensor: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def add(self, term: str, nbytes: int, layer: int | None = None, tensor: str | None = None) -> None:
        if not self.enabled:
            return
        self.totals[term] += int(nbytes)
        if layer is not None:
            self.per_layer[layer][term] += int(nbytes)
        if tensor is not None:
            self.per_tensor[tensor] += int(nbytes)

    def snapshot(self) -> dict[str, int]:
        return {t: int(self.totals.get(t, 0)) for t in TERMS}

    def reset(self) -> None:
        self.totals.clear()
        self.per_layer.clear()
        self.per_tensor.clear()


def diff(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: after.get(k, 0) - before.get(k, 0) for k in TERMS}
