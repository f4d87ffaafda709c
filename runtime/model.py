"""The decoder forward pass over GGUF weights (llama.cpp tensor conventions), with byte counting.

Supported: the architecture rows with ``runtime=True`` (aios/models/architectures.py); the
graph — norm kind, RoPE pairing, fused or separate QKV, parallel or sequential block, gated
FFN — is read off the row, never compared by architecture name.
The FFN activation is the one the file *declares* (``aios.ffn_activation``), not the one
llama.cpp hard-codes, so relufied models run as they were trained.

FFN modes:
  dense        every weight row read
  sparse       exact: down-projection rows of zero activations are skipped, and in gated
               FFNs the up rows whose gate is zero (needs a ReLU-family activation;
               identical results to dense)
  map          static sparsity map (``blk.N.ffn_active``): masked neurons skipped in
               up/gate and down — lossy, labelled so in every output
  predict      a low-rank activation predictor (runtime/predictor.py) picks the up/gate
               rows to compute per token; down rows of zero activations skipped — lossy
               (a firing neuron predicted silent is lost), labelled so in every output
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from aios.errors import InvalidModelError, UnsupportedArchitectureError, UsageError
from aios.io import sparse_zeros
from runtime import attention_gemm, ggml_ops, gguf_checks, kernels, ops, thresholds
from runtime.accounting import ByteCounter
from runtime.activations import GELU_FAMILY, GGML_GELU, GGML_SILU, activation
from runtime.attention_route import AttentionRoute
from runtime.block_graph import BlockGraph, block_graph
from runtime.compiled_routes import CompiledRoutes
from runtime.extensions import LAYER_HOOKS
from runtime.hparams import HParams, read_hparams, runtime_row  # noqa: F401  (HParams: part of this module's API)
from runtime.modes import LOSSY_MODES, MODES  # noqa: F401  (LOSSY_MODES: part of this module's API)
from runtime.weights import Linear, from_gguf_tensor, transpose, vector

RELU_FAMILY = ("relu", "relu2", "fatrelu")

F32 = 4
_NO_BIAS = np.zeros(0, np.float32)  # layer_norm without a bias


class Model(AttentionRoute, CompiledRoutes):
    """Weights (mmap-backed where possible), KV cache, and the forward pass."""

    # the ggml path runs what sits between the kernels as few compiled calls (same arithmetic);
    # False keeps the step by step path, which tests compare it with
    fused_glue: bool = True

    def __init__(self, path: str | Path, mode: str = "dense", n_ctx: int | None = None,
                 predictor: str | Path | None = None,
                 arithmetic: str | kernels.Arithmetic | None = None) -> None:
        """``arithmetic``: how the block kernels multiply (a name of kernels.ARITHMETICS or a
        kernels.Arithmetic; None: the default, "int8"), for every forward pass that does not
        pass its own (``forward(..., arith=...)``)."""
        self.arith = kernels.Arithmetic.of(arithmetic)
        if mode not in MODES:
            raise UsageError(f"Unknown FFN mode '{mode}'; choose from {', '.join(MODES)}.")
        from aios.errors import ModelNotFoundError
        from aios.models.tensors import GGUFStore

        if not Path(path).is_file():
            raise ModelNotFoundError(f"No such GGUF file: {path}.")
        store = GGUFStore(Path(path))  # validates magic / structure with a clear error
        self.path, self.reader, self.mode = Path(path), store.reader, mode
        arch = store.field("general.architecture")
        t = {x.name: x for x in self.reader.tensors}
        row = runtime_row(arch, "blk.0.attn_norm_2.weight" in t)
        gguf_checks.check_hparams(store, arch, self.path)  # a lying file: one sentence, exit 4
        self.hp = hp = read_hparams(store, row, n_ctx)
        # calibrated per-layer cuts (aios-convert sparsify): part of the model, applied in every mode
        self._thresholds = thresholds.read(store, hp.n_layers, hp.d_ffn, row.gated_ffn, self.path)
        # calibrated cuts of the projections' inputs (aios-convert sparsify --scope all), in every mode
        self._input_cuts = thresholds.read_inputs(store, hp.n_layers, self.path)
        if mode != "dense" and hp.activation not in RELU_FAMILY and self._thresholds is None:
            raise UsageError(
                f"--mode {mode} needs a ReLU-family activation; this model runs '{hp.activation}', "
                "which never produces exact zeros. Relufy it (aios-convert relufy) or add calibrated "
                "thresholds (aios-convert sparsify) first."
            )
        gguf_checks.check_cache(hp, self.path, n_ctx is not None)
        gguf_checks.check_tensors(t, hp, self.path)
        self.tok_embd = from_gguf_tensor(t["token_embd.weight"])
        self.output = from_gguf_tensor(t["output.weight"]) if "output.weight" in t else self.tok_embd
        self.output_norm = vector(t["output_norm.weight"])
        self.output_norm_b = vector(t["output_norm.bias"]) if "output_norm.bias" in t else None
        # learned absolute positions (GPT-2): one row per position, added to the token embeddings
        self.pos_embd = from_gguf_tensor(t["position_embd.weight"]) if row.rope is None else None
        self.layers = [self._layer(t, i) for i in range(hp.n_layers)]
        # each layer's graph facts, read by every route (runtime/block_graph.py)
        self.blocks: list[BlockGraph] = []
        self._regraph()
        # FFN matrices with an int8 kernel: under the int8 arithmetic the activation is ggml's too
        self._int8_weights = any(getattr(p, "kind", "").lower() in kernels.INT8_DEFAULT
                                 for L in self.layers for op in L.values() if hasattr(op, "parts")
                                 for p in op.parts())
        self.counter = ByteCounter()
        self.ffn_input_hook = None  # callable(layer, h): sees every FFN input (predictor fitting)
        self.ffn_act_hook = None  # callable(layer, a): sees the down projection's input (R1 counts)
        self.input_hook = None  # callable(layer, site, x): sees each INPUT_SITES input before its cut
        self.predictor = None
        self.pred_stats = {"fired": 0, "missed": 0, "predicted": 0, "rows": 0}
        # predict mode: also compute the true activations of each decode step to count the
        # predictor's misses (a full gate/up product per layer — off unless asked for, so timed
        # runs do not pay for it)
        self.measure_fnr = False
        if mode == "predict":
            from runtime import predictor as P

            self.predictor = P.load(predictor or P.default_path(self.path), self)
        # head-major (layer, KV head, position, head_dim): a head's keys are contiguous, so
        # attention streams them (ops.attention)
        # pages resident only where a position is written (zeros_like filled the real Gemma 3's
        # 32k context, 1.2 GB; np.zeros' 2 MiB huge pages made 72 MiB of one token: sparse_zeros)
        self.k_cache = sparse_zeros((hp.n_layers, hp.n_kv, hp.n_ctx, hp.head_dim))
        self.v_cache = sparse_zeros((hp.n_layers, hp.n_kv, hp.n_ctx, hp.head_dim))
        self.pos = 0
        inv = hp.rope_base ** (-np.arange(0, hp.rope_dims, 2, dtype=np.float64) / hp.rope_dims)
        ff = np.ones(hp.rope_dims // 2, np.float32)
        if "rope_freqs.weight" in t:  # per-frequency divisors (Llama 3.1 RoPE scaling), as llama.cpp
            ff = np.ascontiguousarray(vector(t["rope_freqs.weight"])[: hp.rope_dims // 2], np.float32)
            inv = inv / ff.astype(np.float64)
        elif "rope_factors_long.weight" in t or "rope_factors_short.weight" in t:
            raise UnsupportedArchitectureError(f"{self.path.name} has LongRoPE factors (rope_factors_long/short); "
                                               "aios-run does not run LongRoPE.")
        # linear RoPE scaling multiplies the angle by rope_scale: folded into the divisors (ggml
        # computes scale·(θ/ff); θ/(ff/scale) rounds the same when the factor is a power of two)
        self._freq_factors = np.ascontiguousarray(ff / np.float32(hp.rope_scale), np.float32)
        self._freq_factors_swa = np.full(hp.rope_dims // 2, 1 / np.float32(hp.rope_scale_swa), np.float32)
        self._inv_freq = inv * hp.rope_scale  # (rope_dims/2,)
        # local (sliding-window) layers' RoPE base (Gemma 3: 10,000 vs 1,000,000 for global ones)
        self._inv_freq_swa = hp.rope_base_swa ** (-np.arange(0, hp.rope_dims, 2, dtype=np.float64)
                                                  / hp.rope_dims) * hp.rope_scale_swa
        # ggml_rope's per-dimension factor of each base, computed once (the fused path's argument)
        self._theta_scale = {b: ggml_ops.theta_scale(b, hp.rope_dims) if hp.rope_dims else np.float32(1.0)
                             for b in (hp.rope_base, hp.rope_base_swa)}
        self._plans = None  # decode_block plans per layer, gathered at the first decode step
        self._plans_arith = None  # the arithmetic they were gathered for
        self._step = None  # (the plan list, decode_block.step's call or None): see _compiled_step
        self._no_rest = np.zeros((0, hp.d_model), np.float32)

    # --- the graph's cuts: part of each layer's BlockGraph, so every route follows a change -----
    def _regraph(self) -> None:
        """Each layer's graph facts (runtime/block_graph.py), gathered again after a cut changes."""
        ffn = (self._thresholds.site,) if self._thresholds is not None else ()
        inputs = self._input_cuts.sites if self._input_cuts is not None else (lambda i: ())
        self.blocks = [block_graph(self.hp, L, i, inputs(i) + ffn) for i, L in enumerate(self.layers)]
        self._plans = self._step = None

    @property
    def thresholds(self) -> thresholds.FfnThresholds | None:
        """The FFN cut (runtime/thresholds.py); None: none. Settable (sparsify's calibration)."""
        return self._thresholds

    @thresholds.setter
    def thresholds(self, value: thresholds.FfnThresholds | None) -> None:
        self._thresholds = value
        self._regraph()

    @property
    def input_cuts(self) -> thresholds.InputThresholds | None:
        """The cuts of the projections' inputs (runtime/thresholds.py); None: none. Settable."""
        return self._input_cuts

    @input_cuts.setter
    def input_cuts(self, value: thresholds.InputThresholds | None) -> None:
        self._input_cuts = value
        self._regraph()

    def _site(self, x: np.ndarray, layer: int, site: str, g: BlockGraph) -> np.ndarray:
        """A projection input at ``site``: shown to ``input_hook``, cut where the layer's graph says."""
        if self.input_hook is not None:
            self.input_hook(layer, site, x)
        return self._input_cuts.cut(x, layer, site) if site in g.cuts else x

    # --- loading ---------------------------------------------------------------------
    def _layer(self, t: dict, i: int) -> dict:
        p = f"blk.{i}."
        L: dict = {}
        for name, x in t.items():
            if not name.startswith(p):
                continue
            key = name[len(p):]
            if len(x.shape) >= 2 and int(x.shape[1]) > 1:
                L[key] = from_gguf_tensor(x)
            else:
                L[key] = vector(x)
        for hook in LAYER_HOOKS:  # extension formats turn their tensors into composite operators
            hook(self, t, i, L)
        gguf_checks.check_layer(self.hp, i, L, self.path)
        if self.mode != "dense" and "ffn_down.T" not in L:  # (a neuron-major file provides it)
            if not hasattr(L["ffn_down.weight"], "kind"):  # a composite operator (no stored type) has no rows to transpose
                raise UsageError(f"--mode {self.mode} reads single neurons' rows of ffn_down, but {self.path.name} "
                                 f"stores blk.{i}.ffn_down as a composite in the standard layout; run --mode dense, "
                                 "or convert again with --sparse-down.")
            L["ffn_down.T"] = transpose(L["ffn_down.weight"])
        if self.mode == "map":
            if "ffn_active" not in L:
                raise InvalidModelError(f"--mode map needs blk.N.ffn_active tensors; {self.path.name} has none.")
            L["kept"] = np.flatnonzero(np.asarray(L["ffn_active"]) > 0).astype(np.int64)
        return L

    def _ggml(self, a: kernels.Arithmetic) -> bool:
        """Whether a forward pass in ``a`` rounds as llama.cpp does: the int8 arithmetic is
        llama.cpp's, so when it runs (block-typed weights with an int8 kernel, ``--arithmetic
        int8``) the norms, RoPE, attention and activation are ggml's too (runtime.ggml_ops); the
        float path keeps runtime.ops, closer to exact."""
        return self._int8_weights and a.ggml

    def _activation(self, a: kernels.Arithmetic) -> str:
        """The FFN activation this forward pass computes: under ``_ggml()`` a GELU-family one is
        ggml's tanh GELU looked up in an fp16 table (``ops.gelu_ggml``) and SiLU is ggml's
        polynomial exp; the float path keeps the checkpoint's own function (HF "gelu" is erf GELU)."""
        name = self.hp.activation
        if self._ggml(a) and name in GELU_FAMILY:
            return GGML_GELU
        if self._ggml(a) and name == "silu":
            return GGML_SILU
        return name

    @property
    def weight_bytes(self) -> int:
        """Bytes of the distinct stored matrices (a shared tensor counts once)."""
        ops = [self.tok_embd, self.output] + [m for L in self.layers for m in L.values() if hasattr(m, "parts")]
        return sum({id(p): p.nbytes for op in ops for p in op.parts()}.values())

    # --- pieces --------------------------------------------------------------------
    def _mm(self, m: Linear, X: np.ndarray, layer: int | None, a: kernels.Arithmetic,
            rows: np.ndarray | None = None, bias: np.ndarray | None = None) -> np.ndarray:
        for tensor, nbytes in m.reads(rows):
            self.counter.add("weights", nbytes, layer, tensor)
        y = m.matmul(X, rows, a)
        if bias is not None:
            self.counter.add("weights", bias.nbytes, layer, m.name + ".bias")
            y += bias
        return y

    def _norm(self, x: np.ndarray, w: np.ndarray, b: np.ndarray | None, a: kernels.Arithmetic,
              kind: str | None = None) -> np.ndarray:
        """The norm of x: ``kind`` ("rms", "layer"; None: the model's, as its output norm)."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        ggml = self._ggml(a)
        if (kind or self.hp.graph.norm) == "layer":
            b = _NO_BIAS if b is None else b
            if ggml:
                return ggml_ops.layer_norm(x, w, b, np.float32(self.hp.norm_eps))
            return ops.layer_norm(x, w, b, self.hp.norm_eps)
        if ggml:
            return ggml_ops.rms_norm(x, w, np.float32(self.hp.norm_eps))
        return ops.rms_norm(x, w, self.hp.norm_eps)

    def _fuse_norm(self, b: np.ndarray | None, a: kernels.Arithmetic, kind: str | None = None) -> bool:
        """Whether a residual add and the RMS norm after it run as one compiled call."""
        return self.fused_glue and b is None and (kind or self.hp.graph.norm) != "layer" and self._ggml(a)

    def _add_norm(self, x: np.ndarray, y: np.ndarray | None, w: np.ndarray,
                  b: np.ndarray | None, a: kernels.Arithmetic, kind: str | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(x + y, norm(x + y)); y None: (x, norm(x)). ``kind``: as ``_norm``."""
        if y is None:
            return x, self._norm(x, w, b, a, kind)
        if self._fuse_norm(b, a, kind):
            return ggml_ops.add_rms_norm(x, y, w, np.float32(self.hp.norm_eps))
        x = x + y
        return x, self._norm(x, w, b, a, kind)

    def _mm_shared(self, L: dict, names: tuple[str, ...], X: np.ndarray, layer: int, a: kernels.Arithmetic,
                   rows: np.ndarray | None = None) -> list[np.ndarray]:
        """The matmuls ``names`` of one input X; X quantized once for all (``fused_glue``)."""
        if self.mode != "dense" and any(f"{n}.T" in L for n in names):
            return [self._project(L, n, X, layer, a, rows) for n in names]
        shared = a.sharing(X) if self.fused_glue else a
        return [self._mm(L[f"{n}.weight"], X, layer, shared, rows, L.get(f"{n}.bias")) for n in names]

    def _project(self, L: dict, name: str, X: np.ndarray, layer: int, a: kernels.Arithmetic,
                 rows: np.ndarray | None = None) -> np.ndarray:
        """X @ Wᵀ (+ bias) of the layer's matrix ``name``. In a sparse mode, where the layer has it
        input-major (``name.T``: runtime/sparse_down.py), each token reads only the rows of its
        nonzero inputs (a prompt: the rows nonzero in some token, once), and the counter adds
        exactly those rows' stored bytes; ``rows`` (the
        outputs a caller needs) is then not used: every output is computed, from fewer rows.
        Otherwise the dense product of ``_mm``. The one place every sparse site runs through."""
        op = L.get(f"{name}.T") if self.mode != "dense" else None
        if op is None:
            return self._mm(L[f"{name}.weight"], X, layer, a, rows, L.get(f"{name}.bias"))
        if X.shape[0] >= 2 and hasattr(op, "chunk_rows"):  # a prompt: each row nonzero in some token, read once
            for tensor, nbytes in op.sparse_reads(op.chunk_rows(X)):
                self.counter.add("weights", nbytes, layer, tensor)
            out = op.matmul(X, None, a)
        else:
            out = np.empty((X.shape[0], op.n_out), np.float32)
            for t in range(X.shape[0]):
                active = np.flatnonzero(X[t]).astype(np.int64)
                for tensor, nbytes in op.sparse_reads(active):  # the stored rows touched, per tensor
                    self.counter.add("weights", nbytes, layer, tensor)
                out[t] = op.sparse_matvec(X[t], active, a)
        bias = L.get(f"{name}.bias")
        if bias is not None:
            self.counter.add("weights", bias.nbytes, layer, op.name + ".bias")
            out += bias
        return out

    def _count_activations(self, layer: int, T: int) -> None:
        """Count a block's intermediate vectors: residual/norm copies (one more with a separate
        FFN norm), q/k/v, attention output, FFN activations (one more when gated), each written
        once and read once."""
        hp, g = self.hp, self.blocks[layer]
        vec = (hp.d_model * (3 if g.parallel and not g.ffn_norm else 4)
               + (hp.n_heads + 2 * hp.n_kv) * hp.head_dim
               + hp.n_heads * hp.head_dim + (3 if g.gated_ffn else 2) * hp.d_ffn)
        self.counter.add("activations", 2 * vec * F32 * T, layer)

    def _predicted_rows(self, h: np.ndarray, layer: int) -> np.ndarray:
        p = self.predictor.layers[layer]
        self.counter.add("weights", p.nbytes, layer, f"blk.{layer}.ffn_predictor")
        with kernels.one_blas_thread():
            guess = p.predict(h)
        return np.flatnonzero(guess.any(0)).astype(np.int64)  # union over the chunk

    def _ffn(self, L: dict, h: np.ndarray, layer: int, a: kernels.Arithmetic) -> tuple[np.ndarray, int]:
        hp = self.hp
        if self.ffn_input_hook is not None:
            self.ffn_input_hook(layer, h)
        rows = L.get("kept") if self.mode == "map" else None
        if self.mode == "predict":
            rows = self._predicted_rows(h, layer)
            if self.measure_fnr and h.shape[0] == 1:  # decode steps only (prefill reads a union)
                self._score_prediction(L, h, rows)
        cuts = self.thresholds
        act = self._activation(a)
        gated = self.blocks[layer].gated_ffn
        if gated and self.mode == "dense" and act == GGML_SILU and cuts is None:
            # ggml's SwiGLU in one pass: silu(gate)·up, the bits of silu(gate)·1 then ·up
            y = ggml_ops.silu_mul(*self._mm_shared(L, ("ffn_gate", "ffn_up"), h, layer, a, rows))
        elif gated:
            g = activation(act, self._project(L, "ffn_gate", h, layer, a, rows), hp.activation_threshold)
            if cuts is not None and cuts.site == "gate":
                g = cuts.cut(g, layer)
            if self.mode != "dense":
                # gate first: a = act(gate)·up is exactly 0 wherever act(gate) is, so only the up
                # rows with a nonzero gate in some token of the chunk are read (exact, not a guess)
                rows = np.flatnonzero(g.any(0)).astype(np.int64)
            y = g * self._project(L, "ffn_up", h, layer, a, rows)
        else:
            y = activation(act, self._project(L, "ffn_up", h, layer, a, rows), hp.activation_threshold)
        y = y.astype(np.float32, copy=False)
        if cuts is not None and cuts.site == "down_in":
            y = cuts.cut(y, layer)
        if rows is not None:
            keep = np.zeros(hp.d_ffn, bool)
            keep[rows] = True
            y[:, ~keep] = 0
        nnz = int(np.count_nonzero(y))
        if self.ffn_act_hook is not None:
            self.ffn_act_hook(layer, y)
        return self._project(L, "ffn_down", y, layer, a), nnz

    def _score_prediction(self, L: dict, h: np.ndarray, rows: np.ndarray) -> None:
        """Count the predictor's false negatives on this input (outside the byte counter)."""
        pre = "ffn_gate" if "ffn_gate.weight" in L else "ffn_up"
        thr = float(self.hp.activation_threshold or 0.0) if self.hp.activation == "fatrelu" else 0.0
        z = L[f"{pre}.weight"].matmul(h)  # (T, d_ffn), computed outside the byte counter
        if f"{pre}.bias" in L:
            z += L[f"{pre}.bias"]
        fired = z > thr
        guess = np.zeros(self.hp.d_ffn, bool)
        guess[rows] = True
        s = self.pred_stats
        s["fired"] += int(fired.sum())
        s["missed"] += int((fired & ~guess[None, :]).sum())
        s["predicted"] += len(rows) * h.shape[0]
        s["rows"] += self.hp.d_ffn * h.shape[0]

    # --- forward ---------------------------------------------------------------------
    def reset(self) -> None:
        self.pos = 0

    def forward(self, tokens: list[int] | np.ndarray, all_logits: bool = False, *,
                arith: kernels.Arithmetic | None = None, starts=None) -> np.ndarray:
        """Run ``tokens`` as one chunk after the cached context; logits (T or 1, vocab).

        ``arith``: this pass's arithmetic (None: the model's, ``self.arith``). ``starts``: the
        chunk is several texts packed back to back from an empty context, beginning at these
        token offsets (ascending from 0; needs the GEMM form): each token is computed as if its
        text ran alone (runtime.attention_gemm)."""
        hp, a = self.hp, self.arith if arith is None else arith
        tokens = np.asarray(tokens, dtype=np.int64)
        T = len(tokens)
        if self.pos + T > hp.n_ctx:
            raise UsageError(f"Context full: {self.pos + T} tokens exceed the context of {hp.n_ctx}.")
        if starts is not None:
            starts = attention_gemm.packed_starts(starts, T)
            if not a.use_gemm(T):
                raise ValueError("packed texts need the GEMM form (a batched arithmetic, GEMM_MIN_TOKENS tokens)")
        positions = attention_gemm.positions(self.pos, T, starts)  # (packed texts: each from 0)
        x = self.tok_embd.rows_f32(tokens)  # (T, d_model): one stored row read per token
        if hp.graph.embed_scale:  # Gemma: embeddings scaled by sqrt(d_model)
            x *= np.float32(math.sqrt(hp.d_model))
        self.counter.add("weights", T * self.tok_embd.row_bytes, None, self.tok_embd.name)
        if self.pos_embd is not None:
            x = x + self.pos_embd.rows_f32(positions)
            self.counter.add("weights", T * self.pos_embd.row_bytes, None, self.pos_embd.name)
        self.ffn_nnz = 0
        rest = None  # the last branch output not yet added to x (added with the next norm)
        plans = self._block_plans(a) if T == 1 else None
        step = self._compiled_step(plans, a) if plans is not None else None
        if step is not None:  # the blocks and the head as one compiled call
            run, args, largest, float_positions = step
            p0 = int(positions[0])
            kernels.threads_for(largest)
            logits, nnz = run(x, positions.astype(np.float64) if float_positions else positions, p0, *args)
            for i, p in enumerate(plans):
                self._count_block(i, p, p0)
                self._count_activations(i, T)
            for tensor, nbytes in self.output.reads(None):
                self.counter.add("weights", nbytes, None, tensor)
            self.ffn_nnz = int(nnz)
            self.pos += T
            return logits
        # a prompt's logits are its last token's: the last block's queries, output and FFN for
        # that token only (llama.cpp does the same), unless a hook wants every token's FFN
        last_only = (T > 1 and not all_logits and self.mode == "dense"
                     and self.ffn_input_hook is None and self.ffn_act_hook is None and self.input_hook is None)
        for i, L in enumerate(self.layers):
            g = self.blocks[i]  # the layer's graph facts, as the compiled blocks read them
            last = last_only and i == hp.n_layers - 1  # the last query alone (attention_gemm)
            if plans is not None and plans[i] is not None:  # the whole block as one compiled call
                x, rest, nnz = self._compiled_block(i, plans[i], x, rest, positions)
                self._count_activations(i, T)
                self.ffn_nnz += nnz
                continue
            x, h = self._add_norm(x, rest, L["attn_norm.weight"], L.get("attn_norm.bias"), a, g.norm)
            hq = self._site(h, i, "attn_in", g)
            if g.fused_qkv:
                qkv = self._project(L, "attn_qkv", hq, i, a)
                q = qkv[:, : hp.n_heads * hp.head_dim]
                k = qkv[:, hp.n_heads * hp.head_dim : (hp.n_heads + hp.n_kv) * hp.head_dim]
                v = qkv[:, (hp.n_heads + hp.n_kv) * hp.head_dim :]
            else:
                q, k, v = self._mm_shared(L, ("attn_q", "attn_k", "attn_v"), hq, i, a)
            q = q.reshape(T, hp.n_heads, hp.head_dim)
            k = k.reshape(T, hp.n_kv, hp.head_dim)
            v = v.reshape(T, hp.n_kv, hp.head_dim)
            if self.fused_glue and self._ggml(a):
                o = self._attention_ggml(i, L, q, k, v, positions, g, a, last, starts)
            else:
                if g.qk_norm:  # RMSNorm over each head's vector, before RoPE
                    q = self._head_norm(q, L["attn_q_norm.weight"], a)
                    k = self._head_norm(k, L["attn_k_norm.weight"], a)
                if g.rope is not None:  # (learned positions were added to the embeddings)
                    q = self._rope(q, positions, a, g)
                    k = self._rope(k, positions, a, g)
                o = self._attention(i, q, k, v, positions, g, a, last, starts)
            x, h = (x[-1:], h[-1:]) if o.shape[0] < T else (x, h)  # the last query alone: one row on from here
            attn = self._project(L, "attn_output", self._site(o, i, "attn_out", g), i, a)
            if g.post_norms:  # Gemma: each branch's output normed before the residual add
                attn = self._norm(attn, L["post_attention_norm.weight"], None, a, g.norm)
            if g.parallel:  # parallel attention and MLP on the same input x
                if g.ffn_norm:  # the MLP's own norm of x (Falcon-40B's ln_mlp)
                    h = self._norm(x, L[f"{g.ffn_norm}.weight"], L.get(f"{g.ffn_norm}.bias"), a, g.norm)
                ffn, nnz = self._ffn(L, self._site(h, i, "ffn_in", g), i, a)
                x, rest = x + attn, ffn  # (x + attn) + ffn, in that order
            else:
                x, h2 = self._add_norm(x, attn, L[f"{g.ffn_norm}.weight"], L.get(f"{g.ffn_norm}.bias"), a, g.norm)
                ffn, nnz = self._ffn(L, self._site(h2, i, "ffn_in", g), i, a)
                if g.post_norms:
                    ffn = self._norm(ffn, L["post_ffw_norm.weight"], None, a, g.norm)
                rest = ffn
            self.ffn_nnz += nnz
            self._count_activations(i, T)
        self.pos += T
        if rest is not None and self._fuse_norm(self.output_norm_b, a):  # every row normed, the last kept
            x, out = self._add_norm(x, rest, self.output_norm, self.output_norm_b, a)
            out = out if all_logits else out[-1:]
        else:
            x = x if rest is None else x + rest
            x = x if all_logits else x[-1:]
            out = self._norm(x, self.output_norm, self.output_norm_b, a)
        logits = self._mm(self.output, out, None, a.for_head())  # int16: one activation plane here
        if hp.final_softcap:  # Gemma 2: cap·tanh(logits / cap)
            logits = (hp.final_softcap * np.tanh(logits / hp.final_softcap)).astype(np.float32)
        return logits
