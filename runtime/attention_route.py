"""Attention in the step by step route of ``runtime.model.Model``: q/k norms, RoPE, the KV cache
write and the attention itself, in the float path's operations (runtime.ops) or ggml's
(runtime.ggml_ops), each fact read from the layer's ``BlockGraph`` (runtime/block_graph.py).

A mixin of ``Model``: it reads the model's hyperparameters, caches, RoPE tables and byte counter."""

from __future__ import annotations

import numpy as np

from runtime import attention_gemm, ggml_ops, kernels, ops
from runtime.block_graph import BlockGraph

F32 = 4
_NO_NORM = np.zeros(0, np.float32)  # attention_inputs without a q/k norm


class AttentionRoute:
    """The attention of a ``Model``'s step by step route (the attributes it reads are the model's)."""

    def _head_norm(self, x: np.ndarray, w: np.ndarray, a: kernels.Arithmetic) -> np.ndarray:  # x (T, H, hd)
        flat = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, x.shape[-1])
        if self._ggml(a):
            return ggml_ops.rms_norm(flat, w, np.float32(self.hp.norm_eps)).reshape(x.shape)
        return ops.rms_norm(flat, w, self.hp.norm_eps).reshape(x.shape)

    def _rope(self, x: np.ndarray, positions: np.ndarray, a: kernels.Arithmetic,
              bg: BlockGraph) -> np.ndarray:  # x (T, H, hd)
        x = np.array(x, dtype=np.float32)  # a copy: q/k are views of the projection output
        neox, local = bg.rope == "neox", bg.local_rope
        if self._ggml(a):
            base = self.hp.rope_base_swa if local else self.hp.rope_base
            ff = self._freq_factors_swa if local else self._freq_factors
            ggml_ops.rope(x, positions.astype(np.int64), ggml_ops.theta_scale(base, self.hp.rope_dims), ff, neox)
            return x
        inv = self._inv_freq_swa if local else self._inv_freq
        ops.rope(x, positions.astype(np.float64), inv, neox)
        return x

    def _kv_reads(self, layer: int, T: int, n: int) -> None:
        """Count a chunk of T tokens' K/V writes and the reads of n cached positions; set the threads."""
        hp = self.hp
        kv_row = hp.n_kv * hp.head_dim * F32
        self.counter.add("kv_cache", 2 * kv_row * T, layer)  # write
        self.counter.add("kv_cache", 2 * kv_row * n, layer)  # read K and V once per chunk
        kernels.threads_for(2 * F32 * T * hp.n_heads * n * hp.head_dim)  # K and V values each query head reads

    def _attention_ggml(self, layer: int, L: dict, q, k, v, positions, g: BlockGraph, a: kernels.Arithmetic,
                        last: bool, starts) -> np.ndarray:
        """The ggml path from the projections to the attention output in two compiled calls
        (``ggml_ops.attention_inputs``, then ``ggml_ops.attention``): the same arithmetic as the
        step by step path (``fused_glue = False``), with fewer operations run cold after each
        weight matrix streams through the caches."""
        hp, T = self.hp, q.shape[0]
        p0 = int(positions[0])
        scale = ggml_ops.kq_scale(hp.attn_scale)
        pre = scale if g.q_prescale else np.float32(1.0)  # llama.cpp scales q, then softmax with scale 1
        qn, kn = (L[f"attn_{x}_norm.weight"] if g.qk_norm else _NO_NORM for x in "qk")
        base = hp.rope_base_swa if g.local_rope else hp.rope_base
        q = ggml_ops.attention_inputs(
            q, k, v, qn, kn, np.float32(hp.norm_eps), positions, self._theta_scale[base],
            self._freq_factors_swa if g.local_rope else self._freq_factors, g.rope == "neox", g.rope is not None, pre,
            self.k_cache[layer], self.v_cache[layer], p0)
        self._kv_reads(layer, T, p0 + T)
        return attention_gemm.attention_ggml(q, self.k_cache[layer], self.v_cache[layer], p0,
                                             np.float32(1.0) if g.q_prescale else scale, g.window,
                                             np.float32(g.attn_softcap), a, last, starts)

    def _attention(self, layer: int, q, k, v, positions, g: BlockGraph, a: kernels.Arithmetic, last: bool,
                   starts) -> np.ndarray:
        hp, T = self.hp, q.shape[0]
        p0 = int(positions[0])
        self.k_cache[layer, :, p0 : p0 + T] = k.transpose(1, 0, 2)
        self.v_cache[layer, :, p0 : p0 + T] = v.transpose(1, 0, 2)
        n = p0 + T
        self._kv_reads(layer, T, n)
        if self._ggml(a):
            scale = ggml_ops.kq_scale(hp.attn_scale)
            if g.q_prescale:  # llama.cpp scales q, then runs the softmax with scale 1
                q, scale = q * scale, np.float32(1.0)
            return attention_gemm.attention_ggml(q, self.k_cache[layer], self.v_cache[layer], p0, scale,
                                                 g.window, np.float32(g.attn_softcap), a, last, starts)
        return attention_gemm.attention_float(q, self.k_cache[layer], self.v_cache[layer], p0, hp.attn_scale,
                                              g.window, g.attn_softcap, a, last, starts)

