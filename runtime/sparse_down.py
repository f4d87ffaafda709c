"""The neuron-major FFN down projection (``aios-convert gguf --sparse-down``): ``blk.N.ffn_down.t``.

The file stores Wᵀ (d_ffn rows of d_model, each row quantized along d_model) instead of
``ffn_down.weight``: a neuron whose activation is zero is one row never read, in any tensor type,
so exact-sparse, map and predict modes save its bytes in the quantized formats people deploy (the
standard layout quantizes along d_ffn, where a block of 32 or 256 neurons is read unless every one
of them is silent). The layer hook below gives the forward pass the same two operators as a float
file: ``ffn_down.weight`` (dense: every row) and ``ffn_down.T`` (sparse: the rows of firing
neurons), both over the stored rows; bytes counted are the rows' stored bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from runtime.weights import KERNELS, Matrix


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

    def sparse_matvec(self, a: np.ndarray, active: np.ndarray) -> np.ndarray:
        """y (d_model,) = Σ_j a[j] · row_j over ``active`` neurons; reads only those rows."""
        spec = KERNELS[self.m.kind]
        # float rows (F32/F16/BF16), or every block type's blocks read in place (kernels.sparse_block_rows):
        # a float axpy, a[j] times the row's decoded values, whatever the process's arithmetic
        kernel = spec.sparse or spec.sparse_blocks
        if kernel is None:
            return self._decode_rows_matvec(a, active)
        y = np.empty(self.n_out, np.float32)
        kernel(self.m.data, np.ascontiguousarray(a, dtype=np.float32), active, y)
        return y

    def _decode_rows_matvec(self, a: np.ndarray, active: np.ndarray) -> np.ndarray:
        """The same sum for a type without a sparse kernel (none today): the active rows decoded by
        gguf-py first (exact, reads the same bytes, 15-200x slower than a kernel)."""
        rows = self.m.rows_f32(active)  # (k, d_model) decoded from the active rows' blocks only
        return (a[active].astype(np.float64) @ rows.astype(np.float64)).astype(np.float32)

    def matmul(self, X: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
        assert rows is None, "the down projection is never computed for a subset of its outputs"
        X = np.ascontiguousarray(X, dtype=np.float32)
        Y = np.empty((X.shape[0], self.n_out), np.float32)
        every = np.arange(self.n_in, dtype=np.int64)
        for t in range(X.shape[0]):
            Y[t] = self.sparse_matvec(X[t], every)
        return Y

    def reads(self, rows: np.ndarray | None = None) -> list[tuple[str, int]]:
        return [(self.m.name, self.m.nbytes)]

    def parts(self) -> list[Matrix]:
        return [self.m]

    def dense(self) -> np.ndarray:
        return self.m.dense().T.copy()


def sparse_down_hook(model, tensors: dict, i: int, L: dict) -> None:
    """A stored ``ffn_down.t`` becomes the layer's down projection, dense and sparse."""
    if "ffn_down.t" not in L:
        return
    op = NeuronRows(L.pop("ffn_down.t"), f"blk.{i}.ffn_down.t")
    L["ffn_down.weight"] = op
    L["ffn_down.T"] = op
