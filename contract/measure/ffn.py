"""Moved to :mod:`aios.measure.ffn` (the checker, the converters and the runtime share it).

Transitional re-export for ``convert/layout.py``, which still imports it from here; delete this
module (and ``contract/measure``) once that caller imports ``aios.measure.ffn``.
"""

from aios.measure.ffn import FfnActivity, measure_ffn_activity

__all__ = ["FfnActivity", "measure_ffn_activity"]
