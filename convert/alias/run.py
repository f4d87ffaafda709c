"""``aios-convert alias`` as one library call: export an aliased folder, alias post-hoc, or train.

Layering: above ``convert/alias/posthoc.py`` (post-hoc), ``convert/alias/train.py`` (trained) and
``convert/alias/export.py`` (GGUF exports), which it imports lazily (they load torch); none of
them imports this module. Which options each mode accepts is decided here, so the command and
library callers refuse the same combinations with the same sentences.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from aios.errors import UsageError

if TYPE_CHECKING:
    from convert.alias.posthoc import AliasResult
    from convert.gguf import ExportResult

ExportedFn = Callable[["ExportResult", bool], None]  # (written file, de-aliased?)


def _check_sparse_down(sparse_down: bool, gguf) -> None:
    if sparse_down and not gguf:
        raise UsageError("--sparse-down stores the aliased GGUF's down projections neuron-major: pass --gguf OUT.gguf "
                         "(the de-aliased --dealias file keeps the standard layout for llama.cpp).")


def export_aliased(model: str, *, gguf: str | Path | None, dealias: str | Path | None,
                   outtype: str, exported: ExportedFn | None = None, sparse_down: bool = False,
                   like: str | Path | None = None) -> list[ExportResult]:
    """GGUFs of an already aliased folder: aliased (``gguf``, neuron-major down projections
    with ``sparse_down``) and/or de-aliased (``dealias``), typed like the GGUF ``like`` if given.

    ``exported`` hears of each file as soon as it is written, before the next one starts.
    """
    from convert.alias.export import export_alias_gguf

    if not (gguf or dealias):
        raise UsageError("Pass -o OUT to alias MODEL, or --gguf/--dealias to export an already "
                         "aliased MODEL.")
    _check_sparse_down(sparse_down, gguf)
    results = []
    for path, flat in ((gguf, False), (dealias, True)):
        if path:
            results.append(export_alias_gguf(model, path, outtype=outtype, dealias=flat,
                                             sparse_down=sparse_down and not flat, like=like))
            if exported:
                exported(results[-1], flat)
    return results


def run_alias(model: str, out: str | Path | None, *, zones: str | None = None,
              delta: str = "lowrank:8", canonical: str = "mean",
              types: tuple[str, ...] | None = None, min_cosine: float | None = None,
              budget_ppl: float | None = None, train: bool = False,
              steps: int | None = None, lam: float | None = None, lr: float | None = None,
              delta_norm: str | None = None, gguf: str | Path | None = None,
              dealias: str | Path | None = None, outtype: str = "f32",
              progress: Callable[[str], None] | None = None,
              exported: ExportedFn | None = None, train_data: str | Path | None = None,
              micro_batch: int | None = None, device: str | None = None,
              checkpoint_every: int | None = None, resume: bool = False,
              sparse_down: bool = False, like: str | Path | None = None) -> AliasResult | None:
    """What ``aios-convert alias`` does with its options.

    ``out`` None: only export the already aliased ``model`` (:func:`export_aliased`; returns
    None). ``train``: trained aliasing (``zones`` default ``all``; the post-hoc options are
    refused). Otherwise post-hoc aliasing (``zones`` default ``core``; the training options
    are refused). ``None`` for a training option keeps its :class:`AliasTrainConfig` default.
    A distributed ``train`` run returns None on every process but rank 0. ``sparse_down``: the
    ``gguf`` output stores its FFN down projections neuron-major (``convert.alias.export``).
    ``like``: a GGUF (e.g. the quantized file ``model`` came from) whose per-tensor types the
    ``gguf``/``dealias`` outputs take instead of ``outtype``.
    """
    if like is not None and not (gguf or dealias):
        raise UsageError("--like types the GGUF outputs: pass --gguf OUT.gguf and/or --dealias OUT.gguf with it.")
    if like is not None:  # a missing file is refused before minutes of aliasing
        from convert.gguf.tensors import like_types

        like_types(like)
    if out is None:
        export_aliased(model, gguf=gguf, dealias=dealias, outtype=outtype, exported=exported,
                       sparse_down=sparse_down, like=like)
        return None
    _check_sparse_down(sparse_down, gguf)
    if sparse_down or like is not None:  # alias without those GGUFs, then export them from the written folder
        from aios.models import ModelHandle, resolve_model
        from convert.alias.export import check_sparse_down_layout

        if sparse_down:  # refused before minutes of aliasing, not after them
            check_sparse_down_layout(model if isinstance(model, ModelHandle) else resolve_model(str(model)))
        result = run_alias(model, out, zones=zones, delta=delta, canonical=canonical, types=types,
                           min_cosine=min_cosine, budget_ppl=budget_ppl, train=train, steps=steps, lam=lam,
                           lr=lr, delta_norm=delta_norm, gguf=None, dealias=None if like else dealias,
                           outtype=outtype, progress=progress, exported=exported, train_data=train_data,
                           micro_batch=micro_batch, device=device, checkpoint_every=checkpoint_every,
                           resume=resume)
        if result is not None and not result.report.get("groups"):
            from convert.alias.posthoc import no_groups_note

            result.warnings.append(no_groups_note(result.output))
        elif result is not None:  # rank 0 (or a single process)
            from convert.alias.export import export_alias_gguf

            if gguf:
                result.gguf = export_alias_gguf(result.output, gguf, outtype=outtype, sparse_down=sparse_down,
                                                like=like).output
                result.gguf_sparse_down = sparse_down
            if like is not None and dealias:
                result.dealiased_gguf = export_alias_gguf(result.output, dealias, outtype=outtype, dealias=True,
                                                          like=like).output
        return result
    if train:
        from convert.alias.train import AliasTrainConfig, train_alias

        if min_cosine is not None or budget_ppl is not None or canonical != "mean":
            raise UsageError("--min-cosine, --budget-ppl and --canonical apply to post-hoc "
                             "aliasing, not --train.")
        overrides = dict(zones=zones, steps=steps, lam=lam, lr=lr, norm=delta_norm)
        cfg = replace(AliasTrainConfig(delta=delta, types=types),
                      **{k: v for k, v in overrides.items() if v is not None})
        return train_alias(model, out, cfg, outtype=outtype, gguf=gguf, dealias=dealias,
                           progress=progress, train_data=train_data, micro_batch=micro_batch,
                           device=device, checkpoint_every=checkpoint_every or 0, resume=resume)
    from convert.alias.posthoc import AliasConfig, alias

    if steps is not None or lam is not None or lr is not None or delta_norm is not None or \
            train_data is not None or micro_batch is not None or device is not None or \
            checkpoint_every is not None or resume:
        raise UsageError("--steps, --lam, --lr, --delta-norm, --train-data, --micro-batch, "
                         "--device, --checkpoint-every and --resume need --train.")
    post = AliasConfig(zones=zones or "core", delta=delta, canonical=canonical, types=types,
                       min_cosine=min_cosine, budget_ppl=budget_ppl)
    return alias(model, out, post, outtype=outtype, gguf=gguf, dealias=dealias, progress=progress)


__all__ = ["export_aliased", "run_alias"]
