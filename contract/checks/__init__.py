"""One module per contract requirement, each exposing ``check(model, ctx) -> RequirementResult``.

The list of checks is explicit: ``CHECKS`` maps requirement id -> check function.
"""

from __future__ import annotations

from contract.checks import r1_sparsity, r2_kv_cache, r3_aliasing, r4_activation_footprint, r5_layout

CHECKS = (
    ("R1", r1_sparsity.check),
    ("R2", r2_kv_cache.check),
    ("R3", r3_aliasing.check),
    ("R4", r4_activation_footprint.check),
    ("R5", r5_layout.check),
)
REQUIREMENT_IDS = tuple(rid for rid, _ in CHECKS)
