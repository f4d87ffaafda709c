"""Activation-aware calibration: XᵀX of each factorized matrix's input on calibration texts
(the whitening of ``convert/lowrank/factorize.py``), from forward pre-hooks on the HF model."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np

from aios.models import ModelHandle, resolve_model
from aios.models.from_gguf import hf_source
from convert.lowrank.config import SvdResidualConfig
from convert.lowrank.factorize import is_factorized


def collect_grams(handle: ModelHandle, sources: list[str], texts: list[str], max_tokens: int,
                  progress: Callable[[str], None] | None = None, batch_size: int = 32) -> tuple[dict[str, np.ndarray], int]:
    """XᵀX (float64, n_in × n_in) of the input of each module whose weight is in ``sources``.

    Forward pre-hooks on the HF modules; texts cut to ``max_tokens`` tokens, batched by length
    and right-padded, padded positions masked out (as the R1 measurement does). Returns the
    Gram matrices and the number of tokens seen.
    """
    import torch

    model = handle.load_torch(dtype="float32")
    tok = handle.load_tokenizer()
    grams: dict[str, torch.Tensor] = {}
    mask: list = [None]  # (B, T) bool of real (unpadded) positions in the running batch
    hooks = []

    def make_hook(src: str):
        def hook(_module, args):
            x = args[0].detach()[mask[0]].double()  # (real tokens, n_in)
            grams[src] = grams[src] + x.T @ x if src in grams else x.T @ x

        return hook

    for src in sources:
        module = model.get_submodule(src.removesuffix(".weight"))
        hooks.append(module.register_forward_pre_hook(make_hook(src)))
    encoded = [ids for ids in (tok(t, verbose=False)["input_ids"][:max_tokens] for t in texts) if ids]
    encoded.sort(key=len)  # similar lengths per batch: little padding
    n_tokens = 0
    try:
        with torch.inference_mode():
            for b0 in range(0, len(encoded), batch_size):
                batch = encoded[b0 : b0 + batch_size]
                T = max(len(ids) for ids in batch)
                input_ids = torch.zeros((len(batch), T), dtype=torch.long)
                mask[0] = torch.zeros((len(batch), T), dtype=torch.bool)
                for r, ids in enumerate(batch):  # right padding: causal attention keeps real positions exact
                    input_ids[r, : len(ids)] = torch.tensor(ids)
                    mask[0][r, : len(ids)] = True
                model(input_ids=input_ids, attention_mask=mask[0].long(), use_cache=False)
                n_tokens += int(mask[0].sum())
                if progress:
                    progress(f"calibration: {min(b0 + batch_size, len(encoded))}/{len(encoded)} texts")
    finally:
        for h in hooks:
            h.remove()
    return {k: v.numpy() for k, v in grams.items()}, n_tokens


def calibrate(model: str | ModelHandle, cfg: SvdResidualConfig, calibration: str | None = None,
              progress: Callable[[str], None] | None = None) -> tuple[dict[str, np.ndarray], dict]:
    """XᵀX of every factorized matrix's input on the calibration texts, and their description."""
    from aios.data import load_texts, texts_sha256
    from convert.gguf import check_exportable, plan_tensors

    handle = hf_source(model if isinstance(model, ModelHandle) else resolve_model(model))
    check_exportable(handle)
    texts = load_texts(calibration, cfg.samples)
    sources = [p.source for p in plan_tensors(handle, cfg.outtype) if is_factorized(p)]
    grams, n_tok = collect_grams(handle, sources, texts, cfg.max_tokens, progress)
    return grams, {"source": Path(calibration).name if calibration else "aios/data/calibration.jsonl",
                   "texts": len(texts), "tokens": n_tok, "max_tokens": cfg.max_tokens,
                   "texts_sha256": texts_sha256(texts)}
