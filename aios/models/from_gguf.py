"""A llama.cpp GGUF as an HF folder, so the converters can start from the files people hold.

On CPUs people keep GGUFs (often quantized, often without the original checkpoint). The
converters (relufy, alias, gguf) train or rewrite an HF model: for a GGUF source they work on
its dequantized twin, written once into a cache folder:

- the weights: transformers' GGUF loader (``ModelHandle.load_torch``), which dequantizes every
  tensor through gguf-py and undoes llama.cpp's layout (q/k permutation, Gemma's norm + 1). It
  random-initializes tensors it does not know, so :meth:`ModelHandle.load_torch` refuses any
  file with a weight it did not load; nothing is measured on noise. Saved as float32 safetensors.
- the tokenizer: the one llama.cpp reads from the file (``aios.models.gguf_tokenizer``).
- ``aios_source_gguf.json``: the source file (name, bytes, sha256, per-tensor quant types), which
  every converter copies into its output's provenance, so a result says its source was quantized.

The cache is ``$AIOS_CACHE/from-gguf/<file stem>-<sha256 prefix>`` (default ``~/.cache/aios``), written
under a temporary name and renamed when complete. transformers holds the whole dequantized model
in memory while it loads (float32: 4 bytes per parameter), so this is for models that fit.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
from pathlib import Path

from aios.errors import InvalidModelError
from aios.io import cache_root as aios_cache_root
from aios.io import sha256_file
from aios.models.handle import ModelHandle

MARKER = "aios_source_gguf.json"
CACHE_FORMAT = "v2"  # v2: a tied embedding saved under its own name (v1 folders kept only lm_head.weight)
# keys of GGUFs only aios-run runs (extra or replaced tensors): no HF twin can be made of them
AIOS_ONLY = {"aios.lowrank.format": "low-rank + residual matrices, aios-convert svd-residual",
             "aios.alias.groups": "canonical + delta weights, aios-convert alias --gguf",
             "aios.sparse_down.format": "neuron-major down projections, --sparse-down",
             "aios.sparsity.format": "an embedded sparsity map"}


def cache_root() -> Path:
    return aios_cache_root() / "from-gguf"


def source_record(handle: ModelHandle) -> dict:
    """What the converted output says about its GGUF source."""
    assert handle.path is not None and handle.store is not None
    types = collections.Counter(t.dtype for t in handle.tensor_inventory() if len(t.shape) == 2)
    return {"file": handle.path.name, "bytes": handle.path.stat().st_size, "sha256": sha256_file(handle.path),
            "architecture": handle.arch.name, "matrix_types": dict(sorted(types.items())),
            "quantized": any(k not in ("F32", "F16", "BF16") for k in types),
            "dequantized_by": "transformers (gguf-py dequantizers), saved as float32"}


def hf_source(handle: ModelHandle, progress=None) -> ModelHandle:
    """``handle`` itself unless it is a GGUF; then the handle of its dequantized HF folder
    (made once, cached by the file's sha256)."""
    if handle.kind != "gguf":
        return handle
    from aios.models.resolve import resolve_model

    store = handle.store
    own = next((what for key, what in AIOS_ONLY.items()
                if store is not None and store.field(key) is not None), None)
    if own is not None:  # transformers would random-initialize its extra tensors
        raise InvalidModelError(f"{handle.path.name} is an aios-run file ({own}), not a model "
                                "transformers can load; convert the model it was made from.")

    record = source_record(handle)
    folder = cache_root() / f"{handle.path.stem}-{record['sha256'][:16]}-{CACHE_FORMAT}"
    if not (folder / MARKER).is_file():
        if progress:
            progress(f"dequantizing {handle.path.name} into an HF folder (once; cached in {folder})")
        tmp = folder.with_name(folder.name + f".tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            _save_hf(handle.load_torch(dtype="float32"), tmp)
            handle.load_tokenizer().save_pretrained(str(tmp))
            (tmp / MARKER).write_text(json.dumps(record, indent=1) + "\n")
            if folder.exists():  # another process finished first
                shutil.rmtree(tmp)
            else:
                os.replace(tmp, folder)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    out = resolve_model(str(folder))
    out.notes.append(f"source: {record['file']} ({'quantized: ' if record['quantized'] else ''}"
                     f"{', '.join(f'{k} ×{n}' for k, n in record['matrix_types'].items())}), "
                     f"dequantized to float32 by transformers")
    return out


def _save_hf(model, folder: Path) -> None:
    """config.json and model.safetensors of a transformers model loaded from a GGUF. Its
    ``save_pretrained`` refuses (the model is flagged "quantized with gguf", though every weight
    is a dequantized float tensor), so the weights go through safetensors' own ``save_model``
    (which keeps one copy of tied tensors, as ``save_pretrained`` does) and the config without
    the loader's quantization note."""
    from safetensors.torch import save_model

    config = model.config.to_dict()
    config.pop("quantization_config", None)
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    emb, head = model.get_input_embeddings(), model.get_output_embeddings()
    if head is not None and emb is not None and head.weight is emb.weight:
        # tied: keep the embedding's name, as save_pretrained does (safetensors alone kept
        # lm_head.weight, and a GGUF exported from the folder then had no token_embd.weight)
        from safetensors.torch import save_file

        sd = model.state_dict()
        ptr = emb.weight.data_ptr()
        keep = next(n for n, mod in model.named_modules() if mod is emb) + ".weight"
        drop = {k for k, v in sd.items() if v.data_ptr() == ptr and k != keep}
        save_file({k: v.contiguous() for k, v in sd.items() if k not in drop}, str(folder / "model.safetensors"),
                  metadata={"format": "pt"})
        return
    save_model(model, str(folder / "model.safetensors"), metadata={"format": "pt"})


def gguf_source_of(folder: Path | None) -> dict | None:
    """The GGUF a cached folder was dequantized from (for provenance), or None."""
    if folder is None or not (Path(folder) / MARKER).is_file():
        return None
    return json.loads((Path(folder) / MARKER).read_text())
