"""The arithmetic a matmul runs in, as a value the caller passes down to the kernels.

``Model(path, arithmetic="int16")`` builds one ``Arithmetic`` and hands it to every matmul of
its forward pass (``Linear.matmul(X, rows, arith)`` → ``dispatch.mm_block_arith(..., arith)``);
perplexity and the checker pass theirs per call (``Model.forward(..., arith=...)``). Nothing
here is process-wide: two models in one process run two arithmetics, and a reader follows the
parameter from ``--arithmetic`` to the kernel that runs it (torchao's config objects, not a
global switch).

The value also carries what one call of the forward pass lends its matmuls: the output head's
flag (``for_head``), the int8 blocks of an input several matrices share (``sharing``), and the
unpacked rows kept across perplexity's windows or R1's passes (``keeping``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace

import numpy as np

ARITHMETICS = ("int8", "float", "int16", "llamacpp")  # --arithmetic choices; the first is the default
GGML_ARITHMETICS = ("int8", "llamacpp")  # llama.cpp's arithmetic: int8 blocks, ggml's small operations

# T at and above which a whole-matrix product goes through the GEMM (rows None), and attention
# through runtime.attention_gemm (docs/benchmarks.md, "GEMM crossover": below 32 tokens BLAS is
# slower than the one-token kernels on so few rows).
GEMM_MIN_TOKENS = 32


def _batched_default() -> bool:
    # AIOS_BATCHED_GEMM=0 starts a process whose arithmetics default to the one-token kernels
    return os.environ.get("AIOS_BATCHED_GEMM", "1") != "0"


class SharedInput:
    """The activation blocks of one input X, made once for the several matmuls that read it
    (q/k/v read one normed vector, gate/up another). The caller must not change X meanwhile."""

    __slots__ = ("x", "made")

    def __init__(self, X: np.ndarray) -> None:
        self.x = X
        self.made: dict = {}

    def get(self, X: np.ndarray, key, make):
        """``make()`` for X, made once per ``key`` when X is the shared input."""
        if X is not self.x:
            return make()
        if key not in self.made:
            self.made[key] = make()
        return self.made[key]


@dataclass(frozen=True)
class Arithmetic:
    """How the block kernels multiply: ``name`` is one of ARITHMETICS —

    * "int8" (the default): activations quantized to int8 blocks per matmul, integer block dot
      products, what llama.cpp computes (types without an int8 kernel stay float);
    * "float": weights decoded to float times float activations (exact to float32 rounding);
    * "int16": float, except that many-token matmuls on integer tiles take the activations as
      two int8 planes (16-bit values): the float results to ~1/32,000 of a block's largest
      activation, at the tiles' speed; what perplexity is measured in;
    * "llamacpp": int8 with each sum in llama.cpp's order where a kernel mirrors it
      (runtime.kernels.ggml_order): bit-identical logits on its plain CPU buffers, slower.

    ``batched``: many-token products (from GEMM_MIN_TOKENS) as GEMMs or integer tiles; False runs
    them token by token in the one-token kernels, whose int8 sums are llama.cpp's one-token ones
    (the tests comparing llama.cpp's intermediate tensors with ours). Default: on, unless the
    environment has ``AIOS_BATCHED_GEMM=0``.
    """

    name: str = ARITHMETICS[0]
    batched: bool = field(default_factory=_batched_default)
    head: bool = False  # the output head's matmul: under int16 one activation plane (for_head)
    kept: object | None = None  # a kernels.KeptRows: unpacked rows kept across passes (keeping)
    shared: SharedInput | None = None  # the input shared by the next matmuls (sharing)

    def __post_init__(self) -> None:
        if self.name not in ARITHMETICS:
            from aios.errors import UsageError

            raise UsageError(f"Unknown arithmetic '{self.name}'; choose from {', '.join(ARITHMETICS)}.")

    @classmethod
    def of(cls, value: str | Arithmetic | None) -> Arithmetic:
        """``value`` as an Arithmetic: a name, an Arithmetic (kept), or None (the default)."""
        if isinstance(value, Arithmetic):
            return value
        return cls() if value is None else cls(value)

    @property
    def ggml(self) -> bool:
        """Whether this is llama.cpp's arithmetic (int8 blocks; ggml's small operations)."""
        return self.name in GGML_ARITHMETICS

    def use_gemm(self, tokens: int) -> bool:
        """Whether ``tokens`` queries (or rows of X) take the GEMM / tile form."""
        return self.batched and tokens >= GEMM_MIN_TOKENS

    def for_head(self) -> Arithmetic:
        """This arithmetic for the model's output head. Under "int16" the head's many-token
        matmul takes its activations in one int8 plane where integer tiles run it: the input's
        8-bit rounding reaches the logits once, not through later layers (held-out perplexity of
        the real Gemma 3 270M moved by +0.05 %, docs/benchmarks.md), at half the integer work of
        two planes. Other arithmetics: no change."""
        return replace(self, head=True, shared=None)

    def sharing(self, X: np.ndarray) -> Arithmetic:
        """This arithmetic for the matmuls of one input X, its activation blocks made once."""
        return replace(self, shared=SharedInput(X))

    def keeping(self, kept) -> Arithmetic:
        """This arithmetic with ``kept`` (a kernels.KeptRows, or None) holding unpacked rows."""
        return replace(self, kept=kept)

    def cached(self, X: np.ndarray, key, make):
        """``make()``, made once per key for the matmuls sharing X (``sharing``)."""
        return make() if self.shared is None else self.shared.get(X, key, make)


DEFAULT = Arithmetic()
