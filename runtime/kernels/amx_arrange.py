"""The activations as runtime.kernels.amx's tiles load them: each block of 16 tokens and each
group of G values (the values that share one weight scale) as the B tile of TDPBUSD/TDPBSSD
wants it, word j (values 4j..4j+3) of the 16 tokens side by side, with each group's d_x and its
minimum term's d_x·Σq_x; and the second activation plane (``residual_plane``) the same way.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from aios.quant import QK_K
from runtime.kernels.amx_kernel import AMX_TOKENS
from runtime.kernels.kq_lanes import B32_TILES, LANE_VALUES, byte_sum4, word_at_i8
from runtime.kernels.quantize import LO_STEPS, residual_plane


# --- the activations, as the B tile loads them -----------------------------------------------------
@njit(cache=True, inline="always")
def _group_words(row, XA, tb, g, G, t16, count):
    """Group g of one token's int8 ``row`` into XA[tb, g, :, t16] (word j: values 4j..4j+3);
    with ``count`` the sum of its values (else 0)."""
    total = np.int32(0)
    for j in range(G // 4):
        w = word_at_i8(row, g * G + 4 * j)
        XA[tb, g, j, t16] = w
        if count:
            total += byte_sum4(w)
    return total


@njit(cache=True, inline="always")
def _pad_token(XA, tb, t16, ng, G):
    """A token slot past T: zero words (its sums come out 0 and are never stored)."""
    for g in range(ng):
        for j in range(G // 4):
            XA[tb, g, j, t16] = 0


@njit(parallel=True, cache=True)
def arrange_amx(xq, xd, xb, G, kq, XA, XD, XB):
    """The activations' int8 blocks (xq (T, k) int8; Q8_K: ``kq``, xd (T, k/256), xb (T, k/16)
    group sums; Q8_0: xd (T, k/32)) for the tiles: XA (T/16, groups, G/4, 16) uint32, word j of
    group g for the block's 16 tokens side by side; XD (groups, T) each group's d_x; XB
    (groups, T) d_x·Σq_x over the group (the affine types' minimum term). T padded to 16."""
    T, k = xq.shape
    ng = k // G
    for tb in prange(XA.shape[0]):
        for t16 in range(AMX_TOKENS):
            t = tb * AMX_TOKENS + t16
            if t >= T:
                _pad_token(XA, tb, t16, ng, G)
                for g in range(ng):
                    XD[g, t] = 0.0
                    XB[g, t] = 0.0
                continue
            row = xq[t]
            for g in range(ng):
                total = _group_words(row, XA, tb, g, G, t16, not kq)
                if kq:
                    dx = xd[t, (g * G) // QK_K]
                    for h in range(G // 16):
                        total += np.int32(xb[t, (g * G) // 16 + h])
                else:
                    dx = xd[t, g]
                XD[g, t] = dx
                XB[g, t] = dx * np.float32(total)


@njit(parallel=True, cache=True)
def arrange_amx_lo(xq_lo, G, XA_lo, XD, XB):
    """The second plane for the tiles, after ``arrange_amx`` arranged the first into (XA, XD, XB):
    XA_lo its words as XA holds the first's; XD (each group's d) becomes d/128, the step of the
    16-bit quants 128·q + q_lo, and XB (d·Σq) d·Σq + (d/128)·Σq_lo, their minimum term's sum."""
    T, k = xq_lo.shape
    ng = k // G
    for tb in prange(XA_lo.shape[0]):
        for t16 in range(AMX_TOKENS):
            t = tb * AMX_TOKENS + t16
            if t >= T:
                _pad_token(XA_lo, tb, t16, ng, G)
                continue
            row = xq_lo[t]
            for g in range(ng):
                total = _group_words(row, XA_lo, tb, g, G, t16, True)
                d = XD[g, t] / np.float32(LO_STEPS)
                XD[g, t] = d
                XB[g, t] += d * np.float32(total)



# --- the activations of a whole matmul --------------------------------------------------------
def arranged_amx(fmt: str, xq: np.ndarray, xd: np.ndarray, xb: np.ndarray | None = None):
    """The activations' int8 blocks (Q8_K for the K-quants: xq, xd, xb; Q8_0 for the 32-value
    types: xq, xd) as the tiles load them: (XA, XD, XB, T)."""
    T, k = xq.shape
    G = LANE_VALUES[fmt]
    ng = k // G
    nb = -(-T // AMX_TOKENS)
    XA = np.empty((nb, ng, G // 4, AMX_TOKENS), np.uint32)
    XD = np.empty((ng, nb * AMX_TOKENS), np.float32)
    XB = np.empty((ng, nb * AMX_TOKENS), np.float32)
    kq = fmt not in B32_TILES
    arrange_amx(xq, xd, xb if kq else xd, G, kq, XA, XD, XB)
    return XA, XD, XB, T


def arranged_amx2(fmt: str, X: np.ndarray, xq: np.ndarray, xd: np.ndarray, xb: np.ndarray | None = None):
    """``arranged_amx`` of X's int8 blocks (xq, xd[, xb]) plus their second plane
    (``residual_plane``): (XA, XD, XB, T, XA_lo), which ``mm_amx`` multiplies as 16-bit
    activations."""
    XA, XD, XB, T = arranged_amx(fmt, xq, xd, xb)
    lo = residual_plane(np.ascontiguousarray(X, np.float32), xq, xd, xq.shape[1] // xd.shape[1])
    XA_lo = np.empty_like(XA)
    arrange_amx_lo(lo, LANE_VALUES[fmt], XA_lo, XD, XB)
    return XA, XD, XB, T, XA_lo
