"""Model resolution and architecture knowledge shared by every command."""

from __future__ import annotations

from aios.models.architectures import ARCHITECTURES, Architecture
from aios.models.facts import ArchFacts
from aios.models.handle import ModelHandle
from aios.models.resolve import resolve_model
from aios.models.tensors import TensorInfo

__all__ = ["ARCHITECTURES", "ArchFacts", "Architecture", "ModelHandle", "TensorInfo", "resolve_model"]
