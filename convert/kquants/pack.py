"""ggml's K-quant block layouts (vectorized numpy): the integer fields ``search`` finds ->
``block_q*_K`` bytes, one row of ``BLOCK_BYTES`` per 256-value super-block (as
``gguf.quants.dequantize`` and llama.cpp read them)."""

from __future__ import annotations

import numpy as np


def _f16_bytes(v: np.ndarray) -> np.ndarray:
    return v.astype(np.float16).view(np.uint8).reshape(-1, 2)


def _pack_scales_k4(ls: np.ndarray, lm: np.ndarray) -> np.ndarray:
    """Eight 6-bit scales and mins -> ggml's 12-byte ``scales`` of Q4_K/Q5_K."""
    out = np.empty((ls.shape[0], 12), np.uint8)
    out[:, 0:4] = ls[:, :4] | ((ls[:, 4:] >> 4) << 6)
    out[:, 4:8] = lm[:, :4] | ((lm[:, 4:] >> 4) << 6)
    out[:, 8:12] = (ls[:, 4:] & 0xF) | ((lm[:, 4:] & 0xF) << 4)
    return out


def _nibbles_k4(L: np.ndarray) -> np.ndarray:
    """Levels (nb, 256) -> 128 bytes: per 64 values, value l in the low and l+32 in the high nibble."""
    q = (L & 0xF).reshape(-1, 4, 2, 32)
    return (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(-1, 128)


def _crumbs(u: np.ndarray) -> np.ndarray:
    """2-bit values (nb, 256) -> 64 bytes: per 128 values, four 32-value groups at shifts 0,2,4,6."""
    q = (u & 3).reshape(-1, 2, 4, 32)
    return (q[:, :, 0] | (q[:, :, 1] << 2) | (q[:, :, 2] << 4) | (q[:, :, 3] << 6)).reshape(-1, 64)


def _bitplane(bits: np.ndarray) -> np.ndarray:
    """One bit per value (nb, 256) -> 32 bytes: bit g of byte l is value 32·g + l."""
    b = bits.reshape(-1, 8, 32).astype(np.uint8)
    return np.bitwise_or.reduce(b << np.arange(8, dtype=np.uint8)[None, :, None], axis=1)


def _pack_q4_k(d, dmin, ls, lm, L) -> np.ndarray:
    return np.concatenate([_f16_bytes(d), _f16_bytes(dmin), _pack_scales_k4(ls, lm), _nibbles_k4(L)], axis=1)


def _pack_q5_k(d, dmin, ls, lm, L) -> np.ndarray:
    qh = _bitplane(L >> 4)
    return np.concatenate([_f16_bytes(d), _f16_bytes(dmin), _pack_scales_k4(ls, lm), qh, _nibbles_k4(L)], axis=1)


def _pack_q2_k(d, dmin, ls, lm, L) -> np.ndarray:
    return np.concatenate([ls | (lm << 4), _crumbs(L), _f16_bytes(d), _f16_bytes(dmin)], axis=1)


def _pack_q6_k(d, sc, L) -> np.ndarray:
    u = (L.astype(np.int16) + 32).astype(np.uint8)  # 0..63
    lo = (u & 0xF).reshape(-1, 2, 2, 64)  # value 128h + 64s + p -> ql[64h + p], nibble s
    ql = (lo[:, :, 0] | (lo[:, :, 1] << 4)).reshape(-1, 128)
    hi = (u >> 4).reshape(-1, 2, 4, 32)  # value 128h + 32g + l -> qh[32h + l], bits 2g
    qh = (hi[:, :, 0] | (hi[:, :, 1] << 2) | (hi[:, :, 2] << 4) | (hi[:, :, 3] << 6)).reshape(-1, 64)
    return np.concatenate([ql, qh, sc.view(np.uint8), _f16_bytes(d)], axis=1)


def _pack_q3_k(d, sc, L) -> np.ndarray:
    u = (L.astype(np.int16) + 4).astype(np.uint8)  # 0..7: high bit in hmask, low 2 bits in qs
    s = (sc.astype(np.int16) + 32).astype(np.uint8)  # 0..63
    scales = np.empty((s.shape[0], 12), np.uint8)
    scales[:, 0:8] = (s[:, 0:8] & 0xF) | ((s[:, 8:16] & 0xF) << 4)
    hi = (s >> 4) & 3
    scales[:, 8:12] = hi[:, 0:4] | (hi[:, 4:8] << 2) | (hi[:, 8:12] << 4) | (hi[:, 12:16] << 6)
    return np.concatenate([_bitplane(u >> 2), _crumbs(u), scales, _f16_bytes(d)], axis=1)


PACK = {"q2_k": _pack_q2_k, "q3_k": _pack_q3_k, "q4_k": _pack_q4_k, "q5_k": _pack_q5_k, "q6_k": _pack_q6_k}
