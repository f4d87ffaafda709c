"""``aios-convert relufy``: swap a smooth FFN activation for ReLU and fine-tune to recover.

What it does
------------
1. Loads MODEL (an HF safetensors folder, a cached hub id or a bundled alias) and measures
   the held-out perplexity and the exact-zero fraction of its FFN activations ("before").
2. Writes the new activation into the config key the architecture row names
   (falcon ``activation``, llama-family ``hidden_act``, ...) and reloads the weights with
   stock transformers, so the model that is trained is the one users will load. It checks
   that every block really runs the new activation. Measures again ("after swap").
3. Recovery fine-tune (``convert/training.py``): AdamW, warmup + cosine decay, gradient
   clipping, bf16 autocast on a GPU, optional progressive activation-L1 (ProSparse-style).
4. Measures again ("after") and writes the output folder: weights (source dtype),
   ``config.json`` with the new activation, the source tokenizer files byte for byte, and
   the provenance ``aios_relufy.json`` (config, data hashes, steps, metrics, training log).

Choices
-------
* **Gated FFNs** (SwiGLU: ``act(gate·x) * (up·x)``): the activation sits on the gate, so
  ``hidden_act="relu"`` makes the *product* exactly zero wherever the gate is ≤ 0; the up
  projection stays linear. This is what ReluLLaMA does and what stock transformers runs.
* **Activations**: ``relu`` and ``relu2`` (ReLU², HF ``ACT2FN["relu2"]``). Thresholded ReLU
  (``fatrelu:T``) is refused: stock transformers has no such activation, so the output would
  not load without custom code. Use ``relu`` with ``--l1`` to push sparsity instead.
* **Sparsity** numbers come from the R1 checker's code on the bundled calibration prompts
  (same defaults as ``aios-contract check``); held-out perplexity is the fixtures' protocol
  (``convert/evaluation.py``). By default the training text is the fixtures' train split of
  ``pydoc_data.topics``, which never overlaps the held-out topics; ``--train-data`` replaces it.

Warm start from calibrated thresholds (``--init-thresholds FILE``)
-----------------------------------------------------------------
``aios-convert sparsify`` calibrates one cut per layer on the input of the down projection
(|x| < t_l → 0) without training. With ``--init-thresholds`` that file's cuts are installed on
the swapped model before the first step and stay in place through the fine-tune (a hook on each
down projection; the gradient flows through the kept entries), so the model trains with the
zeros it will have instead of reaching them only through the L1 penalty. The cut becomes part of
the output model: ``config.json`` gets ``aios_ffn_threshold`` (``aios/models/ffn_cut.py``), which
our loader, ``aios-contract check`` and ``aios-convert gguf`` (to ``aios.ffn_threshold.*``, applied
by aios-run) honour and stock transformers ignores (it runs the ReLU model without the cut: fewer
zeros; the command says so). A source that already carries such a cut keeps it. Only ``down_in``
cuts with one value per layer are taken (sparsify's default); ``--site gate`` files are refused.

Scale: processes, data, precision
---------------------------------
The fine-tune runs on ``accelerate`` (``convert/engine.py``): started plainly it is one
process on one device; ``accelerate launch`` / ``torchrun`` run the same command as DDP on
several CPUs (gloo), GPUs or nodes, or FSDP from an accelerate config (docs/commands.md has
the exact commands). ``batch`` is the *global* batch in windows (``--batch-tokens`` gives it in
tokens), split over the processes and ``micro_batch``-window micro-batches with gradient
accumulation; the update does not depend on that split. The activation-L1 density weights
are reduced over all processes. ``--train-data`` streams JSONL/TXT/Parquet files, folders
or globs through ``datasets`` (``convert/train_data.py``); ``--tokens`` sets the step count
from a token budget; ``--heldout-data`` replaces the held-out text.

Files, interruption and resume
------------------------------
The run keeps its state in ``OUT.partial/checkpoint-STEP/`` (``accelerator.save_state``:
weights, AdamW state, the RNG of every rank; plus each rank's data position and rank 0's
step, metrics and logs), written every ``checkpoint_every`` steps; ``OUT.partial/latest``
names the last complete one. Ctrl-C, a crash or the kill of any rank leaves that folder and
nothing under ``OUT``; ``--resume`` (same number of processes) continues from it and gives the
same weights as an uninterrupted run. The output is built by rank 0 in a temporary sibling
folder and renamed to ``OUT`` in one step; the work folder is removed afterwards. Same model,
data, config and seed → identical weights and provenance (on the same device, process count
and thread count), except the provenance's ``throughput`` block, which is measured wall time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aios.errors import UsageError
from convert.relufication.config import (
    ACTIVATIONS,
    CONFIG_VERSION,
    PROVENANCE_FILE,
    ProgressFn,
    RelufyConfig,
)

__all__ = ["ACTIVATIONS", "CONFIG_VERSION", "PROVENANCE_FILE", "ProgressFn",
           "RelufyConfig", "RelufyResult", "parse_activation", "relufy"]


def parse_activation(text: str) -> str:
    """``relu`` | ``relu2`` → itself; ``fatrelu:T`` → a clear refusal (see module docstring)."""
    t = text.strip().lower()
    if t in ACTIVATIONS:
        return t
    if t.startswith("fatrelu"):
        raise UsageError(
            f"'{text}': thresholded ReLU is not an activation stock transformers can load "
            "(the output would need custom modelling code); use --activation relu, optionally "
            "with a larger --l1 to push sparsity further.")
    raise UsageError(f"Unknown activation '{text}'; choose relu or relu2.")


@dataclass
class RelufyResult:
    out: Path
    provenance: dict[str, Any]
    seconds: float  # wall time of this invocation (not stored in the artifact)
    resumed_from: int | None = None  # step a resumed run continued from
    is_main: bool = True  # False on the other processes of a distributed run (they write nothing)


def _quiet(_event: str, **_info: Any) -> None:
    pass


def relufy(model: str, out: str | Path, config: RelufyConfig | None = None, *,
           train_data: str | Path | None = None, device: str | None = None,
           resume: bool = False, checkpoint_every: int = 50, eval_every: int = 0,
           calibration_samples: int | None = None, progress: ProgressFn = _quiet,
           micro_batch: int | None = None, heldout_data: str | Path | None = None,
           gradient_checkpointing: bool = False, tokens: int | str | None = None,
           init_thresholds: str | Path | None = None) -> RelufyResult:
    """Relufy ``model`` into the HF folder ``out``; library entry point of ``aios-convert relufy``.

    ``eval_every`` > 0 also measures held-out perplexity and exact zeros every that many
    steps (recorded as ``curve`` in the provenance; costs time, does not change the weights).
    ``calibration_samples`` limits the calibration prompts used for the sparsity numbers
    (default: all 241, as ``aios-contract check``). ``micro_batch``: windows per forward pass
    per process (default: the process's whole share of the global batch). ``tokens``: a token
    budget (``2B``, ``500M``) that replaces ``config.steps`` by ceil(tokens / global batch tokens).
    ``init_thresholds``: a GGUF of this model written by ``aios-convert sparsify`` (site
    ``down_in``), or an HF folder whose config.json has ``aios_ffn_threshold``: the warm start
    (module docstring, "Warm start").
    """
    from dataclasses import replace

    from convert.engine import parse_tokens, steps_for
    from convert.relufication.run import run

    cfg = config or RelufyConfig()
    budget = None
    if tokens is not None:
        budget = parse_tokens(str(tokens))
        cfg = replace(cfg, steps=steps_for(budget, cfg.batch, cfg.seq_len))
    cfg.validate()
    if checkpoint_every < 0 or eval_every < 0:
        raise UsageError("checkpoint_every and eval_every must be ≥ 0.")
    t0 = time.perf_counter()
    out = Path(out).expanduser().absolute()
    provenance, resumed_from, is_main = run(model, out, cfg, train_data=train_data, device=device,
                                   resume=resume, checkpoint_every=checkpoint_every,
                                   eval_every=eval_every, calibration_samples=calibration_samples,
                                   progress=progress, micro_batch=micro_batch,
                                   heldout_data=heldout_data,
                                   gradient_checkpointing=gradient_checkpointing,
                                   token_budget=budget, init_thresholds=init_thresholds)
    return RelufyResult(out, provenance, time.perf_counter() - t0, resumed_from, is_main)
