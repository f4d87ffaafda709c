"""The relufy run: validation, model and data loading, the work folder, measurement, output.

Orchestration only; the optimisation math is in ``convert/training.py``, the distributed
engine (accelerate, micro-batches, checkpoints) in ``convert/engine.py``, the data in
``convert/train_data.py``, and the public entry point and config in ``convert/relufy.py``
(read its docstring first). Every process runs this same code; rank 0 alone reports progress
and writes the output.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from aios import CONTRACT_VERSION, __version__
from aios.data import CALIBRATION_FILE, load_texts, texts_sha256
from aios.errors import (
    InvalidModelError,
    ModelNotFoundError,
    UnsupportedArchitectureError,
    UsageError,
)
from aios.evaluation import TokenSet, file_tokens, pydoc_split
from aios.io import hash_file, sha256_file, write_atomic
from aios.models import ModelHandle, ffn_cut, resolve_model
from aios.models.from_gguf import gguf_source_of, hf_source
from convert import engine as eng
from convert import evaluation as ev
from convert import training as tr
from convert.relufication.config import PROVENANCE_FILE, ProgressFn, RelufyConfig
from convert.sparsify.calibrate import bos_prefix
from convert.train_data import Prefetcher, RandomWindows, StreamedWindows, WindowSource

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


def _init_cut(spec: str | Path | None, handle: ModelHandle) -> tuple[list[float] | None, dict | None]:
    """The cut the fine-tune trains with: ``--init-thresholds`` (a sparsified GGUF of this model,
    or an HF folder with ``aios_ffn_threshold``), else the source's own, else none; and its record
    for the provenance."""
    n = handle.facts.n_layers
    if spec is None:
        values = ffn_cut.from_config(handle.config, n)
        return values, ({"from": "the source's config.json", "site": ffn_cut.SITE, "values": values}
                        if values is not None else None)
    path = Path(spec).expanduser()
    if not path.exists():
        raise ModelNotFoundError(f"--init-thresholds: {path} does not exist.")
    if path.is_dir():
        cfg = path / "config.json"
        values = (ffn_cut.from_config(json.loads(cfg.read_text()), n, str(cfg))
                  if cfg.is_file() else None)
        if values is None:
            raise InvalidModelError(f"--init-thresholds: {path} has no '{ffn_cut.CONFIG_KEY}' in a "
                                    "config.json; pass a GGUF written by `aios-convert sparsify`.")
        digest = sha256_file(cfg)
    else:
        from aios.models.tensors import GGUFStore

        values = ffn_cut.from_gguf(GGUFStore(path), n, str(path))
        digest = sha256_file(path)
    return values, {"from": path.name, "sha256": digest, "site": ffn_cut.SITE, "values": values}


def _measure(handle, model, tokenizer, heldout: TokenSet, calib: list[str]) -> dict[str, Any]:
    """Held-out perplexity and R1's exact zeros, on the model's own device."""
    was_training = model.training
    model.eval()
    ppl = ev.heldout_perplexity(model, heldout, bos_prefix(tokenizer))
    stats = ev.exact_zero_activity(handle, model, tokenizer, calib)
    model.train(was_training)
    return {"heldout_perplexity": round(ppl, 4),
            "mean_exact_zero_fraction": round(stats.mean_zero_fraction, 6),
            "per_layer_exact_zero_fraction": [round(float(x), 6) for x in stats.zero_fraction]}


def _check_work(out: Path, resume: bool) -> Path | None:
    """The checkpoint to resume from (None: fresh start); refuses what would lose work."""
    work = partial_dir(out)
    if out.exists():
        raise UsageError(f"{out} already exists; choose another output path or remove it.")
    if not resume and work.exists():
        raise UsageError(f"{work} holds an interrupted run; rerun with --resume to continue "
                         "it, or delete that folder to start over.")
    return eng.latest_checkpoint(work) if resume else None


def _check_identity(ckpt: Path, state: dict, identity: dict[str, Any], world: int) -> None:
    what = {"config": "config", "source_sha256": "source model", "train": "training data",
            "calibration_sha256": "calibration set", "heldout_sha256": "held-out text",
            "init_thresholds": "--init-thresholds cut"}
    for key, value in identity.items():
        if state["identity"].get(key) != value:
            raise UsageError(f"The interrupted run in {ckpt.parent} used a different {what[key]}; "
                             f"rerun with the same model, data and options, or delete "
                             f"{ckpt.parent} to start over.")
    if state["world_size"] != world:
        raise UsageError(f"The interrupted run in {ckpt.parent} ran on {state['world_size']} "
                         f"processes; resume it with {state['world_size']} (this is {world}).")


def _source(tokenizer, train_data, cfg: RelufyConfig, dist: eng.Dist) -> WindowSource:
    """The run's data; a streamed corpus is probed for its first window by a throwaway reader,
    so unreadable or too-short data is refused before any work folder exists."""
    prefix = bos_prefix(tokenizer)  # Gemma/Llama: every window starts with BOS, as in use
    if train_data is None:
        return ev.PrefixedWindows(RandomWindows(pydoc_split(tokenizer, "train"), cfg.seq_len, cfg.seed,
                                                dist.rank, dist.world), prefix)
    StreamedWindows(train_data, tokenizer, cfg.seq_len, cfg.seed, dist.rank, dist.world,
                    shuffle_windows=1).next_batch(1)
    return ev.PrefixedWindows(StreamedWindows(train_data, tokenizer, cfg.seq_len, cfg.seed, dist.rank,
                                              dist.world), prefix)


def _train_identity(source: WindowSource) -> dict[str, Any]:
    d = source.describe()
    return {k: d[k] for k in ("source", "texts_sha256", "fingerprint") if k in d}


def run(model_spec: str, out: Path, cfg: RelufyConfig, *, train_data, device, resume: bool,
        checkpoint_every: int, eval_every: int, calibration_samples: int | None,
        progress: ProgressFn, micro_batch: int | None = None, heldout_data=None,
        gradient_checkpointing: bool = False, token_budget: int | None = None,
        init_thresholds: str | Path | None = None) -> tuple[dict, int | None, bool]:
    dist = eng.start(device)
    if not dist.is_main:  # one progress display: rank 0's
        progress = _quiet
    per_rank, accum, micro = eng.batch_plan(cfg.batch, dist.world, micro_batch)
    handle = resolve_model(model_spec)
    if handle.kind == "gguf" and handle.has_weights:  # a llama.cpp file: its dequantized HF twin, made once
        if dist.is_main:
            hf_source(handle, lambda m: progress("phase", message=m))
        dist.barrier()
        handle = hf_source(handle)
    _check_source(handle)
    cut, cut_record = _init_cut(init_thresholds, handle)
    tokenizer = handle.load_tokenizer()
    source = _source(tokenizer, train_data, cfg, dist)
    heldout = file_tokens(tokenizer, heldout_data) if heldout_data else pydoc_split(tokenizer, "heldout")
    calib = load_texts(limit=calibration_samples)
    identity = {"config": cfg.to_dict(), "source_sha256": source_sha256(handle),
                "train": _train_identity(source), "calibration_sha256": texts_sha256(calib),
                "heldout_sha256": heldout.sha256,
                "init_thresholds": hashlib.sha256(json.dumps(cut).encode()).hexdigest() if cut else None}
    ckpt = _check_work(out, resume)
    work = partial_dir(out)
    state = None
    if ckpt is not None:
        state = eng.read_run_state(ckpt)
        _check_identity(ckpt, state, identity, dist.world)
    elif resume:
        progress("phase", message=f"--resume: no checkpoint in {work}; starting from scratch")
    dist.barrier()
    if dist.is_main:
        work.mkdir(parents=True, exist_ok=True)

    torch.manual_seed(cfg.seed)
    if state is None:
        progress("phase", message=f"measuring the source model on {dist.device.type}")
        original = handle.load_torch(dtype="float32").to(dist.device)
        metrics = {"before": _measure(handle, original, tokenizer, heldout, calib)}
        del original
    model, act_key = _load_swapped(handle, cfg.activation, torch.device("cpu"))
    down_names = [handle.arch.block(i, handle.arch.ffn_down) for i in range(handle.facts.n_layers)]
    if cut is not None:  # trained with its cut in place from step 0 (before the L1 tap sees it)
        ffn_cut.install(model, down_names, cut)
        setattr(model.config, ffn_cut.CONFIG_KEY, ffn_cut.config_entry(cut, cut_record["from"]))
        progress("phase", message=f"warm start: the fine-tune runs with {len(cut)} calibrated "
                                  f"down-projection cuts ({cut_record['from']}); {ffn_cut.TRANSFORMERS_NOTE}")
    blends = _anneal_modules(handle, model, cfg) if cut is not None else []
    if blends:
        span = math.ceil(cfg.anneal * cfg.steps)
        cut_record.update(anneal_steps=span, start=f"{handle.facts.activation} with the cut (the "
                          f"sparsified model), moving linearly to {cfg.activation} by step {span}")
    downs = [model.get_submodule(name) for name in down_names]
    flops = eng.flops_per_token(model, handle.facts.n_layers, handle.facts.d_model, cfg.seq_len)
    model, opt = eng.prepare(dist, model, lambda m: eng.make_optimizer(m, cfg.lr, cfg.weight_decay,
                                                                      dist.device),
                             gradient_checkpointing)
    plain = dist.acc.unwrap_model(model)
    if state is None:
        progress("phase", message=f"measuring after the swap to {cfg.activation}" if not blends else
                 f"measuring the warm start ({handle.facts.activation} with the cut; it becomes "
                 f"{cfg.activation} by step {cut_record['anneal_steps']})")
        metrics["after_swap"] = _measure(handle, plain, tokenizer, heldout, calib)
        run_state = {"identity": identity, "step": 0, "metrics": metrics, "log": [], "curve": [],
                     "density": None, "tokens_seen": 0}
    else:
        source.load_state_dict(eng.load_checkpoint(dist, ckpt))
        run_state = state
        progress("phase", message=f"resuming from step {state['step']} of {cfg.steps}")
    first = run_state["step"]

    if state is None and checkpoint_every:
        eng.save_checkpoint(dist, work, 0, run_state, source.state_dict())
    progress("phase", message=_describe_run(dist, cfg, per_rank, accum, micro))
    throughput = train_loop(model, opt, downs, cfg, dist, source, run_state, per_rank, accum,
                            checkpoint_every, eval_every, flops,
                            lambda: _measure(handle, plain, tokenizer, heldout, calib),
                            lambda: source.state_dict(), work, progress,
                            on_step=lambda step: _set_anneal(blends, step, cfg))
    for parent, name, blend in blends:  # the saved model runs the new activation alone
        setattr(parent, name, blend.new)
    metrics = run_state["metrics"]
    progress("phase", message="measuring the fine-tuned model")
    metrics["after"] = _measure(handle, plain, tokenizer, heldout, calib)
    metrics["perplexity_ratio"] = round(metrics["after"]["heldout_perplexity"]
                                        / metrics["before"]["heldout_perplexity"], 4)
    training = {"world_size": dist.world, "strategy": dist.strategy, "backend": dist.backend,
                "precision": dist.precision, "global_batch_windows": cfg.batch,
                "global_batch_tokens": cfg.batch * cfg.seq_len, "micro_batch": micro,
                "gradient_accumulation": accum, "gradient_checkpointing": gradient_checkpointing,
                "tokens_seen": run_state["tokens_seen"], "token_budget": token_budget}
    provenance = _provenance(handle, cfg, act_key, identity, source, heldout, calib, metrics,
                             run_state["log"], run_state["curve"], dist, training, throughput)
    if cut_record is not None:
        provenance["result"]["ffn_threshold"] = {**cut_record, "note": ffn_cut.TRANSFORMERS_NOTE}
    weights = eng.full_state_dict(dist, model)  # every rank: a collective under FSDP
    if dist.is_main:
        _write_output(handle, plain, weights, tokenizer, out, provenance)
        shutil.rmtree(work, ignore_errors=True)
    dist.barrier()
    return provenance, (first if state is not None else None), dist.is_main


def _quiet(_event: str, **_info: Any) -> None:
    pass


def _describe_run(dist: eng.Dist, cfg: RelufyConfig, per_rank: int, accum: int, micro: int) -> str:
    where = (f"{dist.world} processes ({dist.strategy}, {dist.backend})" if dist.world > 1
             else f"1 process on {dist.device.type}")
    if os.environ.get("ACCELERATE_USE_FSDP", "").lower() in ("1", "true") and dist.strategy != "FSDP":
        where += " (FSDP was requested, but accelerate runs it on CUDA GPUs only: DDP here)"
    return (f"fine-tune on {where}, precision {dist.precision}: global batch {cfg.batch} × "
            f"{cfg.seq_len} tokens = {per_rank} windows per process in {accum} micro-batch"
            f"{'es' if accum > 1 else ''} of {micro}")


def _anneal_modules(handle: ModelHandle, model, cfg: RelufyConfig) -> list:
    """Each block's activation module replaced by an :class:`ActivationAnneal` from the source's
    activation to the swapped one (α = 0 at first); [(parent, attribute, module)]. Empty when
    ``cfg.anneal`` is 0 or transformers has no module for the source's activation."""
    from transformers.activations import ACT2FN

    if cfg.anneal <= 0 or handle.facts.activation not in ACT2FN:
        return []
    out = []
    for i in range(handle.facts.n_layers):
        path = handle.arch.block(i, handle.arch.ffn_act_module)
        owner, _, name = path.rpartition(".")
        parent = model.get_submodule(owner)
        blend = tr.ActivationAnneal(ACT2FN[handle.facts.activation], getattr(parent, name))
        setattr(parent, name, blend)
        out.append((parent, name, blend))
    return out


def _set_anneal(blends: list, step: int, cfg: RelufyConfig) -> None:
    for _parent, _name, blend in blends:
        blend.alpha = tr.anneal_at(step, cfg.steps, cfg.anneal)


def train_loop(model, opt, downs, cfg: RelufyConfig, dist: eng.Dist, source: WindowSource,
               run_state: dict, per_rank: int, accum: int, checkpoint_every: int,
               eval_every: int, flops: float, measure, data_state, work: Path,
               progress: ProgressFn, on_step=None) -> dict[str, Any]:
    """Steps ``run_state['step']`` … ``cfg.steps - 1``; checkpoints and evaluations between.
    ``on_step(step)`` runs before each step's forward passes (the warm start's activation
    schedule)."""
    tap = tr.ActivationTap(downs)
    warmup = max(1, int(cfg.warmup_frac * cfg.steps))
    first = run_state["step"]
    feed = Prefetcher(source, per_rank, first, cfg.steps, checkpoint_every)
    peak = eng.peak_flops(dist.device)
    tokens_step = cfg.batch * cfg.seq_len
    busy = 0.0  # this process's seconds inside optimisation steps
    lam_now = [0.0]

    def loss_fn(m, x):
        out = m(input_ids=x, labels=x)
        lam = lam_now[0]
        pen = lam * tap.l1_penalty(run_state["density"]) if lam > 0 else out.loss.new_zeros(())
        dens = tap.density()
        tap.clear()
        return out.loss, pen, dens

    try:
        for step in range(first, cfg.steps):
            eng.fault_point(dist.rank, step)
            windows, snapshot = feed.get(step)
            if on_step is not None:
                on_step(step)
            lam_now[0] = tr.l1_at(step, cfg.steps, cfg.l1, cfg.l1_start, cfg.l1_full)
            lr = tr.lr_at(step, cfg.steps, cfg.lr, warmup, cfg.min_lr_frac)
            r = eng.optimizer_step(dist, model, opt, windows, accum, lr, loss_fn, cfg.clip)
            busy += r.seconds
            run_state["density"] = r.stats
            run_state["tokens_seen"] += tokens_step
            run_state["step"] = step + 1
            zero = 1.0 - sum(r.stats) / max(1, len(r.stats))
            stats = tr.StepStats(step, r.loss, r.extra, lam_now[0], lr, zero)
            if step % LOG_EVERY == 0 or step == cfg.steps - 1:
                run_state["log"].append({"step": step + 1, "loss": round(r.loss, 5),
                                         "l1": round(lam_now[0], 6), "lr": round(lr, 8),
                                         "batch_zero_fraction": round(zero, 5)})
            rate = tokens_step / r.seconds
            progress("step", stats=stats, total=cfg.steps, tokens_per_second=rate,
                     mfu=rate * flops / peak if peak else None)
            done = step + 1
            if eval_every and done % eval_every == 0 and done < cfg.steps:
                tap.clear()
                point = {"step": done, **measure()}
                run_state["curve"].append(point)
                progress("eval", **point)
            if checkpoint_every and done % checkpoint_every == 0 and done < cfg.steps:
                assert snapshot is not None
                eng.save_checkpoint(dist, work, done, run_state, snapshot)
    except KeyboardInterrupt:
        saved = eng.latest_checkpoint(work)
        if saved is not None:
            progress("phase", message=f"{saved.name} kept in {work}; rerun with --resume to "
                                      "continue")
        raise
    finally:
        feed.close()
        tap.remove()
    steps = cfg.steps - first
    per_rank_rate = dist.gather(steps * tokens_step / dist.world / busy if busy else 0.0)
    total = sum(per_rank_rate)
    return {"steps_timed": steps, "tokens_per_second": round(total, 1),
            "per_rank_tokens_per_second": [round(x, 1) for x in per_rank_rate],
            "flops_per_token": flops, "peak_flops": peak,
            "mfu": round(total * flops / (peak * dist.world), 4) if peak else None,
            "note": "wall time of the optimisation steps of this invocation (measurement passes "
                    "and checkpoints excluded); varies run to run"}


def _provenance(handle, cfg, act_key, identity, source, heldout, calib, metrics, log, curve,
                dist: eng.Dist, training: dict, throughput: dict):
    import accelerate
    import transformers

    return {
        "format_version": 1,
        "tool": "aios-convert relufy",
        "tool_version": __version__,
        "contract_version": CONTRACT_VERSION,
        "source": {"model": handle.spec, "name": handle.name, "architecture": handle.arch.name,
                   "activation": handle.facts.activation, "sha256": identity["source_sha256"],
                   **({"gguf": g} if (g := gguf_source_of(handle.path)) else {})},
        "result": {"activation": cfg.activation, "config_key": act_key,
                   "applied_to": (f"gate projection ({handle.arch.ffn_gate or handle.arch.ffn_up}); "
                                  "the product act(gate)·up has exact zeros")
                   if handle.facts.gated_ffn else f"output of {handle.arch.ffn_up}"},
        "config": cfg.to_dict(),
        "data": {"train": source.describe(), "heldout": heldout.describe(),
                 "calibration": {"source": CALIBRATION_FILE.name, "texts_sha256": texts_sha256(calib),
                                 "samples": len(calib), "max_tokens": ev.R1_MAX_TOKENS}},
        "steps": cfg.steps,
        "metrics": metrics,
        "metric_notes": {"heldout_perplexity": "aios.fixtures.train protocol (see convert/evaluation.py)",
                         "mean_exact_zero_fraction": "aios.measure.ffn (the R1 checker's code)"},
        "training_log": log,
        "curve": curve,
        "training": training,
        "runtime": {"device": dist.device.type,
                    "autocast": None if dist.precision == "fp32" else dist.precision,
                    "torch_version": torch.__version__,
                    "transformers_version": transformers.__version__,
                    "accelerate_version": accelerate.__version__},
        "throughput": throughput,
    }


def _write_output(handle, model, weights: dict, tokenizer, out: Path, provenance: dict) -> None:
    """Build the folder next to ``out`` and rename it into place in one step."""
    src_dtype = handle.config.get("dtype") or handle.config.get("torch_dtype") or "float32"
    dtype = getattr(torch, str(src_dtype), torch.float32)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # "Writing model shards" would follow the result table
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        weights = {k: v.detach().to("cpu", dtype if v.is_floating_point() else v.dtype)
                   for k, v in weights.items()}
        model.save_pretrained(tmp, state_dict=weights, safe_serialization=True)
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
