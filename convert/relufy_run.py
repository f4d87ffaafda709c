"""The relufy run: validation, model and data loading, the work folder, measurement, output.

Orchestration only; the optimisation math is in ``convert/training.py`` and the public
entry point and config in ``convert/relufy.py`` (read its docstring first).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator

import torch

from aios import CONTRACT_VERSION, __version__
from aios.data import CALIBRATION_FILE, load_texts, texts_sha256
from aios.data import BadTextFileError
from aios.errors import InvalidModelError, UnsupportedArchitectureError, UsageError
from aios.evaluation import TokenSet, file_tokens, pydoc_split
from aios.io import hash_file, write_atomic
from aios.models import ModelHandle, resolve_model
from convert import evaluation as ev
from convert import training as tr
from convert.relufy_config import CHECKPOINT_FILE, DEVICES, PROVENANCE_FILE, ProgressFn, RelufyConfig

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "added_tokens.json", "vocab.json", "merges.txt", "vocab.txt", "tokenizer.model",
                   "chat_template.jinja")
LOG_EVERY = 10  # training-log granularity (steps) kept in the provenance


def partial_dir(out: Path) -> Path:
    return out.with_name(out.name + ".partial")


def source_sha256(handle: ModelHandle) -> str:
    """Digest of config.json and every safetensors file (sorted), identifying the source."""
    assert handle.path is not None
    h = hashlib.sha256()
    for f in [handle.path / "config.json", *sorted(handle.path.glob("*.safetensors"))]:
        h.update(f.name.encode() + b"\0")
        hash_file(h, f)
    return h.hexdigest()


def _check_source(handle: ModelHandle) -> None:
    if handle.kind == "gguf" or handle.path is None or not handle.path.is_dir():
        handle.require_weights("Relufy")
        raise InvalidModelError(
            f"relufy needs an HF safetensors folder (trainable weights + config.json); "
            f"'{handle.spec}' is a {handle.kind}. Convert from the original HF checkpoint.")
    if not handle.arch.activation_keys:
        raise UnsupportedArchitectureError(
            f"Architecture '{handle.arch.name}' has no configurable FFN activation.")


def _load_swapped(handle: ModelHandle, activation: str, device: torch.device):
    """Stock transformers model with ``activation`` in the row's config key, checked per block."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.activations import ACT2FN
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # the fine-tune bar owns the terminal
    assert handle.path is not None
    cfg = AutoConfig.from_pretrained(str(handle.path))
    keys = handle.arch.activation_keys
    key = next((k for k in keys if k in handle.config), keys[0])
    setattr(cfg, key, activation)
    model = AutoModelForCausalLM.from_pretrained(str(handle.path), config=cfg, dtype=torch.float32,
                                                 use_safetensors=True, trust_remote_code=False)
    want = type(ACT2FN[activation])
    for i in range(handle.facts.n_layers):
        got = model.get_submodule(handle.arch.block(i, handle.arch.ffn_act_module))
        if type(got) is not want:
            raise UnsupportedArchitectureError(
                f"'{handle.arch.name}' models do not take their FFN activation from config key "
                f"'{key}' (block {i} runs {type(got).__name__}); relufy cannot convert them.")
    return model.to(device), key


def _measure(handle, model, tokenizer, heldout: TokenSet, calib: list[str]) -> dict[str, Any]:
    device = next(model.parameters()).device
    ppl = ev.heldout_perplexity(model, heldout)
    stats = ev.exact_zero_activity(handle, model.cpu(), tokenizer, calib)
    model.to(device)
    return {"heldout_perplexity": round(ppl, 4),
            "mean_exact_zero_fraction": round(stats.mean_zero_fraction, 6),
            "per_layer_exact_zero_fraction": [round(float(x), 6) for x in stats.zero_fraction]}


def _batches(ids: torch.Tensor, cfg: RelufyConfig, gen: torch.Generator) -> Iterator[torch.Tensor]:
    while True:
        yield tr.random_windows(ids, cfg.batch, cfg.seq_len, gen)


def _save_checkpoint(work: Path, state: dict[str, Any]) -> None:
    tmp = work / (CHECKPOINT_FILE + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, work / CHECKPOINT_FILE)


def _open_work(out: Path, resume: bool, identity: dict[str, Any], progress: ProgressFn):
    """The work folder and, when resuming, its checkpoint (or None for a fresh start)."""
    work = partial_dir(out)
    ckpt = work / CHECKPOINT_FILE
    if out.exists():
        raise UsageError(f"{out} already exists; choose another output path or remove it.")
    if not resume:
        if work.exists():
            raise UsageError(f"{work} holds an interrupted run; rerun with --resume to continue "
                             "it, or delete that folder to start over.")
        work.mkdir(parents=True)
        return work, None
    if not ckpt.is_file():
        progress("phase", message=f"--resume: no checkpoint in {work}; starting from scratch")
        work.mkdir(parents=True, exist_ok=True)
        return work, None
    try:
        state = torch.load(ckpt, map_location="cpu", weights_only=True)
    except Exception as e:  # a torn or foreign file: say so, keep it for inspection
        raise InvalidModelError(f"{ckpt} cannot be read ({e.__class__.__name__}); delete "
                                f"{work} to start over.") from e
    what = {"config": "configuration", "source_sha256": "source model",
            "train_sha256": "training data", "calibration_sha256": "calibration set"}
    for key, value in identity.items():
        if state["identity"].get(key) != value:
            raise UsageError(f"The interrupted run in {work} used a different {what[key]}; rerun "
                             f"with the same model, data and options, or delete {work} to start over.")
    return work, state


def _train_tokens(tokenizer, train_data, seq_len: int) -> TokenSet:
    tokens = file_tokens(tokenizer, train_data) if train_data else pydoc_split(tokenizer, "train")
    if len(tokens.ids) <= seq_len:
        raise BadTextFileError(f"Training text {tokens.source} has {len(tokens.ids)} tokens; "
                               f"at least {seq_len + 1} are needed (or lower --seq-len).")
    return tokens


def _pick_device(device: str | None) -> torch.device:
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device not in DEVICES[1:]:  # DEVICES = ("auto", "cpu", "cuda")
        raise UsageError(f"Unknown device '{device}'; choose {' or '.join(DEVICES[1:])}.")
    if device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda was requested but torch sees no CUDA GPU.")
    return torch.device(device)


def _autocast_dtype(dev: torch.device) -> torch.dtype | None:
    """bf16 mixed precision on GPUs that support it; full fp32 on CPU."""
    return torch.bfloat16 if dev.type == "cuda" and torch.cuda.is_bf16_supported() else None


def run(model_spec: str, out: Path, cfg: RelufyConfig, *, train_data, device, resume: bool,
        checkpoint_every: int, eval_every: int, calibration_samples: int | None,
        progress: ProgressFn) -> tuple[dict, int | None]:
    dev = _pick_device(device)
    handle = resolve_model(model_spec)
    _check_source(handle)
    tokenizer = handle.load_tokenizer()
    train = _train_tokens(tokenizer, train_data, cfg.seq_len)
    heldout = pydoc_split(tokenizer, "heldout")
    calib = load_texts(limit=calibration_samples)
    identity = {"config": cfg.to_dict(), "source_sha256": source_sha256(handle),
                "train_sha256": train.sha256, "calibration_sha256": texts_sha256(calib)}
    work, state = _open_work(out, resume, identity, progress)

    torch.manual_seed(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    log: list[dict] = []
    curve: list[dict] = []
    if state is None:
        progress("phase", message="measuring the source model")
        original = handle.load_torch(dtype="float32")
        metrics = {"before": _measure(handle, original.to(dev), tokenizer, heldout, calib)}
        del original
    model, act_key = _load_swapped(handle, cfg.activation, dev)
    opt = tr.make_optimizer(model, cfg.lr, cfg.weight_decay)
    if state is None:
        progress("phase", message=f"measuring after the swap to {cfg.activation}")
        metrics["after_swap"] = _measure(handle, model, tokenizer, heldout, calib)
        first = 0
    else:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        gen.set_state(state["generator"])
        torch.set_rng_state(state["torch_rng"])
        metrics, log, curve, first = state["metrics"], state["log"], state["curve"], state["step"]
        progress("phase", message=f"resuming from step {first} of {cfg.steps}")

    saved = [first]

    def checkpoint(step: int) -> None:
        saved[0] = step
        _save_checkpoint(work, {"identity": identity, "step": step, "model": model.state_dict(),
                                "optimizer": opt.state_dict(), "generator": gen.get_state(),
                                "torch_rng": torch.get_rng_state(), "metrics": metrics,
                                "log": log, "curve": curve})

    if state is None and checkpoint_every:
        checkpoint(0)
    try:
        train_loop(model, opt, handle, cfg, dev, _batches(train.ids, cfg, gen), first, log, curve,
                   checkpoint if checkpoint_every else None, checkpoint_every, eval_every,
                   lambda: _measure(handle, model, tokenizer, heldout, calib), progress)
    except KeyboardInterrupt:
        if checkpoint_every:
            progress("phase", message=f"checkpoint of step {saved[0]} kept in {work}; "
                                      "rerun with --resume to continue")
        raise
    progress("phase", message="measuring the fine-tuned model")
    metrics["after"] = _measure(handle, model, tokenizer, heldout, calib)
    metrics["perplexity_ratio"] = round(metrics["after"]["heldout_perplexity"]
                                        / metrics["before"]["heldout_perplexity"], 4)
    provenance = _provenance(handle, cfg, act_key, identity, train, heldout, calib, metrics,
                             log, curve, dev)
    _write_output(handle, model.cpu(), tokenizer, out, provenance)
    shutil.rmtree(work, ignore_errors=True)
    return provenance, (first if state is not None else None)


def train_loop(model, opt, handle: ModelHandle, cfg: RelufyConfig, dev: torch.device, batches,
               first: int, log: list, curve: list, checkpoint, checkpoint_every: int,
               eval_every: int, measure, progress: ProgressFn) -> None:
    """Steps ``first`` … ``cfg.steps - 1`` in segments between checkpoints / evaluations."""
    downs = [model.get_submodule(handle.arch.block(i, handle.arch.ffn_down))
             for i in range(handle.facts.n_layers)]
    tap = tr.ActivationTap(downs)
    warmup = max(1, int(cfg.warmup_frac * cfg.steps))
    autocast = _autocast_dtype(dev)
    marks = sorted({s for every in (checkpoint_every, eval_every) if every
                    for s in range(every, cfg.steps, every) if s > first} | {cfg.steps})

    def on_step(s: tr.StepStats) -> None:
        if s.step % LOG_EVERY == 0 or s.step == cfg.steps - 1:
            log.append({"step": s.step + 1, "loss": round(s.loss, 5), "l1": round(s.l1, 6),
                        "lr": round(s.lr, 8), "batch_zero_fraction": round(s.zero_fraction, 5)})
        progress("step", stats=s, total=cfg.steps)

    try:
        start = first
        for stop in marks:
            tr.train_steps(model, opt, tap, batches, first=start, last=stop,
                           lr=lambda k: tr.lr_at(k, cfg.steps, cfg.lr, warmup, cfg.min_lr_frac),
                           l1=lambda k: tr.l1_at(k, cfg.steps, cfg.l1, cfg.l1_start, cfg.l1_full),
                           clip=cfg.clip, device=dev, autocast_dtype=autocast, on_step=on_step)
            start = stop
            if eval_every and stop % eval_every == 0 and stop < cfg.steps:
                tap.clear()
                point = {"step": stop, **measure()}
                curve.append(point)
                progress("eval", **point)
            if checkpoint is not None and stop < cfg.steps:
                checkpoint(stop)
    finally:
        tap.remove()


def _provenance(handle, cfg, act_key, identity, train, heldout, calib, metrics, log, curve, dev):
    import transformers

    return {
        "format_version": 1,
        "tool": "aios-convert relufy",
        "tool_version": __version__,
        "contract_version": CONTRACT_VERSION,
        "source": {"model": handle.spec, "name": handle.name, "architecture": handle.arch.name,
                   "activation": handle.facts.activation, "sha256": identity["source_sha256"]},
        "result": {"activation": cfg.activation, "config_key": act_key,
                   "applied_to": (f"gate projection ({handle.arch.ffn_gate or handle.arch.ffn_up}); "
                                  "the product act(gate)·up has exact zeros")
                   if handle.facts.gated_ffn else f"output of {handle.arch.ffn_up}"},
        "config": cfg.to_dict(),
        "data": {"train": train.describe(), "heldout": heldout.describe(),
                 "calibration": {"source": CALIBRATION_FILE.name, "texts_sha256": texts_sha256(calib),
                                 "samples": len(calib), "max_tokens": ev.R1_MAX_TOKENS}},
        "steps": cfg.steps,
        "metrics": metrics,
        "metric_notes": {"heldout_perplexity": "aios.fixtures.train protocol (see convert/evaluation.py)",
                         "mean_exact_zero_fraction": "aios.measure.ffn (the R1 checker's code)"},
        "training_log": log,
        "curve": curve,
        "runtime": {"device": dev.type, "autocast": str(_autocast_dtype(dev)).replace("torch.", "")
                    if _autocast_dtype(dev) else None,
                    "torch_version": torch.__version__,
                    "transformers_version": transformers.__version__},
    }


def _write_output(handle, model, tokenizer, out: Path, provenance: dict) -> None:
    """Build the folder next to ``out`` and rename it into place in one step."""
    src_dtype = handle.config.get("dtype") or handle.config.get("torch_dtype") or "float32"
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        model.to(getattr(torch, str(src_dtype), torch.float32))
        model.save_pretrained(tmp, safe_serialization=True)
        assert handle.path is not None
        for name in TOKENIZER_FILES:
            if (handle.path / name).is_file():
                shutil.copyfile(handle.path / name, tmp / name)
        if not (tmp / "tokenizer_config.json").exists():
            tokenizer.save_pretrained(tmp)
        write_atomic(tmp / PROVENANCE_FILE, json.dumps(provenance, indent=2) + "\n")
        for path in [tmp, *tmp.iterdir()]:  # mkdtemp/mkstemp create owner-only modes
            path.chmod(0o755 if path.is_dir() else 0o644)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


__all__ = ["partial_dir", "run", "source_sha256"]
