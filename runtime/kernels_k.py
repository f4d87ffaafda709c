"""Constants of ggml's K-quants (256-value super-blocks) for the runtime's block kernels.

Weights stay as the GGUF stores them (uint8 rows of super-blocks: Q2_K 84 B, Q3_K 110 B,
Q4_K 144 B, Q5_K 176 B, Q6_K 210 B, IQ4_XS 136 B) and are decoded in registers, so the bytes
a kernel reads are the stored bytes the byte counter reports; each row is read once per call
whatever T.

Affine types (Q2_K, Q4_K, Q5_K) compute d·s·Σ q·x − dmin·m·Σ x per sub-block; the Σ x per
sub-block (``xsum``) is computed once per call and shared by all rows.

Under ``--arithmetic int8`` (the default) they run on llama.cpp's Q8_K activations instead
(``runtime.kernels.mm_block_int8``, ``quantize_q8_k``: integer sums, the minimums and offsets
from the activation blocks' 16-value group sums); ``mm_block`` is the float path.

The kernels themselves live in ``runtime/kernels.py`` (``mm_block``) beside the SIMD
intrinsics they are built from (numba's cache only watches the file that defines a kernel);
this module keeps the K-quant constants.
"""

from __future__ import annotations

from aios.quant import QK_K, type_size
from runtime.kernels import KQ_XSUM, mm_block, xsum  # noqa: F401  (re-exported)

TYPES = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS")
BLOCK_BYTES = {t: type_size(t) for t in TYPES}  # bytes per super-block, from gguf-py's table
# values per sub-block whose Σx the affine kernels subtract (ggml's block_q2_K: 16 scales,
# block_q4_K/block_q5_K: 8 per super-block)
SUB_BLOCK = {t.upper(): n for t, n in KQ_XSUM.items()}
assert SUB_BLOCK == {"Q2_K": QK_K // 16, "Q4_K": QK_K // 8, "Q5_K": QK_K // 8}
