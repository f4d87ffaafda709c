"""AIOS toolchain: convert LLMs for CPUs, check the AIOS Model Contract by measurement."""

from __future__ import annotations

__version__ = "0.1.0"
CONTRACT_VERSION = "1.0"
