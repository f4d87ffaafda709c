"""FFN activation statistics of a GGUF file measured by executing it in this runtime.

The same counts as :func:`aios.measure.ffn.measure_ffn_activity` (the R1 measurement: zeros of
the down projection's input, per layer and per neuron), taken from the file as stored — quantized
blocks read in place, alias canonical + delta and low-rank formats applied by the layer hooks —
instead of through transformers' GGUF loader, which dequantizes every tensor into a float model
(minutes and the full float size for a 7B file) and random-initializes tensors it does not know.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from numba import njit

from aios.measure.ffn import FfnActivity
from runtime.kernels import kept_unpacked
from runtime.kernels.arithmetic import DEFAULT, Arithmetic

PACK_TOKENS = 512  # tokens per packed forward pass: the GEMMs' rate is reached (kernels.gemm)


def pack_texts(lengths: Sequence[int], limit: int = PACK_TOKENS, most: int | None = None,
               arith: Arithmetic = DEFAULT) -> list[list[int]]:
    """The texts (by index, in order) grouped into forward passes of at most ``limit`` tokens
    and ``most`` texts (the callers pass a tenth of the texts, so progress still moves in tenths);
    a text alone where packing cannot run (the GEMM form switched off) or does not pay (a pack
    shorter than GEMM_MIN_TOKENS runs its texts one by one, each through the one-token path), in
    ``arith`` (whose ``use_gemm`` says where the GEMM form runs)."""
    if not arith.use_gemm(limit):
        return [[i] for i in range(len(lengths))]
    packs: list[list[int]] = []
    cur: list[int] = []
    for i, n in enumerate(lengths):
        if cur and (sum(lengths[j] for j in cur) + n > limit or (most is not None and len(cur) >= most)):
            packs.append(cur)
            cur = []
        cur.append(i)
    if cur:
        packs.append(cur)
    out = []
    for p in packs:
        out.extend([p] if len(p) == 1 or arith.use_gemm(sum(lengths[j] for j in p)) else [[j] for j in p])
    return out


def measure_ffn_activity_gguf(path: str | Path, texts: Sequence[str], tokenizer, *, max_tokens: int = 128,
                              eps: float = 1e-3,
                              progress: Callable[[int, int], None] | None = None,
                              settle_at: float | None = None) -> FfnActivity:
    """Run each text (its first ``max_tokens`` tokens, special tokens added as the HF path
    adds them) through the file in dense mode and count the FFN activations' zeros.

    With ``settle_at`` (R1's floor) the texts run in a seeded random order, so that the texts run
    so far are a random sample of the set, and the run stops once the set's mean exact-zero
    fraction is known to lie on one side of it (``FfnActivity.set_estimate``): a 7B file's check
    then measures as many texts as its pass or fail needs, not all of them."""
    from runtime.model import Model

    encoded = [ids for ids in (tokenizer(t, add_special_tokens=True)["input_ids"][:max_tokens] for t in texts)
               if ids]
    order = list(range(len(encoded)))
    if settle_at is not None:
        order = [int(i) for i in np.random.default_rng(0).permutation(len(encoded))]
    packs = [[order[j] for j in p]
             for p in pack_texts([len(encoded[i]) for i in order], most=max(1, -(-len(encoded) // 10)))]
    longest = max([sum(len(encoded[i]) for i in p) for p in packs], default=1)  # tokens of the largest pass
    model = Model(Path(path), mode="dense", n_ctx=longest)
    hp = model.hp
    stats = FfnActivity(hp.n_layers, hp.d_ffn, eps=eps, set_texts=len(encoded),
                        set_tokens=sum(len(ids) for ids in encoded))
    row_zeros = np.zeros(longest, np.int64)
    at = np.zeros(hp.n_layers, np.int64)  # per layer: the pack's next token (one-token passes hook per token)

    def hook(layer: int, a: np.ndarray) -> None:  # a (T, d_ffn)
        rows = row_zeros[at[layer]:at[layer] + len(a)]
        zeros, near = count_zeros(np.ascontiguousarray(a), np.float32(eps), stats.neuron_active[layer], rows)
        at[layer] += len(a)
        stats.zeros[layer] += zeros
        stats.near_zeros[layer] += near

    model.ffn_act_hook = hook
    cuts = model.input_cuts
    if cuts is not None:  # sparsify --scope all: each cut input site's zeros too (the checker's projection)
        def site_hook(layer: int, site: str, x: np.ndarray) -> None:  # x before its cut: what the cut zeroes
            if site in model.blocks[layer].cuts:
                c = stats.site_counts.setdefault(site, [0, 0])
                c[0] += int(np.count_nonzero(np.abs(x) < cuts.values[site][layer]))
                c[1] += x.size

        model.input_hook = site_hook
    done = 0
    with kept_unpacked(matrices=stored_matrices(model)) as kept:  # every pass multiplies the same matrices
        arith = model.arith.keeping(kept)
        for pack in packs:
            row_zeros[:] = 0
            at[:] = 0
            _run_pack(model, encoded, pack, arith)
            start = 0
            for i in pack:  # each text's zeros, for the set estimate
                n = len(encoded[i])
                stats.text_zeros.append(float(row_zeros[start:start + n].sum()) / (hp.n_layers * hp.d_ffn))
                stats.text_tokens.append(n)
                start += n
            stats.tokens += start
            done += len(pack)
            if progress:
                progress(done, len(encoded))
            if settle_at is not None and stats.set_estimate().settles(settle_at):
                break
    return stats


def stored_matrices(model) -> list[tuple[str, int, int]]:
    """(type, rows, values per row) of each distinct stored matrix a forward pass multiplies
    (blocks and output head): what ``kernels.kept_unpacked`` sizes its choice on."""
    ops = [model.output] + [m for L in model.layers for m in L.values() if hasattr(m, "parts")]
    return list({id(p): (p.kind.lower(), p.n_out, p.n_in) for op in ops for p in op.parts()}.values())


def _run_pack(model, encoded, pack, arith: Arithmetic) -> None:
    ids = [t for i in pack for t in encoded[i]]
    model.reset()
    if len(pack) == 1:
        model.forward(ids, arith=arith)
    else:  # the texts back to back, each attending to itself only (runtime.attention_gemm)
        model.forward(ids, arith=arith, starts=np.cumsum([0] + [len(encoded[i]) for i in pack[:-1]]))


@njit(cache=True)
def count_zeros(a, eps, active, rows):
    """(#a == 0, #|a| < eps) over a (T, d) float32, active[j] += #(a[:, j] != 0) and
    rows[t] += #(a[t] == 0): R1's counts in one pass (numpy's three passes took 2.2 s of a 37 s
    check of the real Gemma 3 270M)."""
    zeros = 0
    near = 0
    for t in range(a.shape[0]):
        row = 0
        for j in range(a.shape[1]):
            v = a[t, j]
            z = v == 0
            row += z
            near += abs(v) < eps
            active[j] += not z
        rows[t] += row
        zeros += row
    return zeros, near


def gguf_row_reader(path: str | Path) -> Callable[[str, int, int], np.ndarray]:
    """``read(name, start, stop)``: rows of a 2-D tensor of the GGUF at ``path`` as float32, block
    types decoded by the runtime's kernels (``runtime.kernels.decode_block_rows``, ~20x gguf-py's
    numpy dequantizer; equal to it), other types by the store. For checks that stream every
    layer's weights (R3 on a 7B file decodes ~6.6 G values)."""
    from aios.models.tensors import GGUFStore
    from runtime import kernels as K
    from runtime.weights import BLOCK_TYPES, from_gguf_tensor

    store = GGUFStore(Path(path))
    tensors = {t.name: t for t in store.reader.tensors}

    def read(name: str, start: int, stop: int) -> np.ndarray:
        t = tensors[name]
        if t.tensor_type.name not in BLOCK_TYPES or len(t.shape) != 2:
            return store.get_rows(name, start, stop)
        m = from_gguf_tensor(t)
        rows = m.data[start:stop]
        return K.decode_block_rows(m.kind.lower(), rows, np.empty((len(rows), m.n_in), np.float32))

    return read

