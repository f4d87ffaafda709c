"""Kernel-ready weight matrices built from GGUF tensors, each knowing its bytes per row."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Literal, Protocol

import numpy as np

from aios import quant
from aios.errors import InvalidModelError
from runtime import kernels as K
from runtime.kernels.type_traits import GGUF_TYPES


class Linear(Protocol):
    """What the forward pass needs from a weight operator y = W x.

    ``Matrix`` is the plain stored tensor; composite operators (low-rank + residual,
    canonical + delta) implement the same four members so the model and the byte counter
    treat them alike: ``reads`` must list exactly the bytes ``matmul`` touches.
    """

    name: str
    n_out: int
    n_in: int

    def matmul(self, X: np.ndarray, rows: np.ndarray | None = None,
               arith: K.Arithmetic = K.DEFAULT) -> np.ndarray: ...

    def reads(self, rows: np.ndarray | None = None) -> list[tuple[str, int]]: ...

    def parts(self) -> list["Matrix"]: ...

    def dense(self) -> np.ndarray: ...


@dataclass
class Matrix:
    """A 2-D weight (n_out rows × n_in columns, row-major as llama.cpp stores it)."""

    name: str
    kind: str  # one of SUPPORTED_TYPES (a key of KERNELS)
    n_out: int
    n_in: int
    data: np.ndarray  # F32: float32 (n, k); F16/BF16: uint16 (n, k); block types: uint8 (n, bytes per row)

    @property
    def row_bytes(self) -> int:
        """Bytes the kernel reads per row: exactly the file's bytes (block types: scales included)."""
        return self.data.shape[1] * self.data.itemsize

    @property
    def nbytes(self) -> int:
        return self.row_bytes * self.n_out

    def reads(self, rows: np.ndarray | None = None) -> list[tuple[str, int]]:
        """(tensor name, bytes) that ``matmul(X, rows)`` reads — what the byte counter adds."""
        return [(self.name, (self.n_out if rows is None else len(rows)) * self.row_bytes)]

    def parts(self) -> list["Matrix"]:
        """The stored matrices behind this operator (itself); composites list several."""
        return [self]

    def matmul(self, X: np.ndarray, rows: np.ndarray | None = None,
               arith: K.Arithmetic = K.DEFAULT) -> np.ndarray:
        """Y (T, n_out) = X (T, n_in) @ Wᵀ in ``arith``; only ``rows`` are computed (others stay 0)."""
        X = np.ascontiguousarray(X, dtype=np.float32)
        assert X.shape[1] == self.n_in, (self.name, X.shape, self.n_in)
        # every row written (the kernels' rows=None: indices computed, not loaded): no zeroing
        Y = (np.empty if rows is None else np.zeros)((X.shape[0], self.n_out), np.float32)
        K.threads_for((self.n_out if rows is None else len(rows)) * self.row_bytes * X.shape[0])
        KERNELS[self.kind].matmul(self, X, rows, Y, arith)
        return Y

    def rows_f32(self, rows: np.ndarray) -> np.ndarray:
        """Selected rows decoded to float32 (embedding look-ups read only these rows)."""
        return KERNELS[self.kind].rows(self, rows)

    def dense(self) -> np.ndarray:
        """Dequantized float32 copy (tests and transposition only)."""
        return KERNELS[self.kind].dense(self)


@dataclass
class TransposedMatrix:
    """Wᵀ stored row-contiguous (n_in rows of n_out): row j is input neuron j's column.

    Used for the FFN down projection in exact-sparse mode, so the rows of zero activations
    are never read. Built once at load time by an exact transpose of the stored values.
    """

    name: str
    kind: str  # F32 or F16/BF16 (uint16)
    data: np.ndarray  # (n_in, n_out)

    @property
    def row_bytes(self) -> int:
        return self.data.shape[1] * self.data.itemsize

    @property
    def n_out(self) -> int:
        return self.data.shape[1]

    @property
    def n_in(self) -> int:
        return self.data.shape[0]

    def sparse_matvec(self, a: np.ndarray, active: np.ndarray, arith: K.Arithmetic = K.DEFAULT) -> np.ndarray:
        """y = Σ_j a[j]·row_j over ``active``: a float axpy in any arithmetic (``arith`` unused)."""
        y = np.empty(self.data.shape[1], np.float32)
        K.threads_for(len(active) * self.row_bytes)
        KERNELS[self.kind].sparse(self.data, a, active, y)
        return y

    def sparse_reads(self, active: np.ndarray) -> list[tuple[str, int]]:
        """(tensor, bytes) ``sparse_matvec(a, active)`` reads: the rows of the active inputs."""
        return [(self.name, len(active) * self.row_bytes)]


# --- the kernel registry ------------------------------------------------------------------------
# What the runtime runs, one entry per GGUF tensor type: a type is supported exactly when it has
# an entry, so adding a type is adding a row here (and its kernel), not editing every method. The
# block types' entries follow the rows of runtime.kernels.type_traits (what each type's kernels
# are); the float types' are written out below.

Layout = Literal["elements", "blocks"]


@dataclass(frozen=True)
class KernelSpec:
    """How the runtime stores, multiplies and decodes one GGUF tensor type.

    ``layout`` says how ``from_gguf_tensor`` views the file's bytes, never copying them:
    "elements" keeps one value per element (F32 as float32, F16/BF16 as uint16 bits);
    "blocks" keeps each row's ggml blocks exactly as stored (uint8, fp16 scales interleaved
    with the quants), decoded in the kernel. Either way a row holds exactly the file's bytes,
    which the byte counter reports, and the matrix is a view of the mmap'd file.
    """

    layout: Layout
    load: Callable[[str, np.ndarray, int, int], np.ndarray]  # (kind, raw, n_out, n_in) -> Matrix.data
    matmul: Callable[[Matrix, np.ndarray, np.ndarray | None, np.ndarray, K.Arithmetic], None]  # (m, X, rows or None: all, Y, arith)
    dense: Callable[[Matrix], np.ndarray]  # the float32 (n_out, n_in) values
    rows: Callable[[Matrix, np.ndarray], np.ndarray]  # float32 values of selected rows (embeddings)
    sparse: Callable[..., None] | None = None  # sparse_rows_* over Wᵀ (float element types only)
    # Σ a[j]·row_j over neuron-major block rows (--sparse-down files), (W, a, active, y): every
    # block type has one (K.SPARSE_BLOCK_ROWS); None: the rows are decoded with ``rows`` first
    sparse_blocks: Callable[..., None] | None = None


def _load_f32(kind: str, raw: np.ndarray, n_out: int, n_in: int) -> np.ndarray:
    return raw.reshape(n_out, n_in)


def _load_u16(kind: str, raw: np.ndarray, n_out: int, n_in: int) -> np.ndarray:
    return raw.view(np.uint16).reshape(n_out, n_in)


def _load_blocks(kind: str, raw: np.ndarray, n_out: int, n_in: int) -> np.ndarray:
    # a view: row bytes = the stored bytes per row, scales included
    return raw.view(np.uint8).reshape(n_out, quant.row_bytes(kind, n_in))


def _rows_blocks(m: Matrix, rows: np.ndarray) -> np.ndarray:
    """Selected rows decoded by the kernels' per-type decoders on the calling thread, to the bit
    what gguf-py's dequantizer (the reference, tests/runtime/test_weights_in_place.py) gives."""
    return K.decode_rows_at(m.kind.lower(), m.data, rows)


def _dense_blocks(m: Matrix) -> np.ndarray:
    return m.rows_f32(np.arange(m.n_out))


def _blocks(kind: str) -> KernelSpec:
    """The entry of a block type: rows of the file's blocks, multiplied by ``K.mm_block_arith`` in
    the caller's arithmetic."""
    fmt = kind.lower()
    assert fmt in K.BLOCK_TYPES, kind

    def matmul(m: Matrix, X: np.ndarray, r: np.ndarray | None, Y: np.ndarray, arith: K.Arithmetic) -> None:
        K.mm_block_arith(fmt, m.data, X, r, Y, arith)

    return KernelSpec("blocks", _load_blocks, matmul, _dense_blocks, _rows_blocks)


KERNELS: dict[str, KernelSpec] = {  # keyed by gguf-py's type name; order = SUPPORTED_TYPES
    "F32": KernelSpec("elements", _load_f32, lambda m, X, r, Y, a: K.mm_f32(m.data, X, r, Y),
                      lambda m: np.array(m.data), lambda m, r: np.array(m.data[r], dtype=np.float32),
                      K.sparse_rows_f32),
    "F16": KernelSpec("elements", _load_u16, lambda m, X, r, Y, a: K.mm_f16_arith(m.data, X, r, Y, a),
                      lambda m: K.LUT_F16[m.data], lambda m, r: K.LUT_F16[m.data[r]], K.sparse_rows_f16),
    "BF16": KernelSpec("elements", _load_u16, lambda m, X, r, Y, a: K.mm_bf16(m.data, X, r, Y),
                       lambda m: K.LUT_BF16[m.data], lambda m, r: K.LUT_BF16[m.data[r]],
                       K.sparse_rows_bf16),
    **{k: _blocks(k) for k in GGUF_TYPES if K.TYPE_TRAITS[k.lower()].family != "float"},
}
assert tuple(KERNELS) == GGUF_TYPES  # an entry for each row of the type table, in its order
# every block type sums neuron-major rows in place (K.sparse_rows_<type>: a float axpy per active row)
KERNELS.update({k: replace(s, sparse_blocks=K.SPARSE_BLOCK_ROWS[k.lower()])
                for k, s in KERNELS.items() if s.layout == "blocks"})
SUPPORTED_TYPES = tuple(KERNELS)
# stored as the file's block rows, decoded in the kernel
BLOCK_TYPES = tuple(k for k, s in KERNELS.items() if s.layout == "blocks")
KQUANT_TYPES = tuple(k for k in BLOCK_TYPES if quant.block_size(k) == quant.QK_K)  # 256-value super-blocks


def from_gguf_tensor(t) -> Matrix:
    """A Matrix over a ``gguf.ReaderTensor``: a view of the reader's mmap, nothing copied."""
    kind = t.tensor_type.name
    if kind not in KERNELS:
        raise InvalidModelError(
            f"Tensor '{t.name}' has type {kind}; the runtime supports {', '.join(SUPPORTED_TYPES)}."
        )
    n_in, n_out = (int(x) for x in t.shape[:2]) if len(t.shape) >= 2 else (int(t.shape[0]), 1)
    return Matrix(t.name, kind, n_out, n_in, KERNELS[kind].load(kind, np.asarray(t.data), n_out, n_in))


def vector(t) -> np.ndarray:
    """A 1-D float tensor (norm weights, biases) as float32."""
    from gguf import dequantize

    return dequantize(t.data, t.tensor_type).reshape(-1).astype(np.float32)


def transpose(m: Matrix) -> TransposedMatrix:
    spec = KERNELS.get(m.kind)
    if spec is not None and spec.sparse is not None:
        return TransposedMatrix(m.name + ".T", m.kind, np.ascontiguousarray(m.data.T))
    # block-quantized rows cannot be transposed exactly: the file must store them neuron-major
    raise InvalidModelError(
        f"Exact sparse execution of a {m.kind} down projection needs it stored neuron-major "
        f"('{m.name}' is d_model rows of d_ffn, quantized across neurons); export with "
        "`aios-convert gguf MODEL --outtype TYPE --sparse-down`, or run --mode dense."
    )
