"""A decode step's transformer block as one compiled call (Llama-like and Falcon blocks, on the
int8 path and on the float path of F16/BF16 files), and a whole step as one call.

Right after a weight matrix has streamed through the caches, every Python-level operation runs
cold: on the 2-core AMD EPYC VM a 16-row matmul call took 8.6 µs back to back and 120-170 µs
right after the 431 MB output head of a Llama-3.1-8B-dims file, an RMS norm 5.4 µs hot and
74-82 µs cold. A decode step of that file (4 blocks, 29 matmuls) spent 1.0-1.5 ms of ~32 ms
outside its kernels, and another 0.4-0.65 ms in the Python around them. ``block`` runs one
block for one token as a single compiled call: the norms, the q/k/v, output and FFN matmuls
(each input quantized by the same functions the Python path calls), RoPE, the KV cache write,
attention and SwiGLU, in the same float32 operations and order as ``Model.forward``'s step by
step path, so the logits are the same to the bit (tests/runtime/test_decode_block.py). Paired
decode steps, this against the Python block: 1.2 ms faster per step (median, 200 pairs).

Which blocks (``plan`` decides per layer; the others run the Python path), every matrix a block
type with an int8 kernel: ``block``, a sequential block (attention, then the FFN) with RMS norms
without biases, a gated SiLU FFN, separate q/k/v matrices (biases allowed), optional per-head
q/k norms, any RoPE variant, window, soft cap or q pre-scaling (Llama, Mistral, Qwen2/3);
``parallel_block``, Falcon's: LayerNorms, one fused q/k/v matrix, attention and a GELU MLP on
the same input (with the MLP's own norm, Falcon-40B). ``float_block`` and
``float_parallel_block`` are the same shapes on the float path (runtime.ops's norms, RoPE and
attention; F16/BF16 matrices; the checkpoint's SiLU or erf GELU). ``step`` / ``parallel_step``
run every layer's ``block`` / ``parallel_block`` and then the output norm and matmul, when the
model's every layer and its output matrix allow it (``Model._compiled_step``); ``float_step`` /
``float_parallel_step`` do the same with the float blocks and an F16/BF16 output matrix. Decode only (one
token): a prompt's chunk spends its time in the kernels already.

numba's cache checks only this file's source for this module's functions, which compile the
kernels of runtime/kernels and runtime/ggml_ops in: ``runtime`` keys the cache folder by all of
runtime/'s sources, so an edited kernel recompiles this module too (under a NUMBA_CACHE_DIR of
your own, clear it after editing a kernel).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from runtime import kernels
from runtime.ggml_ops import add_rms_norm, attention, attention_inputs, layer_norm, rms_norm, silu_mul_rows
from runtime.kernels import mm_b32_int8, mm_kq_int8, quantize_activations_k, quantize_q8_blocks
from runtime.ggml_ops import f16_bits
from runtime.kernels import BF16_ROWS, F16_ROWS, ONE_ROW_X_BYTES, mm_f16_half_x, mm_f16_half_x_one, mm_float_rows
from runtime.ops import attention as attention_f
from runtime.ops import gelu_erf, gelu_lookup, silu
from runtime.ops import layer_norm as layer_norm_f
from runtime.ops import rms_norm as rms_norm_f
from runtime.ops import rope as rope_f

# a matrix's kernel as one integer: a 32-value type's B32_KIND (+ AFFINE for the Q8_1 partners),
# or KQ + a K-quant's KQ_INT_KIND
AFFINE = 16
KQ = 100
MATRICES = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def kernel_code(kind: str) -> int | None:
    """The code of a gguf-py type name's int8 kernel; None when it has none."""
    fmt = kind.lower()
    if fmt not in kernels.INT8_DEFAULT:
        return None
    if fmt in kernels.KQ_INT_KIND:
        return KQ + kernels.KQ_INT_KIND[fmt]
    return kernels.B32_KIND[fmt] + (AFFINE if fmt in kernels.AFFINE_B32 else 0)


@njit(cache=True)
def _quantized(h, codes, lo, hi):
    """h's int8 blocks in each activation format that matrices lo..hi-1 take (Q8_K, Q8_0, Q8_1),
    each computed once for them all; a format none of them takes is left empty."""
    k = q0 = q1 = False
    for j in range(lo, hi):
        k |= codes[j] >= KQ
        q0 |= codes[j] < AFFINE
        q1 |= AFFINE <= codes[j] < KQ
    none = h[:0]
    return (quantize_activations_k(h if k else none), quantize_q8_blocks(h if q0 else none, False),
            quantize_q8_blocks(h if q1 else none, True))


@njit(cache=True)
def _matmul(W, xs, code, bias):
    """One matmul as ``kernels.mm_block_int8`` computes it, on ``_quantized``'s blocks of its
    input, plus the bias when there is one."""
    qk, q0, q1 = xs
    Y = np.empty((max(qk[0].shape[0], q0[0].shape[0], q1[0].shape[0]), W.shape[0]), np.float32)
    if code >= KQ:
        mm_kq_int8(W, qk[0], qk[1], qk[2], None, Y, code - KQ)
    else:
        x = q1 if code >= AFFINE else q0
        mm_b32_int8(W, x[0], x[1], x[2], None, Y, code % AFFINE)
    if bias.shape[0]:
        Y += bias
    return Y


@njit(cache=True)
def block(x, rest, positions, p0, W, codes, B, attn_norm, ffn_norm, q_norm, k_norm, eps,
          theta_scale, freq_factors, neox, rotate, prescale, scale, window, softcap, K, V,
          n_heads, n_kv, head_dim):
    """One block for one token. x (1, d): the residual stream; rest (1, d) or (0, d): the previous
    block's FFN output not yet added to x; positions (1,) int64 and p0 its value. W, codes, B:
    the MATRICES in order (weights, kernel codes, biases or empty); the rest is the layer's
    constants (``Model._compiled_block`` gathers them once). Returns (x + attention, the FFN output, the
    FFN activation's nonzero count). It runs on numba's thread count as the caller set it (setting
    it in here, ``numba.set_num_threads``, would keep numba from caching the compiled code)."""
    if rest.shape[0]:
        x, h = add_rms_norm(x, rest, attn_norm, eps)
    else:
        h = rms_norm(x, attn_norm, eps)
    xs = _quantized(h, codes, 0, 3)
    q = _matmul(W[0], xs, codes[0], B[0])
    k = _matmul(W[1], xs, codes[1], B[1])
    v = _matmul(W[2], xs, codes[2], B[2])
    qr = attention_inputs(q.reshape(1, n_heads, head_dim), k.reshape(1, n_kv, head_dim),
                          v.reshape(1, n_kv, head_dim), q_norm, k_norm, eps, positions, theta_scale,
                          freq_factors, neox, rotate, prescale, K, V, p0)
    a = attention(qr, K, V, p0, scale, window, softcap)
    o = _matmul(W[3], _quantized(a, codes, 3, 4), codes[3], B[3])
    x, h2 = add_rms_norm(x, o, ffn_norm, eps)
    xs = _quantized(h2, codes, 4, 6)
    g = _matmul(W[4], xs, codes[4], B[4])
    u = _matmul(W[5], xs, codes[5], B[5])
    act = silu_mul_rows(g, u)
    nnz = np.count_nonzero(act)
    d = _matmul(W[6], _quantized(act, codes, 6, 7), codes[6], B[6])
    return x, d, nnz


@njit(cache=True)
def parallel_block(x, rest, positions, p0, W, codes, B, norm_w, norm_b, ffn_norm_w, ffn_norm_b, gelu,
                   eps, theta_scale, freq_factors, neox, rotate, prescale, scale, window, softcap, K, V,
                   n_heads, n_kv, head_dim):
    """One Falcon-style block for one token: LayerNorms (biases: empty arrays when none), one
    fused q/k/v matrix, attention and a GELU MLP side by side on the same input (the MLP's own
    norm when ``ffn_norm_w`` is not empty, Falcon-40B's). W, codes, B: PARALLEL_MATRICES in
    order; ``gelu``: ggml's table (``ops.gelu_table``). Returns (x + attention, the MLP output,
    its activation's nonzero count), as ``block``."""
    if rest.shape[0]:
        x = x + rest
    h = layer_norm(x, norm_w, norm_b, eps)
    qkv = _matmul(W[0], _quantized(h, codes, 0, 1), codes[0], B[0])
    nq, nkv = n_heads * head_dim, n_kv * head_dim
    q = qkv[0, :nq].copy().reshape(1, n_heads, head_dim)
    k = qkv[0, nq:nq + nkv].copy().reshape(1, n_kv, head_dim)
    v = qkv[0, nq + nkv:nq + 2 * nkv].copy().reshape(1, n_kv, head_dim)
    qr = attention_inputs(q, k, v, norm_w[:0], norm_w[:0], eps, positions, theta_scale, freq_factors,
                          neox, rotate, prescale, K, V, p0)
    a = attention(qr, K, V, p0, scale, window, softcap)
    attn = _matmul(W[1], _quantized(a, codes, 1, 2), codes[1], B[1])
    if ffn_norm_w.shape[0]:
        h = layer_norm(x, ffn_norm_w, ffn_norm_b, eps)
    up = _matmul(W[2], _quantized(h, codes, 2, 3), codes[2], B[2])
    act = gelu_lookup(up.reshape(-1), gelu).reshape(up.shape)
    nnz = np.count_nonzero(act)
    d = _matmul(W[3], _quantized(act, codes, 3, 4), codes[3], B[3])
    return x + attn, d, nnz


PARALLEL_MATRICES = ("attn_qkv", "attn_output", "ffn_up", "ffn_down")


@njit(cache=True)
def _head(x, rest, out_norm, out_norm_b, eps, layer_norm_out, W, code):
    """The output norm of x + rest (LayerNorm with ``out_norm_b`` when ``layer_norm_out``, else
    RMS) and the output matmul, as ``Model.forward`` computes them after its blocks."""
    if layer_norm_out:
        h = layer_norm(x + rest, out_norm, out_norm_b, eps)
    else:
        h = add_rms_norm(x, rest, out_norm, eps)[1]
    codes = np.full(1, code, np.int64)
    return _matmul(W, _quantized(h, codes, 0, 1), code, out_norm[:0])


@njit(cache=True)
def step(x, positions, p0, layers, out_norm, out_norm_b, eps, layer_norm_out, W, code):
    """A whole decode step after the embedding: ``block`` for every layer (``layers``: each
    layer's arguments after p0, all of one type), the output norm and the output matmul, in one
    call, so that no Python runs cold between a step's kernels. Returns (logits (1, vocab), the
    FFN activations' nonzero count summed over the layers)."""
    rest = x[:0]
    nnz = 0
    for i in range(len(layers)):
        x, rest, n = block(x, rest, positions, p0, *layers[i])
        nnz += n
    return _head(x, rest, out_norm, out_norm_b, eps, layer_norm_out, W, code), nnz


@njit(cache=True)
def parallel_step(x, positions, p0, layers, out_norm, out_norm_b, eps, layer_norm_out, W, code):
    """``step`` for ``parallel_block`` layers. A copy rather than the block function passed in:
    a compiled function as an argument types per process, so numba's cache missed in every new
    process (NUMBA_DEBUG_CACHE: the index loaded, a new entry saved) and each run compiled again."""
    rest = x[:0]
    nnz = 0
    for i in range(len(layers)):
        x, rest, n = parallel_block(x, rest, positions, p0, *layers[i])
        nnz += n
    return _head(x, rest, out_norm, out_norm_b, eps, layer_norm_out, W, code), nnz


# --- the float path: F16 and BF16 matrices, the norms, RoPE and attention of runtime.ops -----------
# codes: an F16 matrix with x rounded to fp16 (the default arithmetic, ggml's vec_dot_f16), an
# F16 or a BF16 one with float32 x (the "float" arithmetic)
F16_HALF_X, F16_FLOAT_X, BF16_FLOAT_X = 200, 201, 202
SILU, GELU_ERF = 0, 1  # the FFN activation (ops.silu, ops.gelu_erf)


@njit(cache=True)
def _half(h, codes, lo, hi):
    """h's fp16 bits when one of matrices lo..hi-1 takes x in fp16, else an empty array."""
    need = False
    for j in range(lo, hi):
        need |= codes[j] == F16_HALF_X
    T, k = h.shape
    out = np.empty((T if need else 0, k), np.uint16)
    for t in range(out.shape[0]):
        for j in range(k):
            out[t, j] = f16_bits(h[t, j])
    return out


@njit(cache=True)
def _float_matmul(W, h, xh, code, bias):
    """One matmul as ``kernels.mm_f16_arith`` / ``mm_bf16`` compute it (k a multiple of 32)."""
    Y = np.empty((h.shape[0], W.shape[0]), np.float32)
    if code == F16_HALF_X:
        if 2 * h.shape[1] <= ONE_ROW_X_BYTES:
            mm_f16_half_x_one(W, xh, None, Y)
        else:
            mm_f16_half_x(W, xh, None, Y)
    else:
        mm_float_rows(W, h, None, Y, F16_ROWS if code == F16_FLOAT_X else BF16_ROWS)
    if bias.shape[0]:
        Y += bias
    return Y


@njit(cache=True)
def _float_attention(q, k, v, q_norm, k_norm, eps, positions, inv_freq, neox, rotate, K, V, p0,
                     scale, window, softcap):
    """From the projections (1, heads, head_dim) to the attention output as ``Model.forward``'s
    float path computes it: per-head norms, RoPE on copies, the KV write, ``ops.attention``."""
    if q_norm.shape[0]:
        q = rms_norm_f(q.reshape(-1, q.shape[2]), q_norm, eps).reshape(q.shape)
        k = rms_norm_f(k.reshape(-1, k.shape[2]), k_norm, eps).reshape(k.shape)
    if rotate:
        q, k = q.copy(), k.copy()
        rope_f(q, positions, inv_freq, neox)
        rope_f(k, positions, inv_freq, neox)
    for h in range(k.shape[1]):
        K[h, p0] = k[0, h]
        V[h, p0] = v[0, h]
    return attention_f(q, K, V, p0, scale, window, softcap)


@njit(cache=True)
def _activation(u, act):
    return (silu(u.reshape(-1)) if act == SILU else gelu_erf(u.reshape(-1))).reshape(u.shape)


@njit(cache=True)
def float_block(x, rest, positions, p0, W, codes, B, attn_norm, ffn_norm, q_norm, k_norm, eps,
                inv_freq, neox, rotate, scale, window, softcap, K, V, n_heads, n_kv, head_dim, act):
    """``block`` on the float path: F16/BF16 matrices (codes above), runtime.ops's norms, RoPE
    (``positions`` float64) and attention, ``act``'s gated FFN. Returns as ``block``."""
    if rest.shape[0]:
        x = x + rest
    h = rms_norm_f(x, attn_norm, eps)
    xh = _half(h, codes, 0, 3)
    q = _float_matmul(W[0], h, xh, codes[0], B[0])
    k = _float_matmul(W[1], h, xh, codes[1], B[1])
    v = _float_matmul(W[2], h, xh, codes[2], B[2])
    a = _float_attention(q.reshape(1, n_heads, head_dim), k.reshape(1, n_kv, head_dim),
                         v.reshape(1, n_kv, head_dim), q_norm, k_norm, eps, positions, inv_freq, neox,
                         rotate, K, V, p0, scale, window, softcap)
    x = x + _float_matmul(W[3], a, _half(a, codes, 3, 4), codes[3], B[3])
    h2 = rms_norm_f(x, ffn_norm, eps)
    xh = _half(h2, codes, 4, 6)
    g = _activation(_float_matmul(W[4], h2, xh, codes[4], B[4]), act)
    a = g * _float_matmul(W[5], h2, xh, codes[5], B[5])
    nnz = np.count_nonzero(a)
    return x, _float_matmul(W[6], a, _half(a, codes, 6, 7), codes[6], B[6]), nnz


@njit(cache=True)
def float_parallel_block(x, rest, positions, p0, W, codes, B, norm_w, norm_b, ffn_norm_w, ffn_norm_b,
                         eps, inv_freq, neox, rotate, scale, window, softcap, K, V, n_heads, n_kv,
                         head_dim, act):
    """``parallel_block`` on the float path (as ``float_block``)."""
    if rest.shape[0]:
        x = x + rest
    h = layer_norm_f(x, norm_w, norm_b, eps)
    qkv = _float_matmul(W[0], h, _half(h, codes, 0, 1), codes[0], B[0])
    nq, nkv = n_heads * head_dim, n_kv * head_dim
    q = qkv[:, :nq].copy().reshape(1, n_heads, head_dim)
    k = qkv[:, nq:nq + nkv].copy().reshape(1, n_kv, head_dim)
    v = qkv[:, nq + nkv:nq + 2 * nkv].copy().reshape(1, n_kv, head_dim)
    a = _float_attention(q, k, v, norm_w[:0], norm_w[:0], eps,
                         positions, inv_freq, neox, rotate, K, V, p0, scale, window, softcap)
    attn = _float_matmul(W[1], a, _half(a, codes, 1, 2), codes[1], B[1])
    if ffn_norm_w.shape[0]:
        h = layer_norm_f(x, ffn_norm_w, ffn_norm_b, eps)
    u = _activation(_float_matmul(W[2], h, _half(h, codes, 2, 3), codes[2], B[2]), act)
    nnz = np.count_nonzero(u)
    return x + attn, _float_matmul(W[3], u, _half(u, codes, 3, 4), codes[3], B[3]), nnz


@njit(cache=True)
def _float_head(x, rest, out_norm, out_norm_b, eps, layer_norm_out, W, code):
    """The float path's output norm of x + rest (runtime.ops's LayerNorm with ``out_norm_b``
    when ``layer_norm_out``, else its RMS norm) and the output matmul, as ``Model.forward``."""
    x = x + rest
    if layer_norm_out:
        h = layer_norm_f(x, out_norm, out_norm_b, eps)
    else:
        h = rms_norm_f(x, out_norm, eps)
    codes = np.full(1, code, np.int64)
    return _float_matmul(W, h, _half(h, codes, 0, 1), code, out_norm[:0])


@njit(cache=True)
def float_step(x, positions, p0, layers, out_norm, out_norm_b, eps, layer_norm_out, W, code):
    """``step`` on the float path: ``float_block`` for every layer (``positions`` float64), then
    ``_float_head``. A copy for the reason ``parallel_step`` gives."""
    rest = x[:0]
    nnz = 0
    for i in range(len(layers)):
        x, rest, n = float_block(x, rest, positions, p0, *layers[i])
        nnz += n
    return _float_head(x, rest, out_norm, out_norm_b, eps, layer_norm_out, W, code), nnz


@njit(cache=True)
def float_parallel_step(x, positions, p0, layers, out_norm, out_norm_b, eps, layer_norm_out, W, code):
    """``float_step`` for ``float_parallel_block`` layers."""
    rest = x[:0]
    nnz = 0
    for i in range(len(layers)):
        x, rest, n = float_parallel_block(x, rest, positions, p0, *layers[i])
        nnz += n
    return _float_head(x, rest, out_norm, out_norm_b, eps, layer_norm_out, W, code), nnz


@dataclass
class BlockPlan:
    """What ``block`` takes for one layer, gathered once."""

    W: tuple
    codes: np.ndarray
    B: tuple
    attn_norm: np.ndarray
    ffn_norm: np.ndarray
    q_norm: np.ndarray
    k_norm: np.ndarray
    reads: list  # (tensor name, bytes): the weight reads the byte counter adds per token
    largest: int  # bytes of the largest matrix: the thread count follows it (kernels.threads_for)
    args: tuple | None = None  # block's arguments after p0, gathered by the model at first use
    parallel: bool = False  # parallel_block (Falcon) rather than block
    attn_norm_b: np.ndarray | None = None  # parallel_block's LayerNorm biases (empty: none)
    ffn_norm_b: np.ndarray | None = None
    act: int | None = None  # the float path's activation (SILU, GELU_ERF); None: the int8 block


_NONE = np.zeros(0, np.float32)


def float_code(kind: str, half_x: bool) -> int | None:
    """The code of an F16 / BF16 matrix on the float path (``half_x``: the process's arithmetic
    rounds x to fp16 for F16, ``kernels.mm_f16_arith``); None for any other type."""
    fmt = kind.upper()
    if fmt == "F16":
        return F16_HALF_X if half_x else F16_FLOAT_X
    return BF16_FLOAT_X if fmt == "BF16" else None


def _weights(L: dict, names: tuple[str, ...], code=kernel_code) -> dict | None:
    """The plan fields of the matrices ``names`` (weights, kernel codes, biases, the bytes the
    counter adds, the largest matrix), or None when one is not a stored matrix that ``code``
    (a gguf-py type name -> code or None) gives a code."""
    from runtime.weights import Matrix

    mats = [L.get(f"{n}.weight") for n in names]
    if not all(type(m) is Matrix and code(m.kind) is not None for m in mats):
        return None
    biases = [L.get(f"{n}.bias") for n in names]
    reads = [(m.name, m.nbytes) for m in mats]
    reads += [(m.name + ".bias", b.nbytes) for m, b in zip(mats, biases) if b is not None]
    return dict(W=tuple(m.data for m in mats), codes=np.array([code(m.kind) for m in mats], np.int64),
                B=tuple(_f32(b) for b in biases), reads=reads, largest=max(m.nbytes for m in mats))


def _f32(v: np.ndarray | None) -> np.ndarray:
    return _NONE if v is None else np.ascontiguousarray(v, np.float32)


def plan(L: dict, bg, form: str | None, code=kernel_code) -> BlockPlan | None:
    """Layer ``L``'s plan for the compiled ``form`` (``runtime.block_graph.compiled_form`` of its
    graph ``bg``: which of ``block`` / ``parallel_block`` / their float forms implements the
    layer's every graph fact; None: none does) when ``code`` (a gguf-py type name -> kernel code
    or None) gives every matrix a code, else None."""
    if form is None:
        return None
    if form.endswith("parallel_block"):  # Falcon: LayerNorms, fused q/k/v, a plain GELU MLP
        w = _weights(L, PARALLEL_MATRICES, code)
        n2 = bg.ffn_norm
        return None if w is None else BlockPlan(
            **w, attn_norm=_f32(L["attn_norm.weight"]), ffn_norm=_f32(L.get(f"{n2}.weight") if n2 else None),
            q_norm=_NONE, k_norm=_NONE, parallel=True, attn_norm_b=_f32(L.get("attn_norm.bias")),
            ffn_norm_b=_f32(L.get(f"{n2}.bias") if n2 else None))
    w = _weights(L, MATRICES, code)
    return None if w is None else BlockPlan(
        **w, attn_norm=L["attn_norm.weight"], ffn_norm=L[f"{bg.ffn_norm}.weight"],
        q_norm=L["attn_q_norm.weight"] if bg.qk_norm else _NONE,
        k_norm=L["attn_k_norm.weight"] if bg.qk_norm else _NONE)


def float_plan(L: dict, bg, form: str | None, half_x: bool) -> BlockPlan | None:
    """Layer ``L``'s plan for the float path's compiled ``form`` (``float_block`` or
    ``float_parallel_block``): ``plan``'s, every matrix F16 or BF16 with rows a multiple of 32
    values long."""
    p = plan(L, bg, form, lambda kind: float_code(kind, half_x))
    if p is None or any(w.shape[1] % 32 for w in p.W):
        return None
    p.act = SILU if form == "float_block" else GELU_ERF
    return p
