"""Kernel-ready weight matrices built from GGUF tensors, each knowing its bytes per row."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from aios.errors import InvalidModelError
from runtime import kernels as K
from runtime import kernels_k as KK

KQUANT_TYPES = ("Q2_K", "Q4_K", "Q6_K")  # stored as raw GGUF block rows, decoded in the kernel
SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0") + KQUANT_TYPES


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
    kind: str  # one of SUPPORTED_TYPES
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
        if self.kind == "F32":
            K.mm_f32(self.data, X, r, Y)
        elif self.kind == "F16":
            K.mm_f16(self.data, X, r, Y)
        elif self.kind == "BF16":
            K.mm_bf16(self.data, X, r, Y)
        elif self.kind == "Q8_0":
            K.mm_q8_0(self.data, self.scales, K.LUT_F16, X, r, Y)
        elif self.kind == "Q4_0":
            K.mm_q4_0(self.data, self.scales, K.LUT_F16, X, r, Y)
        elif self.kind == "Q4_K":
            KK.mm_q4_k(self.data, K.LUT_F16, X, KK.xsum(X, 32), r, Y)
        elif self.kind == "Q2_K":
            KK.mm_q2_k(self.data, K.LUT_F16, X, KK.xsum(X, 16), r, Y)
        else:
            KK.mm_q6_k(self.data, K.LUT_F16, X, r, Y)
        return Y

    def rows_f32(self, rows: np.ndarray) -> np.ndarray:
        """Selected rows decoded to float32 (embedding look-ups read only these rows)."""
        from gguf import GGMLQuantizationType, dequantize

        assert self.kind in KQUANT_TYPES, self.kind
        return dequantize(self.data[rows], GGMLQuantizationType[self.kind]).astype(np.float32)

    def dense(self) -> np.ndarray:
        """Dequantized float32 copy (tests and transposition only)."""
        if self.kind == "F32":
            return np.array(self.data)
        if self.kind == "F16":
            return K.LUT_F16[self.data]
        if self.kind == "BF16":
            return K.LUT_BF16[self.data]
        if self.kind in KQUANT_TYPES:
            return self.rows_f32(np.arange(self.n_out))
        eye = np.eye(self.n_in, dtype=np.float32)
        return self.matmul(eye).T.copy()


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
        if self.kind == "F32":
            K.sparse_rows_f32(self.data, a, active, y)
        elif self.kind == "F16":
            K.sparse_rows_f16(self.data, a, active, y)
        else:
            K.sparse_rows_bf16(self.data, a, active, y)
        return y


def from_gguf_tensor(t) -> Matrix:
    """A Matrix over a ``gguf.ReaderTensor`` (mmap views where the layout allows)."""
    kind = t.tensor_type.name
    if kind not in SUPPORTED_TYPES:
        raise InvalidModelError(
            f"Tensor '{t.name}' has type {kind}; the runtime supports {', '.join(SUPPORTED_TYPES)}."
        )
    n_in, n_out = (int(x) for x in t.shape[:2]) if len(t.shape) >= 2 else (int(t.shape[0]), 1)
    raw = np.asarray(t.data)
    if kind == "F32":
        return Matrix(t.name, kind, n_out, n_in, raw.reshape(n_out, n_in))
    if kind in ("F16", "BF16"):
        return Matrix(t.name, kind, n_out, n_in, raw.view(np.uint16).reshape(n_out, n_in))
    if kind in KQUANT_TYPES:  # row_bytes = the stored bytes per row, scales included
        row = n_in // KK.QK_K * KK.BLOCK_BYTES[kind]
        return Matrix(t.name, kind, n_out, n_in, raw.view(np.uint8).reshape(n_out, row))
    blk = 34 if kind == "Q8_0" else 18
    nb = n_in // K.QK
    blocks = raw.reshape(n_out, nb, blk)
    scales = np.ascontiguousarray(blocks[:, :, :2]).view(np.uint16).reshape(n_out, nb)
    qs = np.ascontiguousarray(blocks[:, :, 2:]).reshape(n_out, -1)
    if kind == "Q8_0":
        qs = qs.view(np.int8)
    return Matrix(t.name, kind, n_out, n_in, qs, scales)


def vector(t) -> np.ndarray:
    """A 1-D float tensor (norm weights, biases) as float32."""
    from gguf import dequantize

    return dequantize(t.data, t.tensor_type).reshape(-1).astype(np.float32)


def transpose(m: Matrix) -> TransposedMatrix:
    if m.kind in ("F32", "F16", "BF16"):
        return TransposedMatrix(m.name + ".T", m.kind, np.ascontiguousarray(m.data.T))
    # block-quantized rows cannot be transposed exactly; exact-sparse needs F32/F16/BF16 down
    raise InvalidModelError(
        f"Exact sparse execution needs '{m.name}' in F32, F16 or BF16 (it is {m.kind}); "
        "export with --outtype f32/f16/bf16 or run dense."
    )
