"""One layer's graph, defined once, and the compiled decode forms that may run it.

A transformer block's math depends on a handful of facts: the norm kind and its biases, whether
attention and the FFN read the same input, fused or separate q/k/v, per-head q/k norms, the RoPE
pairing, the attention window and soft cap, norms after each branch, a gated FFN and its
activation. They come from three places (the architecture row, the file's hyperparameters, the
layer's tensors); ``block_graph`` gathers them into one ``BlockGraph`` per layer when the model
loads, and every route reads its facts from that value and nowhere else:

- ``Model.forward``'s step by step route (runtime/model.py), which runs every layer and is what
  the bit-exactness tests against llama.cpp and transformers check;
- the compiled decode blocks (runtime/decode_block.py: ``block``, ``parallel_block`` and their
  float forms, and the whole-step calls built on them), which are faster for one token and
  implement fewer shapes. ``FORMS`` lists, for each compiled form, the value of every fact it
  implements; ``compiled_form`` picks a form only when the layer's every fact is among them, so a
  layer the compiled code does not implement runs the step by step route instead of a wrong one.

Every form must name every fact (checked when this module loads): a new graph fact is a new
``BlockGraph`` field, and the module does not import until each compiled form says whether it
implements it. ``tests/runtime/test_block_graph.py`` then changes each fact on a tiny model and
checks that every route follows it: the compiled routes either decline the layer or give the step
by step route's logits to the bit. ``ROW_FACTS`` says where each graph field of the architecture
row lands (the test holds it to the row's fields).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from runtime.activations import GGML_GELU, GGML_SILU


@dataclass(frozen=True)
class BlockGraph:
    """The facts that decide what one layer computes (see the module docstring)."""

    norm: str  # "rms" or "layer" (LayerNorm)
    norm_bias: bool  # the block's input norms carry biases (attn_norm.bias / ffn_norm.bias)
    parallel: bool  # attention and FFN both read the attention norm's input (Falcon, GPT-J)
    ffn_norm: str | None  # the FFN input norm's tensor (relative to blk.N.); None: the attention norm's output
    fused_qkv: bool  # one attn_qkv matrix [q; k; v]
    qk_norm: bool  # RMS norm of each q and k head before RoPE
    rope: str | None  # "normal" (interleaved pairs), "neox" (halves); None: no rotation
    q_prescale: bool  # q multiplied by the scale before q·k, softmax scale 1 (llama.cpp's order)
    window: int  # this layer's attention window in positions (0: the whole context)
    local_rope: bool  # this layer rotates with the local (sliding-window) RoPE base and factors
    attn_softcap: float  # cap·tanh(scores / cap) (0: none)
    post_norms: bool  # each branch's output normed before the residual add (Gemma 2/3)
    gated_ffn: bool  # act(gate) · up, a separate ffn_gate matrix
    fused_gate_up: bool  # gate and up stored as one matrix (Phi-3)
    # calibrated activation cuts in this layer (runtime/thresholds.py): the input sites
    # ("attn_in", "attn_out", "ffn_in") and the FFN's ("gate" or "down_in")
    cuts: tuple[str, ...] = ()


def block_graph(hp, L: dict, layer: int, cuts: tuple[str, ...] = ()) -> BlockGraph:
    """Layer ``layer``'s facts from the hyperparameters ``hp`` (its architecture row ``hp.graph``),
    the layer's tensors ``L`` and the sites its calibrated thresholds cut (``cuts``)."""
    g = hp.graph
    local = bool(hp.swa_layers[layer]) if hp.swa_layers else False
    return BlockGraph(
        norm=g.norm, norm_bias="attn_norm.bias" in L or "ffn_norm.bias" in L,
        parallel=g.parallel_attn_default,
        ffn_norm=g.parallel_ffn_norm if g.parallel_attn_default else "ffn_norm",
        fused_qkv=g.fused_qkv, qk_norm=g.qk_norm, rope=g.rope, q_prescale=g.q_prescale,
        window=hp.window if local else 0, local_rope=local, attn_softcap=float(hp.attn_softcap or 0.0),
        post_norms=g.post_norms, gated_ffn="ffn_gate.weight" in L, fused_gate_up=g.fused_gate_up, cuts=tuple(cuts))


ANY = None  # a fact whose every value the form implements
# the facts both sequential forms (``block``, ``float_block``) and both parallel forms
# (``parallel_block``, ``float_parallel_block``) implement: a set of values, or ANY
_SEQUENTIAL = dict(norm={"rms"}, norm_bias={False}, parallel={False}, ffn_norm={"ffn_norm"}, fused_qkv={False},
                   qk_norm=ANY, rope=ANY, q_prescale=ANY, window=ANY, local_rope=ANY, attn_softcap=ANY,
                   post_norms={False}, gated_ffn={True}, fused_gate_up={False}, cuts={()})
_PARALLEL = dict(norm={"layer"}, norm_bias=ANY, parallel={True}, ffn_norm=ANY, fused_qkv={True},
                 qk_norm={False}, rope=ANY, q_prescale=ANY, window=ANY, local_rope=ANY, attn_softcap=ANY,
                 post_norms={False}, gated_ffn={False}, fused_gate_up={False}, cuts={()})
# (path, form) -> facts: the ggml path's int8 blocks compute ggml's SiLU / tanh GELU (an fp16
# table); the float path's the checkpoint's SiLU or erf GELU ("gelu")
FORMS = {
    ("ggml", "block"): {**_SEQUENTIAL, "activation": {GGML_SILU}},
    ("ggml", "parallel_block"): {**_PARALLEL, "activation": {GGML_GELU}},
    ("float", "float_block"): {**_SEQUENTIAL, "activation": {"silu"}},
    ("float", "float_parallel_block"): {**_PARALLEL, "activation": {"gelu"}},
}
_FACTS = {f.name for f in fields(BlockGraph)} | {"activation"}


def check_forms(forms: dict) -> None:
    """Raise unless every form names every fact (a new fact needs every form's answer)."""
    for form, facts in forms.items():
        if set(facts) != _FACTS:
            raise AssertionError(f"runtime.block_graph.FORMS{form} must name every BlockGraph fact; it lacks "
                                 f"{sorted(_FACTS - set(facts))} and has unknown {sorted(set(facts) - _FACTS)}")


check_forms(FORMS)  # when the module loads: nothing runs until every form has answered


def compiled_form(bg: BlockGraph, activation: str, path: str) -> str | None:
    """The compiled form of ``path`` ("ggml": the int8 blocks; "float": the F16/BF16 ones) that
    implements every fact of ``bg`` with the FFN computing ``activation`` (as this pass computes
    it: ``Model._activation``); None when none does."""
    facts = {**asdict(bg), "activation": activation}
    for (p, form), implemented in FORMS.items():
        if p == path and all(v is ANY or facts[k] in v for k, v in implemented.items()):
            return form
    return None


# Where each graph field of the architecture row (aios.models.architectures.GRAPH_FIELDS) lands:
# the BlockGraph fact it sets, or why no block route reads it.
ROW_FACTS = {
    "norm": "norm",
    "rope": "rope",
    "fused_qkv": "fused_qkv",
    "qk_norm": "qk_norm",
    "post_norms": "post_norms",
    "parallel_ffn_norm": "ffn_norm",
    "attn_softcap_key": "attn_softcap",  # through hp.attn_softcap
    "final_softcap_key": "model: after the head; the whole-step call declines a capped model",
    "embed_scale": "model: the embedding, before every route",
    "q_prescale": "q_prescale",
    "sliding_window_key": "window",  # through hp.window
    "swa_pattern": "local_rope",  # through hp.swa_layers: the window and the local RoPE base
}
# other row fields the block routes read
ROW_FACTS_ELSEWHERE = {"parallel_attn_default": "parallel", "gated_ffn": "gated_ffn", "fused_gate_up": "fused_gate_up"}
