"""Kernel-ready weight matrices built from GGUF tensors, each knowing its bytes per row."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal, Protocol

import numpy as np

from aios import quant
from aios.errors import InvalidModelError
from runtime import kernels as K
from runtime import kernels_k as KK


class Linear(Protocol):
    """What the forward pass needs from a weight operator y = W x.

    ``Matrix`` is the plain stored tensor; composite operators (low-rank + residual,
    canonical + delta) implement the same four members so the model and the byte counter
    treat them alike: ``reads`` must list exactly the bytes ``matmul`` touches.
    """

    name: str
    n_out: int
    n_in: int

    def matmul(self, X: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray: ...

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
    data: np.ndarray  # F32: float32 (n, k); F16/BF16: uint16 (n, k); Q*_0: int8/uint8 quants; Q*_K: raw block bytes
    scales: np.ndarray | None = None  # Q8_0/Q4_0: fp16 bits as uint16 (n, k/32), decoded in the kernel

    @property
    def row_bytes(self) -> int:
        """Bytes the kernel reads per row: quants + fp16 scales, exactly the file's bytes."""
        b = self.data.shape[1] * self.data.itemsize
        if self.scales is not None:
            b += self.scales.shape[1] * self.scales.itemsize
        return b

    @property
    def nbytes(self) -> int:
        return self.row_bytes * self.n_out

    def reads(self, rows: np.ndarray | None = None) -> list[tuple[str, int]]:
        """(tensor name, bytes) that ``matmul(X, rows)`` reads — what the byte counter adds."""
        return [(self.name, (self.n_out if rows is None else len(rows)) * self.row_bytes)]

    def parts(self) -> list["Matrix"]:
        """The stored matrices behind this operator (itself); composites list several."""
        return [self]

    def matmul(self, X: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
        """Y (T, n_out) = X (T, n_in) @ Wᵀ; only ``rows`` are computed (others stay 0)."""
        X = np.ascontiguousarray(X, dtype=np.float32)
        assert X.shape[1] == self.n_in, (self.name, X.shape, self.n_in)
        Y = np.zeros((X.shape[0], self.n_out), np.float32)
        r = np.arange(self.n_out, dtype=np.int64) if rows is None else rows
        KERNELS[self.kind].matmul(self, X, r, Y)
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

    def sparse_matvec(self, a: np.ndarray, active: np.ndarray) -> np.ndarray:
        y = np.empty(self.data.shape[1], np.float32)
        KERNELS[self.kind].sparse(self.data, a, active, y)
        return y


# --- the kernel registry ------------------------------------------------------------------------
# What the runtime runs, one entry per GGUF tensor type: a type is supported exactly when it has
# an entry, so adding a type is adding a row here (and its kernel), not editing every method.

Layout = Literal["elements", "split", "blocks"]
Loaded = tuple[np.ndarray, np.ndarray | None]  # (Matrix.data, Matrix.scales)


@dataclass(frozen=True)
class KernelSpec:
    """How the runtime stores, multiplies and decodes one GGUF tensor type.

    ``layout`` says how ``from_gguf_tensor`` arranges the file's bytes: "elements" keeps one
    value per element (F32 as float32, F16/BF16 as uint16 bits); "split" separates each
    block's fp16 scale from its quants (Q8_0/Q4_0: ``Matrix.scales``, so the kernel reads
    16 scales as one vector); "blocks" keeps whole K-quant super-blocks per row, decoded in
    the kernel. Either way a row holds exactly the file's bytes, which the byte counter reports.
    """

    layout: Layout
    load: Callable[[str, np.ndarray, int, int], Loaded]  # (kind, raw, n_out, n_in)
    matmul: Callable[[Matrix, np.ndarray, np.ndarray, np.ndarray], None]  # (m, X, rows, Y)
    dense: Callable[[Matrix], np.ndarray]  # the float32 (n_out, n_in) values
    rows: Callable[[Matrix, np.ndarray], np.ndarray]  # float32 values of selected rows (embeddings)
    sparse: Callable[..., None] | None = None  # sparse_rows_* over Wᵀ (float element types only)


def _load_f32(kind: str, raw: np.ndarray, n_out: int, n_in: int) -> Loaded:
    return raw.reshape(n_out, n_in), None


def _load_u16(kind: str, raw: np.ndarray, n_out: int, n_in: int) -> Loaded:
    return raw.view(np.uint16).reshape(n_out, n_in), None


def _load_blocks(kind: str, raw: np.ndarray, n_out: int, n_in: int) -> Loaded:
    # row bytes = the stored bytes per row, scales included
    return raw.view(np.uint8).reshape(n_out, quant.row_bytes(kind, n_in)), None


def _load_split(quants: type[np.integer]) -> Callable[[str, np.ndarray, int, int], Loaded]:
    """Loader for ggml's {half d; quants} blocks: fp16 scale bits and ``quants``-typed quants."""

    def load(kind: str, raw: np.ndarray, n_out: int, n_in: int) -> Loaded:
        nb = n_in // quant.block_size(kind)
        blocks = raw.reshape(n_out, nb, quant.type_size(kind))
        scales = np.ascontiguousarray(blocks[:, :, :2]).view(np.uint16).reshape(n_out, nb)
        qs = np.ascontiguousarray(blocks[:, :, 2:]).reshape(n_out, -1).view(quants)
        return qs, scales

    return load


def _rows_split(m: Matrix, rows: np.ndarray) -> np.ndarray:
    """Q8_0/Q4_0 rows decoded with numpy: quants times their block's fp16 scale (Q4_0: low
    nibbles are a block's first half, high nibbles its second, both offset by 8)."""
    qs, d = m.data[rows], K.LUT_F16[m.scales[rows]]  # type: ignore[index]
    n, block = len(rows), quant.block_size(m.kind)
    nb = m.n_in // block
    if m.kind == "Q8_0":
        vals = qs.reshape(n, nb, block).astype(np.float32)
    else:
        q = qs.reshape(n, nb, block // 2)
        vals = np.concatenate([(q & 15).astype(np.float32) - 8, (q >> 4).astype(np.float32) - 8], axis=2)
    out = np.zeros((n, m.n_in), np.float32)
    out[:] = (vals * d[:, :, None]).reshape(n, -1)
    return out


def _rows_kquant(m: Matrix, rows: np.ndarray) -> np.ndarray:
    from gguf import dequantize

    return dequantize(m.data[rows], quant.qtype(m.kind)).astype(np.float32)


def _dense_by_matmul(m: Matrix) -> np.ndarray:
    eye = np.eye(m.n_in, dtype=np.float32)
    return m.matmul(eye).T.copy()


def _dense_kquant(m: Matrix) -> np.ndarray:
    return m.rows_f32(np.arange(m.n_out))


KERNELS: dict[str, KernelSpec] = {  # keyed by gguf-py's type name; order = SUPPORTED_TYPES
    "F32": KernelSpec("elements", _load_f32, lambda m, X, r, Y: K.mm_f32(m.data, X, r, Y),
                      lambda m: np.array(m.data), lambda m, r: np.array(m.data[r], dtype=np.float32),
                      K.sparse_rows_f32),
    "F16": KernelSpec("elements", _load_u16, lambda m, X, r, Y: K.mm_f16(m.data, X, r, Y),
                      lambda m: K.LUT_F16[m.data], lambda m, r: K.LUT_F16[m.data[r]], K.sparse_rows_f16),
    "BF16": KernelSpec("elements", _load_u16, lambda m, X, r, Y: K.mm_bf16(m.data, X, r, Y),
                       lambda m: K.LUT_BF16[m.data], lambda m, r: K.LUT_BF16[m.data[r]],
                       K.sparse_rows_bf16),
    "Q8_0": KernelSpec("split", _load_split(np.int8),
                       lambda m, X, r, Y: K.mm_q8_0(m.data, m.scales, K.LUT_F16, X, r, Y),
                       _dense_by_matmul, _rows_split),
    "Q4_0": KernelSpec("split", _load_split(np.uint8),
                       lambda m, X, r, Y: K.mm_q4_0(m.data, m.scales, K.LUT_F16, X, r, Y),
                       _dense_by_matmul, _rows_split),
    "Q2_K": KernelSpec("blocks", _load_blocks,
                       lambda m, X, r, Y: KK.mm_q2_k(m.data, K.LUT_F16, X,
                                                     KK.xsum(X, KK.SUB_BLOCK["Q2_K"]), r, Y),
                       _dense_kquant, _rows_kquant),
    "Q4_K": KernelSpec("blocks", _load_blocks,
                       lambda m, X, r, Y: KK.mm_q4_k(m.data, K.LUT_F16, X,
                                                     KK.xsum(X, KK.SUB_BLOCK["Q4_K"]), r, Y),
                       _dense_kquant, _rows_kquant),
    "Q6_K": KernelSpec("blocks", _load_blocks,
                       lambda m, X, r, Y: KK.mm_q6_k(m.data, K.LUT_F16, X, r, Y), _dense_kquant,
                       _rows_kquant),
}
SUPPORTED_TYPES = tuple(KERNELS)
# stored as raw GGUF block rows, decoded in the kernel
KQUANT_TYPES = tuple(k for k, s in KERNELS.items() if s.layout == "blocks")


def from_gguf_tensor(t) -> Matrix:
    """A Matrix over a ``gguf.ReaderTensor`` (mmap views where the layout allows)."""
    kind = t.tensor_type.name
    if kind not in KERNELS:
        raise InvalidModelError(
            f"Tensor '{t.name}' has type {kind}; the runtime supports {', '.join(SUPPORTED_TYPES)}."
        )
    n_in, n_out = (int(x) for x in t.shape[:2]) if len(t.shape) >= 2 else (int(t.shape[0]), 1)
    data, scales = KERNELS[kind].load(kind, np.asarray(t.data), n_out, n_in)
    return Matrix(t.name, kind, n_out, n_in, data, scales)


def vector(t) -> np.ndarray:
    """A 1-D float tensor (norm weights, biases) as float32."""
    from gguf import dequantize

    return dequantize(t.data, t.tensor_type).reshape(-1).astype(np.float32)


def transpose(m: Matrix) -> TransposedMatrix:
    spec = KERNELS.get(m.kind)
    if spec is not None and spec.sparse is not None:
        return TransposedMatrix(m.name + ".T", m.kind, np.ascontiguousarray(m.data.T))
    # block-quantized rows cannot be transposed exactly; exact-sparse needs F32/F16/BF16 down
    raise InvalidModelError(
        f"Exact sparse execution needs '{m.name}' in F32, F16 or BF16 (it is {m.kind}); "
        "export with --outtype f32/f16/bf16 or run dense."
    )
