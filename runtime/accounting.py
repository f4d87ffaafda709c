"""Software memory counter: exact bytes touched per token, by term and by layer.

Terms follow the AIOS decomposition (docs/design.md, "The problem"):
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
    # distinct-bytes view (weights only): a tensor's largest single read and the layers reading it
    tensor_max: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    tensor_layers: dict[str, set] = field(default_factory=lambda: defaultdict(set))

    def add(self, term: str, nbytes: int, layer: int | None = None, tensor: str | None = None) -> None:
        if not self.enabled:
            return
        self.totals[term] += int(nbytes)
        if layer is not None:
            self.per_layer[layer][term] += int(nbytes)
        if tensor is not None:
            self.per_tensor[tensor] += int(nbytes)
            if term == "weights":
                self.tensor_max[tensor] = max(self.tensor_max[tensor], int(nbytes))
                self.tensor_layers[tensor].add(layer)

    def distinct_weight_bytes(self, layers=None) -> float:
        """Weight bytes counting each tensor once since the last reset (re-reads not counted).

        A tensor read by several layers (a shared alias canonical) is split pro rata over
        them, so ``layers`` (an iterable of layer indices, None = all) gets its share. Each
        tensor counts its largest single read: exact for whole-matrix reads (dense mode), a
        lower bound when sparse reads pick different rows each time.
        """
        want = None if layers is None else set(layers)
        total = 0.0
        for name, nbytes in self.tensor_max.items():
            readers = self.tensor_layers[name]
            share = 1.0 if want is None else len(readers & want) / len(readers)
            total += nbytes * share
        return total

    def snapshot(self) -> dict[str, int]:
        return {t: int(self.totals.get(t, 0)) for t in TERMS}

    def reset(self) -> None:
        self.totals.clear()
        self.per_layer.clear()
        self.per_tensor.clear()
        self.tensor_max.clear()
        self.tensor_layers.clear()


def diff(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: after.get(k, 0) - before.get(k, 0) for k in TERMS}
