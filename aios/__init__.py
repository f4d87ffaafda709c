"""AIOS toolchain: convert LLMs for CPUs, check the AIOS Model Contract by measurement."""

from __future__ import annotations

import os

__version__ = "0.1.0"
CONTRACT_VERSION = "1.0"

# OpenBLAS (numpy's BLAS: the runtime's many-token GEMMs, runtime.kernels.gemm) keeps its worker
# threads spinning for 2^28 cycles after each call by default. On a 2-core machine they then
# hold the cores that the next numba kernel's threads need: a 512-token prompt of the real
# Gemma 3 270M took 0.96-1.13 s with the default spin and 0.84 s with 2^4 cycles (they sleep at
# once; 2-core Xeon, 2026-11-27). OpenBLAS reads the setting once, when numpy loads it, so it
# is set here, the first module of every command (a user's own setting is kept).
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
