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

A file written with ``--sparse-down`` stores an aliased down projection neuron-major (names
ending in ``.t``, see ``runtime.sparse_down``): the canonical ``blk.A.ffn_down.canonical.t``
(d_ffn rows of d_model), dense/Q8_0 deltas ``blk.N.ffn_down.delta.t`` likewise, low-rank deltas
as ``.delta.lr_u`` (d_model × R, as is) and ``.delta.lr_v.t`` (Vᵀ: d_ffn rows of R). Such a
member becomes a :class:`runtime.sparse_down.NeuronMajorSum` under both ``ffn_down.weight``
(dense: every row) and ``ffn_down.T`` (sparse modes: the canonical's and the delta's rows of the
firing neurons, plus U). A standard-layout aliased down projection cannot be read row by
neuron, so the sparse modes refuse it with the export command.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from aios.errors import InvalidModelError, UsageError
from aios.models import alias_format as af
from runtime.kernels.arithmetic import DEFAULT, Arithmetic
from runtime.sparse_down import NEURON_MAJOR, FactoredRows, NeuronMajorSum, NeuronRows
from runtime.weights import KERNELS, Matrix, from_gguf_tensor


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

    def matmul(self, X: np.ndarray, rows: np.ndarray | None = None, arith: Arithmetic = DEFAULT) -> np.ndarray:
        y = self.canonical.matmul(X, rows, arith)  # (T, n_out)
        if self.encoding == "lowrank":
            U, V = self.delta
            y += U.matmul(V.matmul(X, None, arith), rows, arith)  # U (n_out, R) · (V (R, n_in) · x)
        elif self.delta:
            y += self.delta[0].matmul(X, rows, arith)
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
            key = m.weight[len(prefix):]
            if g.canonical.endswith(NEURON_MAJOR):  # --sparse-down: every tensor of the group neuron-major
                op = _neuron_major(m, canon, g.canonical, tensors)
                L[key] = L[key.removesuffix(".weight") + ".T"] = op
                continue
            delta = tuple(_matrix(tensors[n]) for n in m.tensors)
            L[key] = AliasedLinear(m.weight, canon, m.encoding, delta)
    down = L.get("ffn_down.weight")
    standard = isinstance(down, AliasedLinear) or (isinstance(down, Matrix) and KERNELS[down.kind].sparse is None)
    if model.mode != "dense" and "ffn_down.T" not in L and standard:
        how = "as canonical + delta" if isinstance(down, AliasedLinear) else "quantized"
        raise UsageError(
            f"--mode {model.mode} reads single neurons' rows of ffn_down, but {model.path.name} stores "
            f"blk.{i}.ffn_down {how} in the standard layout; run --mode dense, or export the aliased "
            "folder with `aios-convert alias FOLDER --gguf OUT.gguf --sparse-down`.")
    for name in af.stored_alias_names(groups):  # raw entries the generic loader made for this layer
        if name.startswith(prefix):
            key = name[len(prefix):]
            L.pop(key, None)
            if key.endswith(".lr_u"):  # runtime.lowrank's hook also wraps any X.lr_u/X.lr_v pair as X.weight
                L.pop(key[: -len(".lr_u")] + ".weight", None)


def _matrix(t) -> Matrix:
    """A factor may have a single row/column (rank 1), which the generic loader treats as a vector."""
    return from_gguf_tensor(t)


def _neuron_major(m: af.Member, canon: Matrix, canon_name: str, tensors: dict) -> NeuronMajorSum:
    """W_i = W_c + δ_i with every stored tensor neuron-major (``--sparse-down``): the canonical's
    rows plus the delta's rows (dense/Q8_0) or U·(Vᵀ rows) (low-rank)."""
    terms: list = [NeuronRows(canon, canon_name)]
    names = m.tensors
    if m.encoding == "lowrank":
        u, vt = names
        if not vt.endswith(NEURON_MAJOR):
            raise InvalidModelError(f"alias record of {m.weight}: its canonical is neuron-major but its delta "
                                    f"'{vt}' is not.")
        terms.append(FactoredRows(m.weight, _matrix(tensors[u]), NeuronRows(_matrix(tensors[vt]), vt)))
    elif names:
        if not names[0].endswith(NEURON_MAJOR):
            raise InvalidModelError(f"alias record of {m.weight}: its canonical is neuron-major but its delta "
                                    f"'{names[0]}' is not.")
        terms.append(NeuronRows(_matrix(tensors[names[0]]), names[0]))
    op = NeuronMajorSum(m.weight, tuple(terms))
    for t in terms[1:]:
        if (t.n_out, t.n_in) != (op.n_out, op.n_in):
            raise InvalidModelError(f"{m.weight}: the delta is {t.n_out}×{t.n_in}, the canonical "
                                    f"{op.n_out}×{op.n_in}.")
    return op
