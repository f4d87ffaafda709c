"""The decode step's compiled routes (runtime.decode_block) as the model runs them: which layers a
one-token step can run as one compiled call per block (``_block_plans``), whether the whole step
and the head run as one call (``_compiled_step``), the arguments each takes, and the bytes each
counts: what the step by step path of runtime.model counts for the same work.

A mixin of ``runtime.model.Model``: it reads the model's weights, caches and RoPE tables, and
the arithmetic the caller passes (the plans are gathered once per arithmetic)."""

from __future__ import annotations

import numba
import numpy as np

from runtime import block_graph, decode_block, ggml_ops, kernels, ops
from runtime.weights import Matrix

_NO_BIAS = np.zeros(0, np.float32)  # layer_norm without a bias


class CompiledRoutes:
    """The compiled decode routes of a ``Model`` (the attributes it reads are the model's)."""

    def _block_plans(self, a: kernels.Arithmetic) -> list | None:
        """Per layer, what ``decode_block``'s blocks take (None where none applies), when a
        decode step can run its blocks compiled: ``fused_glue``, dense mode, no hooks watching
        the FFN. The ggml path's blocks (int8 kernels) or the float path's (F16/BF16 matrices).
        Gathered once per arithmetic."""
        if not (self.fused_glue and self.mode == "dense" and a.name != "llamacpp" and self.input_hook is None
                and self.ffn_input_hook is None and self.ffn_act_hook is None):
            return None
        arith = a.name
        if self._plans is None or self._plans_arith != arith:
            path, act = ("ggml" if self._ggml(a) else "float"), self._activation(a)
            forms = [block_graph.compiled_form(bg, act, path) for bg in self.blocks]
            if path == "ggml":
                self._plans = [decode_block.plan(L, bg, f) for L, bg, f in zip(self.layers, self.blocks, forms)]
            else:
                self._plans = [decode_block.float_plan(L, bg, f, arith == "int8")
                               for L, bg, f in zip(self.layers, self.blocks, forms)]
            self._plans_arith = arith
        return self._plans

    def _compiled_step(self, plans: list, a: kernels.Arithmetic) -> tuple | None:
        """(the step function, its arguments after x, positions and p0, the bytes of the largest
        matrix, whether positions go in as float64) when a whole decode step runs as one call:
        every layer has a block plan of one kind, the output matrix has a kernel of that path
        (an int8 kernel after ``decode_block.step`` / ``parallel_step``, an F16/BF16 one after
        ``float_step`` / ``float_parallel_step``), nothing comes after the head (no final soft
        cap), and the layers' arguments are of one numba type. Gathered once per plan list."""
        if self._step is not None and self._step[0] is plans:
            return self._step[1]
        self._step, step = (plans, None), None
        kinds = {(p.parallel, p.act) for p in plans if p is not None}
        if (type(self.output) is Matrix and all(p is not None for p in plans) and len(kinds) == 1
                and not self.hp.final_softcap and self.pos_embd is None):
            parallel, act = next(iter(kinds))
            if act is None:  # the int8 blocks
                head = decode_block.kernel_code(self.output.kind)
                run = decode_block.parallel_step if parallel else decode_block.step
                eps, gather = np.float32(self.hp.norm_eps), self._block_args
            else:  # the float blocks (rows of a multiple of 32 values, as float_plan asks)
                head = decode_block.float_code(self.output.kind, a.name == "int8")
                head = None if self.output.data.shape[1] % 32 else head
                run = decode_block.float_parallel_step if parallel else decode_block.float_step
                eps, gather = float(self.hp.norm_eps), self._float_block_args
            if head is not None:
                for i, p in enumerate(plans):
                    gather(i, p)
                layers = tuple(p.args for p in plans)
                if len({numba.typeof(a) for a in layers}) == 1:
                    step = (run, (layers, self.output_norm,
                                  _NO_BIAS if self.output_norm_b is None else self.output_norm_b, eps,
                                  self.hp.graph.norm == "layer", self.output.data, head),
                            max([p.largest for p in plans] + [self.output.nbytes]), act is not None)
        self._step = (plans, step)
        return step

    def _block_args(self, layer: int, p) -> None:
        """Gather ``decode_block.block``'s (or ``parallel_block``'s) arguments after p0 into
        ``p.args``, once."""
        hp, bg = self.hp, self.blocks[layer]
        if p.args is None:  # the layer's constants, once
            scale = ggml_ops.kq_scale(hp.attn_scale)
            norms = ((p.attn_norm, p.attn_norm_b, p.ffn_norm, p.ffn_norm_b, ops.gelu_table()) if p.parallel
                     else (p.attn_norm, p.ffn_norm, p.q_norm, p.k_norm))
            p.args = (p.W, p.codes, p.B, *norms, np.float32(hp.norm_eps),
                      self._theta_scale[hp.rope_base_swa if bg.local_rope else hp.rope_base],
                      self._freq_factors_swa if bg.local_rope else self._freq_factors, bg.rope == "neox",
                      bg.rope is not None, scale if bg.q_prescale else np.float32(1.0),
                      np.float32(1.0) if bg.q_prescale else scale, bg.window, np.float32(bg.attn_softcap),
                      self.k_cache[layer], self.v_cache[layer], hp.n_heads, hp.n_kv, hp.head_dim)

    def _compiled_block(self, layer: int, p, x: np.ndarray, rest: np.ndarray | None,
                        positions: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
        """``decode_block.block`` for one token: (x + attention, the FFN output, its nonzeros),
        bytes counted as the step by step path counts them."""
        if p.act is not None:
            return self._compiled_float_block(layer, p, x, rest, positions)
        self._block_args(layer, p)
        p0 = int(positions[0])
        kernels.threads_for(p.largest)  # every matmul and the attention of the block on these
        run = decode_block.parallel_block if p.parallel else decode_block.block
        x, ffn, nnz = run(x, self._no_rest if rest is None else rest, positions, p0, *p.args)
        self._count_block(layer, p, p0)
        return x, ffn, int(nnz)

    def _compiled_float_block(self, layer: int, p, x: np.ndarray, rest: np.ndarray | None,
                              positions: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
        """``decode_block.float_block`` (or its parallel form) for one token, as ``_compiled_block``."""
        self._float_block_args(layer, p)
        p0 = int(positions[0])
        kernels.threads_for(p.largest)
        run = decode_block.float_parallel_block if p.parallel else decode_block.float_block
        x, ffn, nnz = run(x, self._no_rest if rest is None else rest, positions.astype(np.float64), p0, *p.args)
        self._count_block(layer, p, p0)
        return x, ffn, int(nnz)

    def _float_block_args(self, layer: int, p) -> None:
        """Gather ``decode_block.float_block``'s (or ``float_parallel_block``'s) arguments after
        p0 into ``p.args``, once."""
        hp, bg = self.hp, self.blocks[layer]
        if p.args is None:
            norms = ((p.attn_norm, p.attn_norm_b, p.ffn_norm, p.ffn_norm_b) if p.parallel
                     else (p.attn_norm, p.ffn_norm, p.q_norm, p.k_norm))
            p.args = (p.W, p.codes, p.B, *norms, float(hp.norm_eps),
                      self._inv_freq_swa if bg.local_rope else self._inv_freq, bg.rope == "neox",
                      bg.rope is not None, float(hp.attn_scale), bg.window, bg.attn_softcap,
                      self.k_cache[layer], self.v_cache[layer], hp.n_heads, hp.n_kv, hp.head_dim, p.act)

    def _count_block(self, layer: int, p, p0: int) -> None:
        """A compiled block's weight and K/V bytes, as the step by step path counts them."""
        for tensor, nbytes in p.reads:
            self.counter.add("weights", nbytes, layer, tensor)
        self._kv_reads(layer, 1, p0 + 1)
