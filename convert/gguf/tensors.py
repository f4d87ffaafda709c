"""Step 2 of the GGUF spine: tensor data — llama.cpp's weight layouts, output types, chunked
encoding, and reading a planned tensor's rows from the source model.

Apart from :func:`source_rows`, pure functions on tensors; no model walking or file handling.

- Layouts: Falcon's fused QKV is regrouped to [all q; all k; all v] (llama.cpp's
  "jploski" layout), Llama's q/k rows are permuted from HF's rotate-half order to the
  interleaved order llama.cpp's RoPE expects, GPT-2's Conv1D weights are transposed.
- Types: 1-D tensors (norms, biases) stay F32 as llama.cpp requires; 2-D weights take the
  requested type, falling back per tensor when the row length is not a multiple of the
  block size (Q8_0/Q4_0 blocks hold 32 values, K-quant super-blocks 256), never silently.
  K-quant fallbacks keep the size class where they can: Q4_K and Q2_K -> Q4_0 (4.5 bits
  per weight; llama.cpp picks Q5_0 / IQ4_NL, which our runtime does not run), Q6_K -> Q8_0
  (llama.cpp's choice too); a row that fits no block at all -> F16. ``--like FILE`` writes
  each tensor in the type FILE has for the same name (``like_types``; Q5_0 through gguf-py).
- Encoding: rows are converted and quantized in chunks of ``CHUNK_BYTES`` of float32, so
  a conversion never holds more than the source tensor plus one chunk.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import IO, Callable

import numpy as np

CHUNK_BYTES = 16 << 20  # float32 bytes converted per step

OUTTYPES = ("f32", "f16", "bf16", "q8_0", "q5_0", "q4_0", "q4_k", "q6_k", "q2_k")
KQUANTS = ("q4_k", "q6_k", "q2_k")  # encoded by convert.kquants
# what a requested type falls back to when a tensor's shape does not fit its blocks
FALLBACK = {"q8_0": "f16", "q5_0": "f16", "q4_0": "f16", "bf16": "f16", "q4_k": "q4_0", "q6_k": "q8_0",
            "q2_k": "q4_0"}
# ``--like``: a source GGUF type this exporter cannot encode → the one it writes instead (at least
# as many bits per weight; the plan reports each such tensor)
LIKE_SUBSTITUTE = {"Q4_1": "q5_0", "Q5_1": "q8_0", "Q3_K": "q4_k", "Q5_K": "q6_k", "IQ4_NL": "q4_k",
                   "IQ4_XS": "q4_k", "IQ3_S": "q4_k", "IQ3_XXS": "q4_k", "IQ2_XXS": "q2_k",
                   "IQ2_XS": "q2_k", "IQ2_S": "q2_k", "IQ1_S": "q2_k", "IQ1_M": "q2_k"}


def ggml_type(outtype: str):
    from aios import quant

    return quant.qtype(outtype)


def llama_file_type(outtype: str):
    import gguf

    return {
        "f32": gguf.LlamaFileType.ALL_F32,
        "f16": gguf.LlamaFileType.MOSTLY_F16,
        "bf16": gguf.LlamaFileType.MOSTLY_BF16,
        "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
        "q4_0": gguf.LlamaFileType.MOSTLY_Q4_0,
        "q5_0": gguf.LlamaFileType.MOSTLY_Q5_0,
        "q4_k": gguf.LlamaFileType.MOSTLY_Q4_K_S,  # uniform Q4_K: closest to llama.cpp's "S" mix
        "q6_k": gguf.LlamaFileType.MOSTLY_Q6_K,
        "q2_k": gguf.LlamaFileType.MOSTLY_Q2_K,
    }[outtype]


def choose_type(shape: tuple[int, ...], outtype: str) -> tuple[str, str | None]:
    """(type to write, reason it differs from ``outtype`` or None) for a tensor of ``shape``."""
    from aios import quant

    if len(shape) < 2:
        return "f32", None  # norms and biases: llama.cpp computes them in F32
    block = quant.block_size(outtype)
    if shape[-1] % block == 0:
        return outtype, None
    name = quant.qtype(outtype).name
    why = f"row length {shape[-1]} is not a multiple of the {name} block ({block})"
    fb = FALLBACK.get(outtype, "f32")
    while shape[-1] % quant.block_size(fb):  # the fallback's own blocks must fit
        fb = FALLBACK.get(fb, "f32")
    return fb, why


def like_types(path: str | Path) -> tuple[dict[str, tuple[str, str | None]], int | None]:
    """``--like FILE``: {GGUF tensor name: (type to write, why it differs from FILE's or None)}
    and FILE's ``general.file_type``, from FILE's header (no tensor data is read)."""
    from aios.errors import ModelNotFoundError
    from aios.models.tensors import GGUFStore

    p = Path(path).expanduser()
    if not p.is_file():
        raise ModelNotFoundError(f"--like: {p} does not exist.")
    store = GGUFStore(p)
    types = {}
    for t in store.reader.tensors:
        name = t.tensor_type.name
        if name.lower() in OUTTYPES:
            types[t.name] = (name.lower(), None)
        elif name in LIKE_SUBSTITUTE:
            sub = LIKE_SUBSTITUTE[name]
            types[t.name] = (sub, f"{p.name} has {name}, which this exporter does not encode")
        else:
            types[t.name] = ("f16", f"{p.name} has {name}, which this exporter does not encode")
    ft = store.field("general.file_type")
    return types, (ft if isinstance(ft, int) else None)


def encoded_nbytes(shape: tuple[int, ...], outtype: str) -> int:
    from aios import quant

    n = int(np.prod(shape, dtype=np.int64))
    assert n % quant.block_size(outtype) == 0, (shape, outtype)
    return quant.row_bytes(outtype, n)


# --- llama.cpp layouts (torch tensors; shapes in numpy/row-major order) ---------------------


def falcon_qkv(w, n_head: int, n_kv: int, head_dim: int):
    """HF Falcon fused QKV -> llama.cpp's [q (n_head*hd); k (n_kv*hd); v (n_kv*hd)].

    HF stores ``n_kv`` groups, each ``n_head/n_kv`` query heads then one key and one value
    head; for the 7B multi-query model (n_kv = 1) this is already the llama.cpp order.
    Works for weights (rows, d) and biases (rows,).
    """
    tail = tuple(w.shape[1:])
    g = w.reshape(n_kv, n_head // n_kv + 2, head_dim, *tail)
    q = g[:, :-2].reshape(n_head * head_dim, *tail)
    k = g[:, -2].reshape(n_kv * head_dim, *tail)
    v = g[:, -1].reshape(n_kv * head_dim, *tail)
    import torch

    return torch.cat((q, k, v))


def rope_interleave(w, n_heads: int):
    """HF rotate-half rows -> interleaved pairs, per head (llama.cpp's Llama RoPE order).

    (n_heads*hd, ...) viewed as (n_heads, 2, hd/2, ...), halves swapped to (n_heads, hd/2, 2).
    """
    tail = tuple(w.shape[1:])
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *tail).swapaxes(1, 2).reshape(w.shape)


def apply_layout(t, rule: str | None, facts):
    """``t`` (torch, rows first) with the llama.cpp layout ``rule`` of an architecture row
    (``Architecture.layout_rules``) applied; ``facts`` gives head counts and size."""
    if rule == "falcon_qkv":
        return falcon_qkv(t, facts.n_heads, facts.n_kv_heads, facts.head_dim)
    if rule == "rope_q":
        return rope_interleave(t, facts.n_heads)
    if rule == "rope_k":
        return rope_interleave(t, facts.n_kv_heads)
    if rule == "transpose":
        return t.T
    if rule == "plus_one":  # Gemma's RMSNorm computes x·(1 + w); llama.cpp's multiplies by the weight
        return t.float() + 1
    return t


def source_rows(handle, p) -> Callable[[int, int], np.ndarray]:
    """A function (start, stop) -> float32 rows of planned tensor ``p`` as laid out in the
    GGUF; reads the source tensor once (a planned ``data`` callable is not consulted here)."""
    t = apply_layout(handle.tensor(p.source), p.rule, handle.facts)
    assert tuple(t.shape) == p.shape, (p.name, tuple(t.shape), p.shape)
    if t.ndim == 1:
        return lambda a, b: t.float().numpy()
    return lambda a, b: t[a:b].float().contiguous().numpy()


def tensor_data(handle, p) -> Callable[[], object]:
    """What the writer calls for planned tensor ``p``: its own ``data``, or the source rows
    encoded chunk by chunk to ``p.outtype``."""
    if p.data is not None:
        return p.data
    return lambda: EncodedTensor(source_rows(handle, p), p.shape, p.outtype, p.nbytes)


# --- chunked encoding ----------------------------------------------------------------------


@dataclass
class EncodedTensor:
    """A tensor encoded chunk by chunk as it is written (duck-types ``nbytes``/``tofile``).

    ``GGUFWriter.write_tensor_data`` only needs these two members, so the encoded bytes of
    a tensor never exist in memory all at once.
    """

    rows: Callable[[int, int], np.ndarray]  # (start, stop) -> float32 rows (2-D) or all (1-D)
    shape: tuple[int, ...]
    outtype: str
    nbytes: int

    def chunks(self):
        n_rows = self.shape[0] if len(self.shape) > 1 else 1
        row_bytes = 4 * int(np.prod(self.shape[1:], dtype=np.int64)) if len(self.shape) > 1 else 1
        step = max(1, CHUNK_BYTES // max(1, row_bytes))
        for r0 in range(0, n_rows, step):
            yield encode(self.rows(r0, min(n_rows, r0 + step)), self.outtype)

    def tofile(self, fout: IO[bytes]) -> None:
        written = 0
        for chunk in self.chunks():
            chunk.tofile(fout)
            written += chunk.nbytes
        assert written == self.nbytes, (written, self.nbytes)


def encode(x: np.ndarray, outtype: str) -> np.ndarray:
    """Float array (taken as contiguous float32) -> the bytes (or native array) of ``outtype``,
    via gguf-py's quantizers; K-quants by ``convert.kquants``. Every writer's one encoder: the
    export's chunks, sparsify's neuron-major re-encoding, svd-residual's factors and residuals."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if outtype == "f32":
        return x
    if outtype == "f16":
        return x.astype(np.float16)
    if outtype in KQUANTS:  # gguf-py cannot encode K-quants; ours write the same block layout
        from convert import kquants

        return kquants.quantize(x.reshape(-1, x.shape[-1]), outtype)
    from gguf import quants

    return quants.quantize(x, ggml_type(outtype))


def sqnr_db(x: np.ndarray, y: np.ndarray) -> float:
    """Signal-to-quantization-noise ratio 20·log10(‖x‖/‖x−y‖) in dB (inf when equal)."""
    noise = float(np.linalg.norm(x - y))
    return float("inf") if noise == 0 else float(20 * np.log10(float(np.linalg.norm(x)) / noise))
