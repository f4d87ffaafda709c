"""Former path of ``convert/alias/export.py``, kept because tests/runtime imports
``convert.alias_gguf.export_alias_gguf``; new code imports ``convert.alias.export``."""

from convert.alias.export import export_alias_gguf

__all__ = ["export_alias_gguf"]
