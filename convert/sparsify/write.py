"""The sparsified GGUF: ``aios.ffn_threshold.*`` keys added to the source file, every tensor
copied byte for byte (or, with ``--sparse-down``, the down projections re-encoded neuron-major),
through the GGUF spine's rewrite (``convert.gguf.writer.rewrite_gguf``)."""

from __future__ import annotations

import json
import re
from dataclasses import asdict
from pathlib import Path

import numpy as np

from aios import __version__
from convert.sparsify.config import KEY_PREFIX, SparsifyConfig, SparsifyResult
from runtime.thresholds import KEY_INPUT, KEY_SITE, KEY_VALUES, FfnThresholds, InputThresholds


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


def write_sparsified(src: Path, out: Path, meta: dict[str, object], model, sparse_down: bool,
                     warnings: list[str]) -> None:
    """``src`` with ``meta`` added: every tensor copied byte for byte, or, with ``sparse_down``,
    the FFN down projections re-encoded neuron-major (``blk.N.ffn_down.t``)."""
    import gguf

    from convert.gguf.metadata import sparse_down_keys
    from convert.gguf.writer import RawTensor, rewrite_gguf

    reader = model.reader
    extra = dict(meta)
    if sparse_down:
        extra.update(sparse_down_keys(model.hp.n_layers))
    tensors = []
    for t in reader.tensors:
        if sparse_down and re.fullmatch(r"blk\.\d+\.ffn_down\.weight", t.name):
            name, arr, typ, why = _neuron_major(src, t)
            if why:
                warnings.append(f"{name}: {why}")
            tensors.append(RawTensor(name, _elem_shape(t), gguf.GGMLQuantizationType[typ], arr))
        else:
            tensors.append(RawTensor.copied(src, t))
    rewrite_gguf(reader, out, tensors, extra,
                 skip=lambda key: key.startswith((KEY_PREFIX, KEY_INPUT)) or key in extra)


def _elem_shape(t) -> tuple[int, int]:
    """The neuron-major shape (d_ffn, d_model) of down projection ``t`` (stored d_model × d_ffn)."""
    d_ffn, d_model = (int(x) for x in t.shape.tolist())  # ggml order: row length first
    return d_ffn, d_model


def _neuron_major(src: Path, t) -> tuple[str, np.ndarray, str, str | None]:
    """(name, encoded bytes, GGML type name, fallback reason) of ``t`` transposed to d_ffn rows
    of d_model, in its own type where d_model fits the type's blocks (else the export's fallback)."""
    from convert.gguf.plan import SPARSE_DOWN
    from convert.gguf.tensors import choose_type, encode
    from runtime.measure import gguf_row_reader

    _, d_model = _elem_shape(t)
    w = gguf_row_reader(src)(t.name, 0, d_model)  # (d_model, d_ffn) float32, the stored values
    wt = np.ascontiguousarray(w.T)
    kind = t.tensor_type.name.lower()
    typ, why = choose_type(wt.shape, kind) if kind in _ENCODABLE else ("q8_0", (f"{kind.upper()} is not "
                                                                                "re-encoded by this tool"))
    arr = encode(wt, typ)
    return SPARSE_DOWN.format(base=t.name.removesuffix(".weight")), arr, typ.upper(), (
        None if why is None else f"stored as {typ.upper()} ({why})")


_ENCODABLE = ("f32", "f16", "q8_0", "q4_0", "q5_0", "q4_k", "q6_k", "q2_k")
