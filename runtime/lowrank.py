"""Low-rank + residual weights (``aios-convert svd-residual``) in the runtime: y = U(Vx) + Q(E)x.

A layer hook (listed in ``runtime.extensions.LAYER_HOOKS``) finds ``blk.N.X.lr_u`` /
``blk.N.X.lr_v`` / optional ``blk.N.X.residual`` and puts a :class:`LowRankLinear` under
``"X.weight"``, so the forward pass and the byte counter see one operator:

* V (r × n_in) is read whole for every call (all of Vx is needed);
* U (n_out × r) and the residual are read only for the output rows computed;
* a residual stored *flat* (1-D, row-major, K-quant super-blocks spanning rows) is read
  block by block: the blocks covering the rows computed, each once, decoded from the stored
  bytes by gguf-py's dequantizer (no numba kernel multiplies K-quant blocks that span rows).

``reads()`` lists exactly those bytes, so measured MB/token is what the operator touches.

A file written with ``--sparse-down`` stores each FFN down projection's V and residual
neuron-major: ``blk.N.ffn_down.lr_v.t`` (Vᵀ, d_ffn rows of r) and ``blk.N.ffn_down.residual.t``
(Eᵀ, d_ffn rows of d_model, quantized along d_model), U as is (``.lr_u``, d_model × r). The hook
makes it a :class:`runtime.sparse_down.NeuronMajorSum` (U·(V a) + E a) under ``ffn_down.weight``
and ``ffn_down.T``, so the sparse modes read the firing neurons' rows of Vᵀ and Eᵀ, and U whole.
A standard-layout low-rank down projection has no per-neuron rows: the sparse modes refuse it.
Measuring a whole GGUF (perplexity, MB/token) runs the model: ``runtime.evaluate``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from aios import quant
from aios.errors import InvalidModelError, UsageError
from runtime.kernels.arithmetic import DEFAULT, Arithmetic
from runtime.sparse_down import NEURON_MAJOR, FactoredRows, NeuronMajorSum, NeuronRows
from runtime.weights import Matrix, from_gguf_tensor

SUFFIXES = (".lr_u", ".lr_v", ".residual")
NEURON_MAJOR_SUFFIXES = (".lr_v" + NEURON_MAJOR, ".residual" + NEURON_MAJOR)  # --sparse-down: Vᵀ, Eᵀ


@dataclass
class FlatResidual:
    """Residual E (n_out × n_in) stored as 1-D row-major blocks of a GGML block type."""

    name: str
    kind: str  # GGML type name, e.g. Q2_K
    n_out: int
    n_in: int
    raw: np.ndarray  # uint8 (n_blocks, type_size), a view of the file
    block: int  # values per block

    @property
    def nbytes(self) -> int:
        return int(self.raw.nbytes)

    def _blocks(self, rows: np.ndarray | None) -> np.ndarray:
        """Indices of the blocks holding ``rows`` (all blocks for None), ascending, unique."""
        if rows is None:
            return np.arange(self.raw.shape[0])
        r = np.asarray(rows, dtype=np.int64)
        first, last = r * self.n_in // self.block, ((r + 1) * self.n_in - 1) // self.block
        return np.unique(np.concatenate([np.arange(a, b + 1) for a, b in zip(first, last)] or [np.zeros(0, np.int64)]))

    def reads(self, rows: np.ndarray | None = None) -> list[tuple[str, int]]:
        return [(self.name, len(self._blocks(rows)) * self.raw.shape[1])]

    def parts(self) -> list["FlatResidual"]:
        return [self]

    def _values(self, blocks: np.ndarray) -> np.ndarray:
        """Flat float32 values with the given blocks decoded (others zero)."""
        import gguf

        flat = np.zeros(self.raw.shape[0] * self.block, np.float32)
        qtype = quant.qtype(self.kind)
        vals = gguf.dequantize(np.ascontiguousarray(self.raw[blocks]).reshape(-1), qtype).reshape(-1, self.block)
        flat.reshape(-1, self.block)[blocks] = vals
        return flat[: self.n_out * self.n_in].reshape(self.n_out, self.n_in)

    def matmul(self, X: np.ndarray, rows: np.ndarray | None = None, arith: Arithmetic = DEFAULT) -> np.ndarray:
        E = self._values(self._blocks(rows))
        Y = np.zeros((X.shape[0], self.n_out), np.float32)
        r = np.arange(self.n_out) if rows is None else np.asarray(rows, dtype=np.int64)
        Y[:, r] = X.astype(np.float32) @ E[r].T
        return Y

    def dense(self) -> np.ndarray:
        return self._values(self._blocks(None))


@dataclass
class LowRankLinear:
    """y = U (V x) + R x, implementing ``runtime.weights.Linear``."""

    name: str  # blk.N.X.weight, the tensor it stands for
    U: Matrix  # (n_out, r)
    V: Matrix  # (r, n_in)
    R: Matrix | FlatResidual | None

    @property
    def n_out(self) -> int:
        return self.U.n_out

    @property
    def n_in(self) -> int:
        return self.V.n_in

    @property
    def rank(self) -> int:
        return self.V.n_out

    def matmul(self, X: np.ndarray, rows: np.ndarray | None = None, arith: Arithmetic = DEFAULT) -> np.ndarray:
        Z = self.V.matmul(X, None, arith)  # (T, r): every rank component is needed
        Y = self.U.matmul(Z, rows, arith)  # (T, n_out), only ``rows`` computed
        if self.R is not None:
            Y += self.R.matmul(X, rows, arith)
        return Y

    def reads(self, rows: np.ndarray | None = None) -> list[tuple[str, int]]:
        out = self.V.reads(None) + self.U.reads(rows)
        return out + (self.R.reads(rows) if self.R is not None else [])

    def parts(self) -> list:
        return [self.U, self.V] + ([self.R] if self.R is not None else [])

    def dense(self) -> np.ndarray:
        W = self.U.dense().astype(np.float64) @ self.V.dense().astype(np.float64)
        if self.R is not None:
            W += self.R.dense()
        return W.astype(np.float32)


def _matrix(t, n_out: int, n_in: int) -> Matrix:
    """A Matrix for a factor even when one side is 1 (the generic loader treats that as 1-D)."""
    m = from_gguf_tensor(t)
    if (m.n_out, m.n_in) != (n_out, n_in):
        raise InvalidModelError(f"Tensor '{t.name}' has shape {m.n_out}×{m.n_in}, expected {n_out}×{n_in}.")
    return m


def _residual(t, n_out: int, n_in: int) -> Matrix | FlatResidual:
    import gguf

    if len(t.shape) >= 2:
        return _matrix(t, n_out, n_in)
    kind = t.tensor_type.name
    block, size = gguf.GGML_QUANT_SIZES[t.tensor_type]
    n = int(t.shape[0])
    if n != n_out * n_in or n % block:
        raise InvalidModelError(f"Flat residual '{t.name}' holds {n} values, expected {n_out}×{n_in}.")
    raw = np.asarray(t.data).view(np.uint8).reshape(n // block, size)
    return FlatResidual(t.name, kind, n_out, n_in, raw, block)


def lowrank_hook(model, tensors: dict, i: int, L: dict) -> None:
    """LAYER_HOOKS entry: replace ``X.weight`` by LowRankLinear wherever ``X.lr_u`` exists."""
    prefix = f"blk.{i}."
    bases = sorted(k[len(prefix):-len(".lr_u")] for k in tensors if k.startswith(prefix) and k.endswith(".lr_u"))
    for base in bases:
        full = prefix + base
        if full + ".lr_v" not in tensors and full + ".lr_v" + NEURON_MAJOR in tensors:
            _neuron_major_hook(model, tensors, L, base, full)
            continue
        if full + ".lr_v" not in tensors:
            raise InvalidModelError(f"{model.path.name}: '{full}.lr_u' has no matching '{full}.lr_v'.")
        if full + ".weight" in tensors:
            raise InvalidModelError(f"{model.path.name} has both '{full}.weight' and its low-rank factors.")
        tu, tv = tensors[full + ".lr_u"], tensors[full + ".lr_v"]
        r = int(tu.shape[0])
        n_out, n_in = int(tu.shape[1]) if len(tu.shape) > 1 else 1, int(tv.shape[0])
        U, V = _matrix(tu, n_out, r), _matrix(tv, r, n_in)
        R = _residual(tensors[full + ".residual"], n_out, n_in) if full + ".residual" in tensors else None
        for s in SUFFIXES:
            L.pop(base + s, None)
        L[base + ".weight"] = LowRankLinear(full + ".weight", U, V, R)
        if base == "ffn_down" and model.mode != "dense":
            raise UsageError(
                f"--mode {model.mode} reads single rows of a plain ffn_down, but {model.path.name} stores it "
                "as low-rank factors in the standard layout; run --mode dense, or convert with "
                "`aios-convert svd-residual MODEL --sparse-down` (V and the residual stored neuron-major)."
            )


def _neuron_major_hook(model, tensors: dict, L: dict, base: str, full: str) -> None:
    """``X.lr_u`` (n_out × r) + ``X.lr_v.t`` (n_in rows of r) [+ ``X.residual.t`` (n_in rows of
    n_out)] as one neuron-major operator, dense under ``X.weight`` and sparse under ``X.T``."""
    if full + ".weight" in tensors or full + ".residual" in tensors:
        raise InvalidModelError(f"{model.path.name} mixes a neuron-major '{full}.lr_v.t' with a standard-layout "
                                f"'{full}.weight' or '{full}.residual'.")
    tu, tv = tensors[full + ".lr_u"], tensors[full + ".lr_v" + NEURON_MAJOR]
    r = int(tu.shape[0])
    n_out = int(tu.shape[1]) if len(tu.shape) > 1 else 1
    n_in = int(tv.shape[1]) if len(tv.shape) > 1 else 1
    U, Vt = _matrix(tu, n_out, r), _matrix(tv, n_in, r)
    terms: list = [FactoredRows(full + ".weight", U, NeuronRows(Vt, tv.name))]
    tr = tensors.get(full + ".residual" + NEURON_MAJOR)
    if tr is not None:
        if len(tr.shape) < 2:
            raise InvalidModelError(f"Neuron-major residual '{tr.name}' must be stored as rows (d_ffn × d_model).")
        terms.append(NeuronRows(_matrix(tr, n_in, n_out), tr.name))
    for s in (".lr_u",) + NEURON_MAJOR_SUFFIXES:
        L.pop(base + s, None)
    L[base + ".weight"] = L[base + ".T"] = NeuronMajorSum(full + ".weight", tuple(terms))
