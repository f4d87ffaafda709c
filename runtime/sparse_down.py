"""The neuron-major FFN down projection (``aios-convert gguf --sparse-down``): ``blk.N.ffn_down.t``.

The file stores Wᵀ (d_ffn rows of d_model, each row quantized along d_model) instead of
``ffn_down.weight``: a neuron whose activation is zero is one row never read, in any tensor type,
so exact-sparse, map and predict modes save its bytes in the quantized formats people deploy (the
standard layout quantizes along d_ffn, where a block of 32 or 256 neurons is read unless every one
of them is silent). The layer hook below gives the forward pass the same two operators as a float
file: ``ffn_down.weight`` (dense: every row) and ``ffn_down.T`` (sparse: the rows of firing
neurons), both over the stored rows; bytes counted are the rows' stored bytes.

The other converters that write FFN weights store their down projections the same way with
``--sparse-down`` (a ``.t`` suffix on every neuron-major tensor) and build their operators from
the pieces below:

* ``aios-convert alias --gguf --sparse-down``: an aliased down projection is the canonical's rows
  (``blk.A.ffn_down.canonical.t``) plus the member's delta rows (``blk.N.ffn_down.delta.t``,
  dense or Q8_0), or plus a low-rank delta U·V whose V is stored transposed
  (``blk.N.ffn_down.delta.lr_v.t``, d_ffn rows of R) and U as is (``.delta.lr_u``, d_model × R):
  :class:`NeuronMajorSum` of :class:`NeuronRows` and :class:`FactoredRows` (runtime/alias.py);
* ``aios-convert svd-residual --sparse-down``: W = U·V + E with V and E stored transposed
  (``blk.N.ffn_down.lr_v.t``, ``blk.N.ffn_down.residual.t``) and U as is (``.lr_u``):
  :class:`NeuronMajorSum` of a :class:`FactoredRows` and the residual's :class:`NeuronRows`
  (runtime/lowrank.py).

Every neuron-major operator has ``sparse_matvec(a, active)`` and ``sparse_reads(active)``: the
(tensor, bytes) the sparse sum reads — the stored rows of the active neurons of each ``.t``
tensor, and the whole of an un-transposed U (d_model × R, needed for any nonzero V·a; nothing
when no neuron fires). ``Model._ffn`` counts exactly those.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from runtime import kernels as K
from runtime.kernels.arithmetic import DEFAULT, Arithmetic
from runtime.thresholds import INPUT_MAJOR
from runtime.weights import KERNELS, Matrix

NEURON_MAJOR = ".t"  # suffix of a tensor stored neuron-major (d_ffn rows), after the name it replaces


@dataclass
class NeuronRows:
    """Wᵀ stored neuron-major: ``m`` has d_ffn rows of d_model. As a ``Linear`` it is the down
    projection W (d_model × d_ffn); ``sparse_matvec`` sums the rows of the active neurons."""

    m: Matrix
    name: str

    @property
    def n_out(self) -> int:
        return self.m.n_in

    @property
    def n_in(self) -> int:
        return self.m.n_out

    @property
    def row_bytes(self) -> int:
        return self.m.row_bytes

    def sparse_matvec(self, a: np.ndarray, active: np.ndarray, arith: Arithmetic = DEFAULT) -> np.ndarray:
        """y (d_model,) = Σ_j a[j] · row_j over ``active`` neurons; reads only those rows."""
        spec = KERNELS[self.m.kind]
        # float rows (F32/F16/BF16), or every block type's blocks read in place (kernels.sparse_block_rows):
        # a float axpy, a[j] times the row's decoded values, whatever the arithmetic
        kernel = spec.sparse or spec.sparse_blocks
        if kernel is None:
            return self._decode_rows_matvec(a, active)
        K.threads_for(len(active) * self.row_bytes)
        y = np.empty(self.n_out, np.float32)
        kernel(self.m.data, np.ascontiguousarray(a, dtype=np.float32), active, y)
        return y

    def _decode_rows_matvec(self, a: np.ndarray, active: np.ndarray) -> np.ndarray:
        """The same sum for a type without a sparse kernel (none today): the active rows decoded by
        gguf-py first (exact, reads the same bytes, 15-200x slower than a kernel)."""
        rows = self.m.rows_f32(active)  # (k, d_model) decoded from the active rows' blocks only
        return (a[active].astype(np.float64) @ rows.astype(np.float64)).astype(np.float32)

    def matmul(self, X: np.ndarray, rows: np.ndarray | None = None, arith: Arithmetic = DEFAULT) -> np.ndarray:
        """Y = X Wᵀ. One token: the sparse sum over every stored row. Several (a prompt, a
        perplexity window): the rows of the inputs nonzero in some token (``chunk_rows``; every
        row of a model without cuts) decoded to float32 once and one BLAS product; per-token sums
        would stream the matrix once per token (~5x slower at 128 tokens). The sparse modes run
        the same chunk product (``Model._project``), so a prompt gives the same bits in both."""
        assert rows is None, "an input-major matrix is never computed for a subset of its outputs"
        X = np.ascontiguousarray(X, dtype=np.float32)
        if X.shape[0] >= 2:
            nz = self.chunk_rows(X)
            return X[:, nz] @ self.rows_f32(nz)
        return self.sparse_matvec(X[0], np.arange(self.n_in, dtype=np.int64), arith)[None]

    @staticmethod
    def chunk_rows(X: np.ndarray) -> np.ndarray:
        """The stored rows a chunk's product reads: inputs nonzero in some token of ``X``."""
        return np.flatnonzero(X.any(0)).astype(np.int64)

    def rows_f32(self, rows: np.ndarray) -> np.ndarray:
        """Stored rows ``rows`` decoded, (len(rows), n_out) float32 (the block kernels' decoders)."""
        m = self.m
        if KERNELS[m.kind].layout != "blocks":
            return np.asarray(m.rows_f32(rows), np.float32)
        out = np.empty((len(rows), m.n_in), np.float32)  # m.n_in: the stored rows' length (our n_out)
        return K.decode_block_rows(m.kind.lower(), np.ascontiguousarray(m.data[rows]), out)

    def reads(self, rows: np.ndarray | None = None) -> list[tuple[str, int]]:
        return [(self.m.name, self.m.nbytes)]

    def sparse_reads(self, active: np.ndarray) -> list[tuple[str, int]]:
        """What ``sparse_matvec(a, active)`` reads: the stored rows of the active neurons."""
        return [(self.m.name, len(active) * self.m.row_bytes)]

    def parts(self) -> list[Matrix]:
        return [self.m]

    def dense(self) -> np.ndarray:
        return self.m.dense().T.copy()


@dataclass
class FactoredRows:
    """δ = U·V (n_out × n_in) with V stored neuron-major (``Vt``: n_in rows of R) and U as is
    (n_out × R): ``sparse_matvec`` sums the active neurons' rows of Vt into z = V·a (R values),
    then multiplies U·z, reading all of U once (R columns of every output) — unless no neuron is
    active, when z = 0 and U is not read."""

    name: str
    U: Matrix  # (n_out, R)
    Vt: NeuronRows  # as an operator: V (R × n_in)

    @property
    def n_out(self) -> int:
        return self.U.n_out

    @property
    def n_in(self) -> int:
        return self.Vt.n_in

    def sparse_matvec(self, a: np.ndarray, active: np.ndarray, arith: Arithmetic = DEFAULT) -> np.ndarray:
        if len(active) == 0:
            return np.zeros(self.n_out, np.float32)
        z = self.Vt.sparse_matvec(a, active, arith)  # (R,)
        return self.U.matmul(z[None, :], None, arith)[0]

    def sparse_reads(self, active: np.ndarray) -> list[tuple[str, int]]:
        if len(active) == 0:
            return []
        return self.Vt.sparse_reads(active) + self.U.reads(None)

    def matmul(self, X: np.ndarray, rows: np.ndarray | None = None, arith: Arithmetic = DEFAULT) -> np.ndarray:
        assert rows is None, "the down projection is never computed for a subset of its outputs"
        return self.U.matmul(self.Vt.matmul(X, None, arith), None, arith)

    def reads(self, rows: np.ndarray | None = None) -> list[tuple[str, int]]:
        return self.Vt.reads(None) + self.U.reads(None)

    def parts(self) -> list[Matrix]:
        return [self.U, *self.Vt.parts()]

    def dense(self) -> np.ndarray:
        return (self.U.dense().astype(np.float64) @ self.Vt.dense().astype(np.float64)).astype(np.float32)


@dataclass
class NeuronMajorSum:
    """A down projection W = Σ terms, each neuron-major (:class:`NeuronRows`, :class:`FactoredRows`):
    canonical + delta (alias), low-rank + residual (svd-residual). As a ``Linear`` it is W
    (d_model × d_ffn); ``sparse_matvec`` reads each term's rows of the active neurons only."""

    name: str  # the tensor it stands for, e.g. blk.3.ffn_down.weight
    terms: tuple  # NeuronRows | FactoredRows, all n_out × n_in

    @property
    def n_out(self) -> int:
        return self.terms[0].n_out

    @property
    def n_in(self) -> int:
        return self.terms[0].n_in

    def sparse_matvec(self, a: np.ndarray, active: np.ndarray, arith: Arithmetic = DEFAULT) -> np.ndarray:
        y = self.terms[0].sparse_matvec(a, active, arith)
        for t in self.terms[1:]:
            y += t.sparse_matvec(a, active, arith)
        return y

    def sparse_reads(self, active: np.ndarray) -> list[tuple[str, int]]:
        return [r for t in self.terms for r in t.sparse_reads(active)]

    def matmul(self, X: np.ndarray, rows: np.ndarray | None = None, arith: Arithmetic = DEFAULT) -> np.ndarray:
        Y = self.terms[0].matmul(X, rows, arith)
        for t in self.terms[1:]:
            Y += t.matmul(X, rows, arith)
        return Y

    def reads(self, rows: np.ndarray | None = None) -> list[tuple[str, int]]:
        return [r for t in self.terms for r in t.reads(rows)]

    def parts(self) -> list[Matrix]:
        return [p for t in self.terms for p in t.parts()]

    def dense(self) -> np.ndarray:
        W = self.terms[0].dense().astype(np.float64)
        for t in self.terms[1:]:
            W += t.dense()
        return W.astype(np.float32)


def sparse_down_hook(model, tensors: dict, i: int, L: dict) -> None:
    """Every stored input-major ``X.t`` (the down projection of ``--sparse-down``; any projection
    of ``sparsify --input-major``: runtime.thresholds.INPUT_MAJOR) becomes the layer's operator
    ``X``, dense (``X.weight``) and sparse (``X.T``)."""
    for name in INPUT_MAJOR:
        if name + NEURON_MAJOR in L:
            op = NeuronRows(L.pop(name + NEURON_MAJOR), f"blk.{i}.{name}{NEURON_MAJOR}")
            L[f"{name}.weight"] = op
            L[f"{name}.T"] = op
