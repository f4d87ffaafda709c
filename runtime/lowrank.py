"""Low-rank + residual weights (``aios-convert svd-residual``) in the runtime: y = U(Vx) + Q(E)x.

A layer hook (registered in ``runtime.model.LAYER_HOOKS``) finds ``blk.N.X.lr_u`` /
``blk.N.X.lr_v`` / optional ``blk.N.X.residual`` and puts a :class:`LowRankLinear` under
``"X.weight"``, so the forward pass and the byte counter see one operator:

* V (r × n_in) is read whole for every call (all of Vx is needed);
* U (n_out × r) and the residual are read only for the output rows computed;
* a residual stored *flat* (1-D, row-major, K-quant super-blocks spanning rows) is read
  block by block: the blocks covering the rows computed, each once, decoded from the stored
  bytes by gguf-py's dequantizer (no numba kernel multiplies K-quant blocks that span rows).

``reads()`` lists exactly those bytes, so measured MB/token is what the operator touches.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from aios.errors import InvalidModelError, UsageError
from runtime.weights import Matrix, from_gguf_tensor

SUFFIXES = (".lr_u", ".lr_v", ".residual")


@dataclass
class FlatResidual:
    """Residual E (n_out × n_in) stored as 1-D row-major blocks of a GGML block type."""

    name: str
    kind: str  # GGML type name, e.g. Q2_K
    n_out: int
    n_in: int
    raw: np.ndarray  # uint8 (n_blocks, type_size), a view of the file
    block: int  # values per block

    @property
    def nbytes(self) -> int:
        return int(self.raw.nbytes)

    def _blocks(self, rows: np.ndarray | None) -> np.ndarray:
        """Indices of the blocks holding ``rows`` (all blocks for None), ascending, unique."""
        if rows is None:
            return np.arange(self.raw.shape[0])
        r = np.asarray(rows, dtype=np.int64)
        first, last = r * self.n_in // self.block, ((r + 1) * self.n_in - 1) // self.block
        return np.unique(np.concatenate([np.arange(a, b + 1) for a, b in zip(first, last)] or [np.zeros(0, np.int64)]))

    def reads(self, rows: np.ndarray | None = None) -> list[tuple[str, int]]:
        return [(self.name, len(self._blocks(rows)) * self.raw.shape[1])]

    def parts(self) -> list["FlatResidual"]:
        return [self]

    def _values(self, blocks: np.ndarray) -> np.ndarray:
        """Flat float32 values with the given blocks decoded (others zero)."""
        import gguf

        flat = np.zeros(self.raw.shape[0] * self.block, np.float32)
        qtype = gguf.GGMLQuantizationType[self.kind]
        vals = gguf.dequantize(np.ascontiguousarray(self.raw[blocks]).reshape(-1), qtype).reshape(-1, self.block)
        flat.reshape(-1, self.block)[blocks] = vals
        return flat[: self.n_out * self.n_in].reshape(self.n_out, self.n_in)

    def matmul(self, X: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
        E = self._values(self._blocks(rows))
        Y = np.zeros((X.shape[0], self.n_out), np.float32)
        r = np.arange(self.n_out) if rows is None else np.asarray(rows, dtype=np.int64)
        Y[:, r] = X.astype(np.float32) @ E[r].T
        return Y

    def dense(self) -> np.ndarray:
        return self._values(self._blocks(None))


@dataclass
class LowRankLinear:
    """y = U (V x) + R x, implementing ``runtime.weights.Linear``."""

    name: str  # blk.N.X.weight, the tensor it stands for
    U: Matrix  # (n_out, r)
    V: Matrix  # (r, n_in)
    R: Matrix | FlatResidual | None

    @property
    def n_out(self) -> int:
        return self.U.n_out

    @property
    def n_in(self) -> int:
        return self.V.n_in

    @property
    def rank(self) -> int:
        return self.V.n_out

    def matmul(self, X: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
        Z = self.V.matmul(X)  # (T, r): every rank component is needed
        Y = self.U.matmul(Z, rows)  # (T, n_out), only ``rows`` computed
        if self.R is not None:
            Y += self.R.matmul(X, rows)
        return Y

    def reads(self, rows: np.ndarray | None = None) -> list[tuple[str, int]]:
        out = self.V.reads(None) + self.U.reads(rows)
        return out + (self.R.reads(rows) if self.R is not None else [])

    def parts(self) -> list:
        return [self.U, self.V] + ([self.R] if self.R is not None else [])

    def dense(self) -> np.ndarray:
        W = self.U.dense().astype(np.float64) @ self.V.dense().astype(np.float64)
        if self.R is not None:
            W += self.R.dense()
        return W.astype(np.float32)


def _matrix(t, n_out: int, n_in: int) -> Matrix:
    """A Matrix for a factor even when one side is 1 (the generic loader treats that as 1-D)."""
    m = from_gguf_tensor(t)
    if (m.n_out, m.n_in) != (n_out, n_in):
        raise InvalidModelError(f"Tensor '{t.name}' has shape {m.n_out}×{m.n_in}, expected {n_out}×{n_in}.")
    return m


def _residual(t, n_out: int, n_in: int) -> Matrix | FlatResidual:
    import gguf

    if len(t.shape) >= 2:
        return _matrix(t, n_out, n_in)
    kind = t.tensor_type.name
    block, size = gguf.GGML_QUANT_SIZES[t.tensor_type]
    n = int(t.shape[0])
    if n != n_out * n_in or n % block:
        raise InvalidModelError(f"Flat residual '{t.name}' holds {n} values, expected {n_out}×{n_in}.")
    raw = np.asarray(t.data).view(np.uint8).reshape(n // block, size)
    return FlatResidual(t.name, kind, n_out, n_in, raw, block)


def lowrank_hook(model, tensors: dict, i: int, L: dict) -> None:
    """LAYER_HOOKS entry: replace ``X.weight`` by LowRankLinear wherever ``X.lr_u`` exists."""
    prefix = f"blk.{i}."
    bases = sorted(k[len(prefix):-len(".lr_u")] for k in tensors if k.startswith(prefix) and k.endswith(".lr_u"))
    for base in bases:
        full = prefix + base
        if full + ".lr_v" not in tensors:
            raise InvalidModelError(f"{model.path.name}: '{full}.lr_u' has no matching '{full}.lr_v'.")
        if full + ".weight" in tensors:
            raise InvalidModelError(f"{model.path.name} has both '{full}.weight' and its low-rank factors.")
        tu, tv = tensors[full + ".lr_u"], tensors[full + ".lr_v"]
        r = int(tu.shape[0])
        n_out, n_in = int(tu.shape[1]) if len(tu.shape) > 1 else 1, int(tv.shape[0])
        U, V = _matrix(tu, n_out, r), _matrix(tv, r, n_in)
        R = _residual(tensors[full + ".residual"], n_out, n_in) if full + ".residual" in tensors else None
        for s in SUFFIXES:
            L.pop(base + s, None)
        L[base + ".weight"] = LowRankLinear(full + ".weight", U, V, R)
        if base == "ffn_down" and model.mode != "dense":
            raise UsageError(
                f"--mode {model.mode} reads single rows of a plain ffn_down, but {model.path.name} stores it "
                "as low-rank factors; run --mode dense (or convert with ffn_down kept plain)."
            )


# --- measurement: held-out perplexity and MB/token of a GGUF, by running it ----------------


EVAL_SETS = ("pydoc", "heldout")


def _texts(name: str) -> list[str]:
    if name == "pydoc":  # the fixtures' held-out split (in-domain for the bundled models)
        from aios.fixtures.train import split_texts

        return split_texts("heldout")
    from aios.data import load_heldout

    return load_heldout()


def _perplexity(model, tok, texts: list[str], eval_tokens: int, window: int) -> tuple[float, int]:
    ids: list[int] = []
    for text in texts:
        if tok.eos_token_id is not None:
            ids.append(tok.eos_token_id)
        ids += tok(text, add_special_tokens=False, verbose=False)["input_ids"]
        if len(ids) >= eval_tokens:
            break
    from runtime.perplexity import perplexity

    res = perplexity(model, ids[:eval_tokens], window=window)
    return res["perplexity"], res["tokens_scored"]


def evaluate_gguf(path: str | Path, eval_tokens: int = 1024, window: int = 128, decode_tokens: int = 8,
                  sets: tuple[str, ...] = EVAL_SETS) -> dict:
    """Run ``path`` in the runtime: perplexity and decode MB/token (all measured).

    Perplexity follows the fixtures' protocol: one EOS-separated token stream of the texts,
    non-overlapping windows of ``window`` tokens, exp(mean NLL of tokens 1..n-1 of each
    window), over the first ``eval_tokens`` tokens. Text sets: ``heldout`` = the bundled
    held-out passages (``aios.data.load_heldout``: prose in many languages, far from what the
    tiny fixtures saw), ``pydoc`` = the fixtures' own held-out split of Python's documentation
    (in-domain; the fixture cards' perplexity). MB/token: bytes the byte counter adds per
    decoded token after a 32-token prefill, by term and, for weights, per tensor.
    """
    from runtime.generate import load_tokenizer
    from runtime.model import Model

    path = Path(path)
    tok = load_tokenizer(path)
    model = Model(path, n_ctx=max(window, 32 + decode_tokens + 1))
    out: dict = {"eval_tokens": eval_tokens, "window": window}
    for name in sets:
        ppl, n = _perplexity(model, tok, _texts(name), eval_tokens, window)
        out[f"{name}_perplexity"], out[f"{name}_tokens_scored"] = ppl, n
    model.reset()
    prompt = tok(_texts("heldout")[0], add_special_tokens=False, verbose=False)["input_ids"][:32]
    logits = model.forward(prompt)
    model.counter.reset()
    for _ in range(decode_tokens):
        logits = model.forward([int(np.argmax(logits[-1]))])
    per_tok = {k: v / decode_tokens for k, v in model.counter.snapshot().items()}
    per_tensor = {k: v / decode_tokens for k, v in model.counter.per_tensor.items()}
    out.update({
        "mb_per_token": {k: v / 1e6 for k, v in per_tok.items()},
        "mb_per_token_total": sum(per_tok.values()) / 1e6,
        "weights_mb_per_token": per_tok["weights"] / 1e6,
        "block_weights_mb_per_token": sum(v for k, v in per_tensor.items() if k.startswith("blk.")) / 1e6,
        "weights_bytes_per_tensor": per_tensor,
        "weight_bytes_loaded": model.weight_bytes,
    })
    return out
