"""numba kernels: Y[t, i] = Σ_j W[i, j] · X[t, j] over a chosen set of rows, per storage type.

Weights stay in their stored precision and are decoded in registers (F16/BF16 by the CPU's
conversion instructions, block types block by block straight from the file's interleaved
ggml blocks, fp16 scales included), so the bytes a kernel reads are the bytes the byte
counter reports, and a weight is never copied out of the mmap. Each weight row
is read once per call whatever the number of tokens T. From GEMM_MIN_TOKENS tokens on (a prompt,
a perplexity window) a whole matrix is instead decoded once, in chunks, and multiplied by all
tokens in float32 GEMMs (``gemm``), in the same arithmetic to float32 rounding.

Hand-written because no maintained library multiplies GGUF block formats on the CPU from
Python without dequantizing the whole matrix first (which would triple the traffic), and
numba alone leaves the vectorization to LLVM's auto-vectorizer, which (measured on this
project's Ice Lake machine) kept the Q8_0 int8 → float decode scalar and ran one row per
loop: ~10 GB/s for Q8_0 and ~20 GB/s for F32 against 26 GB/s for OpenBLAS' GEMV.

So the inner loops are LLVM IR intrinsics ("SIMD intrinsics" below) that state the vector
shapes directly (``<32 x float>`` accumulators, ``<32 x i8>`` loads, 16 fp16 scales
converted in one instruction), work on several rows at once (the activations are loaded once
per group and as many memory streams are in flight; the rows may be any subset, as the
sparse paths need, or None for all of them) and prefetch ahead: the float kernels eight rows
taken G apart (each position one unbroken stream of consecutive rows), each its own lines
ROW_AHEAD bytes on (except on AMD Zen: ``float_row_prefetch``); the block kernels four rows
side by side and the lines of the group AHEAD on, into L2. F16 under llama.cpp's arithmetic
(``mm_f16_arith``: x rounded to fp16, as ggml) reads short rows one at a time instead. Which pattern reads memory fastest was measured per
kernel against a plain read of the same file pages, on a Xeon and on an AMD EPYC (the
comments at each say by how much; docs/benchmarks.md, "Two CPUs"). LLVM lowers the generic vector
types to what the CPU has (AVX-512, AVX2, NEON). Rows whose length is not a multiple of 32
(F32/F16/BF16 only; block formats are whole blocks) take a plain numba loop.

Arithmetic of the 32-value block types (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL): a value the caller
passes (``Arithmetic``, runtime.kernels.arithmetic; ``Model(path, arithmetic=...)``,
``aios-run generate/bench --arithmetic``): "int8", the default, does what
llama.cpp does: each activation row is quantized once per matmul to int8 blocks of 32 with a
float scale per block (ggml's quantize_row_q8_0), and each weight block meets it in an integer
dot product (AVX-512 VNNI vpdpbusd here; AVX-VNNI, AVX2 pmaddubsw or portable IR elsewhere,
picked from the CPU's features when numba compiles), scaled by d_w·d_x in float; Q8_0 (``BLOCKWISE``) in ggml's order of
float operations, so on x86 its matmuls equal llama.cpp's bit for bit (its plain CPU buffers; one token and a batch alike). Its error is
the activations' 8-bit rounding (~0.5 % of Y, tested ≤ 1 %). "float" decodes each block to
float and multiplies the float activations: exact to float32 rounding, what the parity tests
compare with gguf-py's dequantized weights (``mm_block`` is always this path). The K-quants
(Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS: ``KQ_INT``) run int8 the same way with llama.cpp's Q8_K
activations (blocks of 256, float d, the 16 group sums for the minimum / offset terms;
``quantize_q8_k``), integer sums by pmaddubsw + vpdpwssd. ``INT8_DEFAULT`` lists the types
"int8" runs in int8 (all of them: int8 measured faster than float for every type here).
"llamacpp" is "int8" with every sum in llama.cpp's own order where a kernel mirrors it
(``ggml_order``: Q8_0, Q4_0, Q5_0, Q4_K, Q5_K, Q6_K), no GEMM attention and no
compiled decode blocks: logits bit-identical to llama.cpp's plain CPU buffers (x86, AVX-512
VNNI build), at a lower speed; what agreement with llama.cpp is checked in.

What each tensor type has and takes is one row of ``type_traits`` (``TYPE_TRAITS``, like
llama.cpp's ``type_traits``): its block geometry, its quants' sign facts, the activation blocks
of its int8 dot, the names of its kernels and the tile forms it runs in; the modules below derive
their type tuples from it (``B32``, ``KQ_INT``, ``TILE_TYPES`` ...), whose order is the ``kind``
their compiled kernels branch on.

The package, one module per seam: ``type_traits`` (the table above), ``threads`` (OpenMP's spin, ``set_threads``, ``threads_for``),
``ir_helpers`` (the IR the intrinsics are built from; the CPU's integer dot), ``groups`` (the
kernels' row groups), ``float_rows`` (F32, F16, BF16), ``blocks32`` and ``blocks32_int`` (the
32-value blocks in float and in int8; ``blocks32_int_operands``: how their quants and activations
load into vectors), ``kquants`` and ``kquants_int`` (the K-quants, likewise), ``quantize`` (the
activations' int8 blocks), ``ggml_order`` (llama.cpp's order of sums), ``gemm`` (many tokens:
rows decoded once per matmul, then one float32 GEMM), ``kq_tiles`` (many tokens in int8 register
tiles: ``kq_lanes`` their lane layout, ``kq_tile_kernel`` the tile's code), ``row_tiles`` and
``kq_row_tiles`` (16 rows in a vector's lanes), ``amx`` (the same on Intel AMX tiles, where the
CPU has them: ``amx_kernel``, ``amx_arrange``), ``kept`` (unpacked weights kept across passes),
``sparse`` (the sparse down projection; block rows decoded), ``arithmetic`` (the ``Arithmetic`` value: which arithmetic, whether many tokens
batch, and what one call of the forward pass shares between its matmuls) and ``dispatch``
(``mm_block``, ``mm_block_arith``: the kernel an arithmetic picks). The public names are all
re-exported here (``from runtime import kernels``, then ``kernels.mm_block``). No module here
holds state that picks an arithmetic or a route: the caller's ``Arithmetic`` does (the thread
counts in ``threads`` are numba's own process-wide setting, mirrored).

numba's on-disk cache checks only the source of the file that defines a compiled function, and a
kernel inlines the intrinsics and IR helpers of other files (runtime.ops and
runtime.decode_block compile calls into these kernels, too): after an edit to one file, a
kernel cached from another could run the old code. So importing ``runtime`` points numba's
cache at a folder named by a hash of the runtime files that hold compiled code,
``$AIOS_CACHE/numba/<hash>`` (``runtime.numba_cache_dir``; ``~/.cache/aios`` by default): an edit
to any of them starts a fresh cache, the same sources find theirs again. A NUMBA_CACHE_DIR
set by the user is left as it is (clear it after editing a kernel).
"""

from __future__ import annotations

from aios.quant import QK_K
from runtime.kernels.amx import (
    AMX_TYPES,
    amx_available,
    amx_runs,
    arranged_amx,
    mm_amx,
)
from runtime.kernels.arithmetic import ARITHMETICS, DEFAULT, GEMM_MIN_TOKENS, GGML_ARITHMETICS, Arithmetic
from runtime.kernels.blocks32 import (
    B32,
    B32_AFFINE,
    B32_BYTES,
    B32_KIND,
    B32_OFFSET,
    B32_QS,
    B32_SIGNED,
    BLOCKWISE,
    KVALUES_IQ4NL,
    QK,
    dot4_iq4_nl,
    dot4_q4_0,
    dot4_q4_1,
    dot4_q5_0,
    dot4_q5_1,
    dot4_q8_0,
)
from runtime.kernels.blocks32_int import (
    AFFINE_B32,
    INT_DOT_NAMES,
    PAIR_ORDER,
    QUAD_INSERT,
    STRIDED_WORDS_MAX,
    dot4i_iq4_nl,
    dot4i_q4_0,
    dot4i_q4_1,
    dot4i_q5_0,
    dot4i_q5_1,
    dot4i_q8_0,
    mm_b32_int8,
)
from runtime.kernels.dispatch import (
    BLOCK_TYPES,
    INT8_ALL,
    INT8_DEFAULT,
    INT8_TYPES,
    arithmetic_label,
    mm_block,
    mm_block_arith,
    mm_block_int8,
    mm_f16_arith,
)
from runtime.kernels.float_rows import (
    BF16_ROWS,
    F16_ROWS,
    F32_ROWS,
    FLOAT_ROWS,
    LUT_BF16,
    LUT_F16,
    ONE_ROW_X_BYTES,
    ROW_AHEAD,
    axpy4_bf16,
    axpy4_f16,
    axpy4_f32,
    axpy_f64_at,
    dot1_f16_hx,
    dot8_bf16,
    dot8_f16,
    dot8_f16_hx,
    dot8_f32,
    dot_f32_at,
    float_row_prefetch,
    mm_bf16,
    mm_f16,
    mm_f16_half_x,
    mm_f16_half_x_one,
    mm_f32,
    mm_float_rows,
    read_rows_u32,
)
from runtime.kernels.gemm import CHUNK_VALUES
from runtime.kernels.groups import AHEAD
from runtime.kernels.ir_helpers import (
    F32,
    FAST,
    HALF,
    I8,
    I16,
    I32,
    ROWS,
    V8F,
    V8I32,
    V16F,
    V16I16,
    V16I32,
    V32F,
    V32I8,
    V32I16,
    V64I8,
    array_data,
    compile_features,
    int_dot_features,
    ir_loop,
)
from runtime.kernels.kept import KeptRows, kept_unpacked
from runtime.kernels.kquants import (
    IQ4XS_QS,
    IQ4XS_SL,
    KQ_BYTES,
    KQ_KIND,
    KQ_TYPES,
    KQ_XSUM,
    Q2K_D,
    Q2K_QS,
    Q3K_D,
    Q3K_QS,
    Q3K_SCALES,
    Q4K_QS,
    Q4K_SCALES,
    Q5K_QH,
    Q5K_QS,
    Q6K_D,
    Q6K_QH,
    Q6K_SCALES,
    dot4_iq4_xs,
    dot4_q2_k,
    dot4_q3_k,
    dot4_q4_k,
    dot4_q5_k,
    dot4_q6_k,
    xsum,
)
from runtime.kernels.kquants_int import (
    KQ_DOT_NAMES,
    KQ_INT,
    KQ_INT_KIND,
    KQ_X_ORDER,
    dot4i_iq4_xs,
    dot4i_q2_k,
    dot4i_q3_k,
    dot4i_q4_k,
    dot4i_q5_k,
    dot4i_q6_k,
    mm_kq_int8,
)
from runtime.kernels.quantize import (
    quantize_activations,
    quantize_activations_k,
    quantize_q8,
    quantize_q8_blocks,
    quantize_q8_k,
    round_f16,
)
from runtime.kernels.sparse import (
    SPARSE_B,
    SPARSE_B_KIND,
    SPARSE_B_VALUES,
    SPARSE_BLOCK_ROWS,
    SPARSE_CHUNKS,
    axpy_iq4_nl,
    axpy_iq4_xs,
    axpy_q2_k,
    axpy_q3_k,
    axpy_q4_0,
    axpy_q4_1,
    axpy_q4_k,
    axpy_q5_0,
    axpy_q5_1,
    axpy_q5_k,
    axpy_q6_k,
    axpy_q8_0,
    decode_block_rows,
    decode_rows_at,
    sparse_block_rows,
    sparse_rows_bf16,
    sparse_rows_f16,
    sparse_rows_f32,
    sparse_rows_iq4_nl,
    sparse_rows_iq4_xs,
    sparse_rows_q2_k,
    sparse_rows_q3_k,
    sparse_rows_q4_0,
    sparse_rows_q4_1,
    sparse_rows_q4_k,
    sparse_rows_q5_0,
    sparse_rows_q5_1,
    sparse_rows_q5_k,
    sparse_rows_q6_k,
    sparse_rows_q8_0,
)
from runtime.kernels.threads import (
    OMP_SET_HERE,
    SERIAL_BYTES,
    SPIN_COUNT,
    one_blas_thread,
    physical_cores,
    set_threads,
    threads_for,
)
from runtime.kernels.type_traits import TYPE_TRAITS, TypeTraits

__all__ = [
    "AMX_TYPES", "amx_available", "amx_runs", "arranged_amx", "KeptRows", "kept_unpacked", "mm_amx",
    "AFFINE_B32", "AHEAD", "ARITHMETICS", "Arithmetic", "DEFAULT", "GGML_ARITHMETICS", "CHUNK_VALUES", "GEMM_MIN_TOKENS", "B32", "B32_AFFINE", "B32_BYTES", "B32_KIND",
    "B32_OFFSET", "B32_QS", "B32_SIGNED", "BF16_ROWS", "BLOCKWISE", "BLOCK_TYPES", "F16_ROWS",
    "F32", "F32_ROWS", "FAST", "FLOAT_ROWS", "HALF", "I8", "I16", "I32", "INT8_ALL",
    "INT8_DEFAULT", "INT8_TYPES", "INT_DOT_NAMES", "IQ4XS_QS", "IQ4XS_SL", "KQ_BYTES",
    "KQ_DOT_NAMES", "KQ_INT", "KQ_INT_KIND", "KQ_KIND", "KQ_TYPES", "KQ_XSUM", "KQ_X_ORDER",
    "KVALUES_IQ4NL", "LUT_BF16", "LUT_F16", "OMP_SET_HERE", "ONE_ROW_X_BYTES", "PAIR_ORDER",
    "Q2K_D", "Q2K_QS", "Q3K_D", "Q3K_QS", "Q3K_SCALES", "Q4K_QS", "Q4K_SCALES", "Q5K_QH", "Q5K_QS",
    "Q6K_D", "Q6K_QH", "Q6K_SCALES", "QK", "QK_K", "QUAD_INSERT", "ROWS", "ROW_AHEAD",
    "SERIAL_BYTES", "SPARSE_B", "SPARSE_BLOCK_ROWS", "SPARSE_B_KIND", "SPARSE_B_VALUES",
    "SPARSE_CHUNKS", "SPIN_COUNT", "STRIDED_WORDS_MAX", "TYPE_TRAITS", "TypeTraits", "V8F", "V8I32", "V16F", "V16I16", "V16I32",
    "V32F", "V32I8", "V32I16", "V64I8", "arithmetic_label", "array_data",
    "axpy4_bf16", "axpy4_f16", "axpy4_f32", "axpy_f64_at", "axpy_iq4_nl", "axpy_iq4_xs",
    "axpy_q2_k", "axpy_q3_k", "axpy_q4_0", "axpy_q4_1", "axpy_q4_k", "axpy_q5_0", "axpy_q5_1",
    "axpy_q5_k", "axpy_q6_k", "axpy_q8_0", "compile_features", "decode_block_rows",
    "decode_rows_at", "dot1_f16_hx", "dot4_iq4_nl", "dot4_iq4_xs", "dot4_q2_k", "dot4_q3_k",
    "dot4_q4_0", "dot4_q4_1", "dot4_q4_k", "dot4_q5_0", "dot4_q5_1", "dot4_q5_k", "dot4_q6_k",
    "dot4_q8_0", "dot4i_iq4_nl", "dot4i_iq4_xs", "dot4i_q2_k", "dot4i_q3_k", "dot4i_q4_0",
    "dot4i_q4_1", "dot4i_q4_k", "dot4i_q5_0", "dot4i_q5_1", "dot4i_q5_k", "dot4i_q6_k",
    "dot4i_q8_0", "dot8_bf16", "dot8_f16", "dot8_f16_hx", "dot8_f32", "dot_f32_at",
    "float_row_prefetch", "int_dot_features", "ir_loop", "mm_b32_int8", "mm_bf16", "mm_block",
    "mm_block_arith", "mm_block_int8", "mm_f16", "mm_f16_arith", "mm_f16_half_x",
    "mm_f16_half_x_one", "mm_f32", "mm_float_rows", "mm_kq_int8", "one_blas_thread", "physical_cores",
    "quantize_activations", "quantize_activations_k", "quantize_q8", "quantize_q8_blocks",
    "quantize_q8_k", "read_rows_u32", "round_f16", "set_threads",
    "sparse_block_rows", "sparse_rows_bf16", "sparse_rows_f16", "sparse_rows_f32",
    "sparse_rows_iq4_nl", "sparse_rows_iq4_xs", "sparse_rows_q2_k", "sparse_rows_q3_k",
    "sparse_rows_q4_0", "sparse_rows_q4_1", "sparse_rows_q4_k", "sparse_rows_q5_0",
    "sparse_rows_q5_1", "sparse_rows_q5_k", "sparse_rows_q6_k", "sparse_rows_q8_0", "threads_for",
    "xsum",
]

