"""The option vocabularies of aliasing (post-hoc and trained), importable without torch.

Bottom of the alias family: ``convert/alias/posthoc.py``, ``convert/alias/train.py`` and
``aios-convert alias`` (its ``click.Choice`` lists) all read these, and this module imports
nothing, so building the command's options never loads torch.
"""

from __future__ import annotations

CANONICAL_MODES = ("mean", "medoid")  # a group's canonical: the members' mean, or their medoid
DELTA_NORMS = ("fro", "spectral")  # trained aliasing's projection norm (fro: the R3 criterion)
GGUF_OUTTYPES = ("f32", "f16", "bf16", "q8_0", "q4_0")  # 2-D weights of the aliased GGUF outputs
