"""Canonical + delta weights (R3 alias format) in the runtime: ``y = W_c x + δ_i x``.

A GGUF written by ``aios-convert alias --gguf`` stores each group's canonical once and the
members' deltas (``aios.models.alias_format``). The layer hook below, listed in
``runtime.extensions.LAYER_HOOKS`` after the low-rank one, replaces each member's
``<t>.weight`` entry with an :class:`AliasedLinear`. All members share **one** canonical
:class:`Matrix` object, so ``Model.weight_bytes`` (distinct parts by identity) counts it once,
while the byte counter still records every read of it: a decoder multiplies by the canonical
once per member layer. ``ByteCounter.distinct_weight_bytes`` gives the other view — each
stored tensor's bytes once, split pro rata over the layers that read it — which is the DRAM
traffic when the canonical stays cache-resident between layers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from aios.errors import InvalidModelError
from aios.models import alias_format as af
from runtime.weights import Matrix, from_gguf_tensor


@dataclass
class AliasedLinear:
    """W_i = W_c + δ_i applied without materializing W_i (implements ``runtime.weights.Linear``)."""

    name: str  # the member's standard tensor name, e.g. blk.2.ffn_up.weight
    canonical: Matrix
    encoding: str  # dense | lowrank | q8_0 | none
    delta: tuple[Matrix, ...]  # (D,) dense/q8_0, (U, V) lowrank with δ = U V, () none

    @property
    def n_out(self) -> int:
        return self.canonical.n_out

    @property
    def n_in(self) -> int:
        return self.canonical.n_in

    def matmul(self, X: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
        y = self.canonical.matmul(X, rows)  # (T, n_out)
        if self.encoding == "lowrank":
            U, V = self.delta
            y += U.matmul(V.matmul(X), rows)  # U (n_out, R) · (V (R, n_in) · x)
        elif self.delta:
            y += self.delta[0].matmul(X, rows)
        return y

    def reads(self, rows: np.ndarray | None = None) -> list[tuple[str, int]]:
        out = self.canonical.reads(rows)
        if self.encoding == "lowrank":
            U, V = self.delta
            out += V.reads(None) + U.reads(rows)
        elif self.delta:
            out += self.delta[0].reads(rows)
        return out

    def parts(self) -> list[Matrix]:
        return [self.canonical, *self.delta]

    def dense(self) -> np.ndarray:
        W = self.canonical.dense()
        if self.encoding == "lowrank":
            return W + self.delta[0].dense() @ self.delta[1].dense()
        return W + self.delta[0].dense() if self.delta else W


def _groups(model) -> list[af.Group]:
    if not hasattr(model, "_alias_groups"):
        f = model.reader.get_field(af.GGUF_GROUPS_KEY)
        model._alias_groups = af.loads(f.contents(), str(model.path)) if f is not None else []
        model._alias_canonical = {}
        names = {t.name for t in model.reader.tensors}
        for g in model._alias_groups:  # a hostile record naming absent tensors: one sentence, exit 4
            for n in (g.canonical, *(t for m in g.members for t in m.tensors)):
                if n not in names:
                    raise InvalidModelError(f"{model.path}: an alias record names tensor '{n}', "
                                            "which the file does not have.")
    return model._alias_groups


def alias_hook(model, tensors: dict, i: int, L: dict) -> None:
    """``LAYER_HOOKS`` entry: build layer ``i``'s aliased operators from the GGUF tensors."""
    groups = _groups(model)
    if not groups:
        return
    prefix = f"blk.{i}."
    for g in groups:
        for m in g.members:
            if m.layer != i:
                continue
            canon = model._alias_canonical.get(g.canonical)
            if canon is None:  # one Matrix object for the whole group
                canon = model._alias_canonical[g.canonical] = from_gguf_tensor(tensors[g.canonical])
            delta = tuple(_matrix(tensors[n]) for n in m.tensors)
            L[m.weight[len(prefix):]] = AliasedLinear(m.weight, canon, m.encoding, delta)
    for name in af.stored_alias_names(groups):  # raw entries the generic loader made for this layer
        if name.startswith(prefix):
            key = name[len(prefix):]
            L.pop(key, None)
            if key.endswith(".lr_u"):  # runtime.lowrank's hook also wraps any X.lr_u/X.lr_v pair as X.weight
                L.pop(key[: -len(".lr_u")] + ".weight", None)


def _matrix(t) -> Matrix:
    """A factor may have a single row/column (rank 1), which the generic loader treats as a vector."""
    return from_gguf_tensor(t)
