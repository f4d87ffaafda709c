"""Fused weights split into the operators the forward pass calls.

Phi-3 stores the FFN's gate and up projections as one matrix ``ffn_up`` of 2·d_ffn rows (gate
first, as llama.cpp's SwiGLU splits it). The layer hook below hands the forward pass two views
of that stored matrix, ``ffn_gate`` and ``ffn_up``, so dense, exact-sparse, map and predict modes
treat it like any gated FFN; only the rows a mode computes are read and counted.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from runtime.kernels.arithmetic import DEFAULT, Arithmetic
from runtime.weights import Linear


@dataclass
class RowSlice:
    """Rows ``start:start + n_out`` of a stored operator, itself a ``runtime.weights.Linear``."""

    base: Linear
    start: int
    n_out: int
    name: str

    @property
    def n_in(self) -> int:
        return self.base.n_in

    def _rows(self, rows: np.ndarray | None) -> np.ndarray:
        own = np.arange(self.n_out, dtype=np.int64) if rows is None else np.asarray(rows, np.int64)
        return own + self.start

    def matmul(self, X: np.ndarray, rows: np.ndarray | None = None, arith: Arithmetic = DEFAULT) -> np.ndarray:
        return self.base.matmul(X, self._rows(rows), arith)[:, self.start:self.start + self.n_out]

    def reads(self, rows: np.ndarray | None = None) -> list[tuple[str, int]]:
        return self.base.reads(self._rows(rows))

    def parts(self) -> list:
        return self.base.parts()  # the stored matrix, counted once however many views share it

    def dense(self) -> np.ndarray:
        return self.base.dense()[self.start:self.start + self.n_out]


def fused_gate_up_hook(model, tensors: dict, i: int, L: dict) -> None:
    """Split a fused [gate; up] ``ffn_up`` (rows 2·d_ffn) into ``ffn_gate`` and ``ffn_up`` views."""
    if not model.hp.graph.fused_gate_up or "ffn_up.weight" not in L:
        return
    fused, f = L["ffn_up.weight"], model.hp.d_ffn
    if fused.n_out != 2 * f:
        return  # wrong shape: the layer check names it
    L["ffn_gate.weight"] = RowSlice(fused, 0, f, f"blk.{i}.ffn_up.weight[gate]")
    L["ffn_up.weight"] = RowSlice(fused, f, f, f"blk.{i}.ffn_up.weight[up]")
