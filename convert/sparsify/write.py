"""The sparsified GGUF: ``aios.ffn_threshold.*`` keys added to the source file, every tensor
copied byte for byte (or, with ``--sparse-down``, the down projections re-encoded neuron-major),
through the GGUF spine's rewrite (``convert.gguf.writer.rewrite_gguf``)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import numpy as np

from aios import __version__
from convert.sparsify.config import KEY_PREFIX, SparsifyConfig, SparsifyResult
from runtime.thresholds import (
    KEY_INPUT,
    KEY_SITE,
    KEY_VALUES,
    SITE_MATRICES,
    FfnThresholds,
    InputThresholds,
)

INPUT_MAJOR_KEY = "aios.input_major.matrices"  # the matrix names stored input-major (blk.N.<name>.t)


def metadata(result: SparsifyResult, cuts: FfnThresholds, config: SparsifyConfig,
             inputs: InputThresholds | None = None) -> dict[str, object]:
    """The ``aios.ffn_threshold.*`` keys of the output file (and ``aios.input_threshold.<site>``
    with ``inputs``)."""
    cfg = asdict(config)
    if cfg["calibration"]:
        cfg["calibration"] = Path(cfg["calibration"]).name
    sites = {} if inputs is None else {KEY_INPUT + s: [float(x) for x in v] for s, v in inputs.values.items()}
    return {
        **sites,
        KEY_SITE: result.site,
        KEY_VALUES: np.ravel(cuts.values).astype(np.float32).tolist(),
        KEY_PREFIX + "layer_sparsity": [float(x) for x in result.layer_sparsity],
        KEY_PREFIX + "target": float(result.target),
        KEY_PREFIX + "calibration": json.dumps(result.calibration, sort_keys=True),
        KEY_PREFIX + "config": json.dumps(cfg, sort_keys=True),
        KEY_PREFIX + "tool_version": __version__,
        KEY_PREFIX + "runtime": "aios-run applies the thresholds; llama.cpp ignores them (dense smooth activation)",
    }


def input_major_tensors(model, ffn_site: str, ffn_cut: bool, inputs: InputThresholds | None,
                        sparse_down: bool, input_major: bool) -> set[str]:
    """The ``blk.N.X.weight`` tensors stored input-major (``blk.N.X.t``, re-encoded): with
    ``sparse_down`` every down projection; with ``input_major`` every matrix a cut input of its
    layer feeds (q/k/v, o, gate/up: runtime.thresholds.SITE_MATRICES) and the down projection
    where the FFN is cut at its input. The gate site's up rows are skipped by the gate (output
    rows, the standard layout), so up stays as stored there; a fused gate/up (one tensor, split at
    load) stays too."""
    names = set()
    for i, L in enumerate(model.layers):
        keep = []
        if sparse_down or (input_major and ffn_cut):
            keep.append("ffn_down")
        if input_major and inputs is not None:
            for site in inputs.sites(i):
                keep += SITE_MATRICES[site]
        for n in keep:
            if (n == "ffn_up" and model.hp.graph.fused_gate_up) or f"{n}.weight" not in L:
                continue
            names.add(f"blk.{i}.{n}.weight")
    return names


# --input-major-type wider (the default): the type each source type is re-encoded in, one step
# more bits, so the second rounding (along the other axis) adds ~1/4 of the source's error
# variance instead of ~as much again. Measured on the real Qwen2.5-Coder-1.5B Q4_K_M at 49 %
# model-wide, held-out perplexity (aios/data/heldout.jsonl, 2,048 tokens) of the cut model 20.97
# with the source's bytes, 23.18 re-encoded in the same types (+10.5 %), 21.33 wider (+1.7 %);
# the real Gemma 3 270M: +18 % and +10 % (docs/benchmarks.md).
WIDER = {"q2_k": "q4_0", "q4_0": "q5_0", "q4_k": "q5_0", "q5_0": "q8_0", "q6_k": "q8_0"}
MAJOR_TYPES = ("wider", "same")


def write_sparsified(src: Path, out: Path, meta: dict[str, object], model, major: set[str],
                     warnings: list[str], major_type: str = "wider") -> None:
    """``src`` with ``meta`` added: every tensor copied byte for byte, except those in ``major``
    (``input_major_tensors``), re-encoded input-major (``blk.N.X.t``) in the source's type
    (``major_type`` "same") or the next wider one (``WIDER``)."""
    import gguf

    from convert.gguf.metadata import sparse_down_keys
    from convert.gguf.writer import RawTensor, rewrite_gguf

    reader = model.reader
    extra = dict(meta)
    if any(n.endswith(".ffn_down.weight") for n in major):
        extra.update(sparse_down_keys(model.hp.n_layers))
    if major:
        extra[INPUT_MAJOR_KEY] = sorted({n.split(".", 2)[2].removesuffix(".weight") for n in major})
    tensors = []
    for t in reader.tensors:
        if t.name in major:
            name, arr, typ, why = _neuron_major(src, t, major_type)
            if why:
                warnings.append(f"{name}: {why}")
            tensors.append(RawTensor(name, _elem_shape(t), gguf.GGMLQuantizationType[typ], arr))
        else:
            tensors.append(RawTensor.copied(src, t))
    rewrite_gguf(reader, out, tensors, extra,
                 skip=lambda key: key.startswith((KEY_PREFIX, KEY_INPUT)) or key in extra)


def _elem_shape(t) -> tuple[int, int]:
    """The input-major shape (n_in, n_out) of matrix ``t`` (stored n_out rows of n_in)."""
    n_in, n_out = (int(x) for x in t.shape.tolist())  # ggml order: row length first
    return n_in, n_out


def _neuron_major(src: Path, t, major_type: str = "same") -> tuple[str, np.ndarray, str, str | None]:
    """(name, encoded bytes, GGML type name, fallback reason) of ``t`` transposed to n_in rows
    of n_out, in its own type where n_out fits the type's blocks (else the export's fallback); a
    type this tool does not encode becomes the one ``--like`` writes for it (as many bits or more)."""
    from convert.gguf.plan import SPARSE_DOWN
    from convert.gguf.tensors import LIKE_SUBSTITUTE, choose_type, encode
    from runtime.measure import gguf_row_reader

    _, n_out = _elem_shape(t)
    w = gguf_row_reader(src)(t.name, 0, n_out)  # (n_out, n_in) float32, the stored values
    wt = np.ascontiguousarray(w.T)
    kind = t.tensor_type.name.lower()
    sub = None if kind in _ENCODABLE else LIKE_SUBSTITUTE.get(kind.upper(), "q8_0")
    want = sub or kind
    typ, why = choose_type(wt.shape, WIDER.get(want, want) if major_type == "wider" else want)
    if sub is not None:
        why = f"{kind.upper()} is not re-encoded by this tool" + ("" if why is None else f"; {why}")
    arr = encode(wt, typ)
    return SPARSE_DOWN.format(base=t.name.removesuffix(".weight")), arr, typ.upper(), (
        None if why is None else f"stored as {typ.upper()} ({why})")


_ENCODABLE = ("f32", "f16", "q8_0", "q4_0", "q5_0", "q4_k", "q6_k", "q2_k")
