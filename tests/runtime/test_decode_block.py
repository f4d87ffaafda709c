"""runtime.decode_block: a decode step's block as one compiled call, the same logits to the bit
and the same bytes counted as ``Model.forward``'s step by step path."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from aios import quant
from runtime import decode_block
from runtime.kernels import Arithmetic
from runtime.model import Model
from tests.runtime.quant_blocks import random_blocks
from tests.runtime.test_model import _tiny_with_tokenizer

# one type per matrix, every int8 kernel family: Q8_0 partners, Q8_1 partners (affine), K-quants
MIXES = {
    0: {"attn_q": "Q4_1", "attn_k": "Q5_1", "attn_v": "Q6_K", "attn_output": "IQ4_NL",
        "ffn_gate": "Q4_K", "ffn_up": "Q5_0", "ffn_down": "Q2_K"},
    1: {"attn_q": "Q3_K", "attn_k": "Q8_0", "attn_v": "Q5_K", "attn_output": "IQ4_XS",
        "ffn_gate": "Q4_0", "ffn_up": "Q4_K", "ffn_down": "Q6_K"},
}
# Falcon's four matrices per block (fused q/k/v, plain MLP)
FALCON_MIXES = {0: {"attn_qkv": "Q5_1", "attn_output": "Q6_K", "ffn_up": "Q4_1", "ffn_down": "IQ4_XS"},
                1: {"attn_qkv": "Q4_K", "attn_output": "Q8_0", "ffn_up": "Q5_0", "ffn_down": "Q3_K"}}


def _retyped(src, dst, mixes=MIXES, head=None):
    """``src`` (an f32 GGUF) rewritten with each layer's matrices in ``mixes[layer]``'s types
    and the output matrix (the embedding when tied) in ``head``'s (gguf-py's encoder where it has one, else valid random
    blocks); everything else as stored."""
    r = gguf.GGUFReader(str(src))
    arch = r.get_field("general.architecture").contents()
    w = gguf.GGUFWriter(str(dst), arch)
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        if f.types[0] == gguf.GGUFValueType.ARRAY:
            w.add_key_value(key, f.contents(), gguf.GGUFValueType.ARRAY, gguf.GGUFValueType(f.types[1]))
        else:
            w.add_key_value(key, f.contents(), gguf.GGUFValueType(f.types[0]))
    rng = np.random.default_rng(1)
    names = {t.name for t in r.tensors}
    head_name = "output.weight" if "output.weight" in names else "token_embd.weight"  # tied: the embedding
    for t in r.tensors:
        parts = t.name.split(".")
        kind = mixes.get(int(parts[1]), {}).get(parts[2]) if parts[0] == "blk" and parts[-1] == "weight" else None
        kind = head if t.name == head_name else kind
        data = np.asarray(t.data)
        if kind is None:
            w.add_tensor(t.name, data, raw_shape=data.shape, raw_dtype=t.tensor_type)
            continue
        n, k = int(t.shape[1]), int(t.shape[0])
        try:
            q = gguf.quants.quantize(data.reshape(n, k).astype(np.float32), quant.qtype(kind))
        except NotImplementedError:
            q = random_blocks(kind.lower(), n, k // quant.block_size(kind), rng)
        w.add_tensor(t.name, q, raw_shape=q.shape, raw_dtype=quant.qtype(kind))
    for fn in (w.write_header_to_file, w.write_kv_data_to_file, w.write_tensors_to_file, w.close):
        fn()
    return dst


def _export(tmp_path, kind, outtype="f32", **overrides):
    from convert.gguf import GGUFExportConfig, export_gguf
    from tests.conftest import LLAMA3_ROPE

    extra = dict(LLAMA3_ROPE) if kind == "llama3" else {}
    extra.update(overrides)
    src = _tiny_with_tokenizer("llama" if kind == "llama3" else kind, tmp_path / kind, **extra)
    path = tmp_path / f"{kind}.{outtype}.gguf"
    export_gguf(str(src), path, GGUFExportConfig(outtype))
    return path


def _dims(kind: str) -> dict:
    """The six shapes' tiny dimensions (Falcon-40B's grouped KV heads as "falcon-new-decoder")."""
    if kind.startswith("falcon"):
        return dict(hidden_size=256, ffn_hidden_size=512, num_attention_heads=4,
                    **({"num_kv_heads": 2} if kind == "falcon-new-decoder" else {}))
    return dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2,
                **({"head_dim": 64} if kind == "qwen3" else {}))


def _decode_both(m: Model, ids: list[int]) -> dict:
    out = {}
    for fused in (True, False):
        m.fused_glue = fused
        m.reset()
        m.counter.reset()
        logits = np.concatenate([m.forward(ids[:3])] + [m.forward([t]) for t in ids[3:]])
        c = m.counter
        out[fused] = (logits, dict(c.totals), {k: dict(v) for k, v in c.per_layer.items()}, dict(c.per_tensor),
                      m.ffn_nnz)
    return out


@pytest.mark.parametrize("head", [None, "Q6_K", "Q8_0"])
@pytest.mark.parametrize("kind", ["llama3", "qwen2", "qwen3", "mistral", "falcon", "falcon-new-decoder"])
def test_compiled_blocks_decode_to_the_bit_on_every_int8_kernel(tmp_path, kind, head):
    """Llama 3.1 RoPE factors, Qwen2's q/k/v biases, Qwen3's per-head norms, Mistral's window,
    Falcon-7B's parallel block with one KV head, Falcon-40B's grouped KV heads and the MLP's own
    norm; every matrix a different int8 kernel (32-value, affine 32-value and K-quant types):
    decode logits, the byte counter and the FFN nonzero count equal the step by step path's.
    With an int8 output matrix the whole step is one call (``decode_block.step``), with an F32
    one the blocks are one call each."""
    dims = _dims(kind)
    f32 = _export(tmp_path, kind, **dims)
    m = Model(_retyped(f32, tmp_path / f"{kind}.mixed.gguf", FALCON_MIXES if kind.startswith("falcon") else MIXES,
                       head), arithmetic="int8")
    ids = list(range(3, 60, 5))
    runs = _decode_both(m, ids)
    assert m._plans is not None and all(p is not None for p in m._plans)
    assert (m._step[1] is not None) == (head is not None)
    assert {int(c) for p in m._plans for c in p.codes} >= {decode_block.kernel_code(t) for t in
                                                            ("Q4_1", "Q5_1", "Q6_K", "Q8_0", "Q4_K")}
    new, old = runs[True], runs[False]
    assert np.array_equal(new[0].view(np.uint32), old[0].view(np.uint32))
    assert new[1:] == old[1:]


def test_blocks_outside_the_compiled_shape_run_step_by_step(tmp_path):
    """Gemma 3 (norms after each branch, GELU), Phi-3 (fused QKV and gate/up) and GPT-2 (learned
    positions, biased norms) keep the Python block; so does any model while an FFN hook watches
    (the checker's R1 counts, predictor fitting), with fused_glue off or in float arithmetic."""
    for kind in ("gemma3", "phi3", "gpt2"):
        m = Model(_export(tmp_path, kind, "q8_0"), arithmetic="int8")
        m.forward([1, 2, 3])
        m.forward([4])
        assert m._plans is not None and not any(m._plans), kind
    m = Model(_export(tmp_path, "llama3", "q8_0"), arithmetic="int8")
    assert m._block_plans(m.arith) is not None and all(m._block_plans(m.arith))
    m.ffn_input_hook = lambda layer, h: None
    assert m._block_plans(m.arith) is None
    m.ffn_input_hook = None
    m.fused_glue = False
    assert m._block_plans(m.arith) is None
    m.fused_glue = True
    flt = Arithmetic("float")  # the float path's blocks take F16/BF16 matrices only
    assert m._block_plans(flt) is not None and not any(m._block_plans(flt))


@pytest.mark.parametrize("kind", ["llama3", "qwen2", "qwen3", "mistral", "falcon", "falcon-new-decoder"])
@pytest.mark.parametrize("outtype,arith", [("f16", "int8"), ("f16", "float"), ("bf16", "float")])
def test_compiled_float_blocks_decode_to_the_bit(tmp_path, kind, outtype, arith):
    """The float path's blocks and head as one call (F16 with x in fp16 under the default
    arithmetic, F16 and BF16 with float32 x under "float"): decode logits, the byte counter and the FFN nonzero count
    equal the step by step path's, on the same six shapes as the int8 blocks."""
    dims = _dims(kind)
    m = Model(_export(tmp_path, kind, outtype, **dims), arithmetic=arith)
    runs = _decode_both(m, list(range(3, 60, 5)))
    assert m._plans is not None and all(p is not None and p.act is not None for p in m._plans)
    half = {decode_block.F16_HALF_X} if (outtype, arith) == ("f16", "int8") else (
        {decode_block.F16_FLOAT_X} if outtype == "f16" else {decode_block.BF16_FLOAT_X})
    assert {int(c) for p in m._plans for c in p.codes} == half
    assert m._step[1] is not None  # the blocks and the F16/BF16 head ran as one call
    new, old = runs[True], runs[False]
    assert np.array_equal(new[0].view(np.uint32), old[0].view(np.uint32))
    assert new[1:] == old[1:]
