"""Trained aliasing (``aios-convert alias --train``): the R3 architecture itself.

The chosen layers' matrices of each shareable type are re-parameterized as
``W_i = W_c + δ_i`` (torch parametrizations, so stock transformers modules run unchanged):
``W_c`` is one parameter per group initialised from the group mean, ``δ_i`` starts at
``W_i − W_c`` — dense, or for ``lowrank:R`` as factors ``U_i V_i`` initialised from the
rank-R truncated SVD of ``W_i − W_c``. The whole model is then fine-tuned on the fixtures'
train split with ``L_task + λ(t) Σ_i ‖δ_i‖²_F`` (λ rises by a half-cosine from 0 to
``lam`` over the first ``lam_ramp`` of the steps, then stays; AdamW without weight decay,
warmup + cosine learning rate from ``convert/training.py``). The penalty alone does not
bound ‖δ_i‖/‖W_c‖, which R3 does (< 10 %), so by default each step ends with a projection
onto ‖δ_i‖ ≤ ρ(t)‖W_c‖, the radius shrinking by a half-cosine from each delta's initial
relative norm to ``max_rel_delta`` at ``shrink_until`` of the steps (projected gradient
descent; the deltas are rescaled, a low-rank one through both factors, identically on every
process of a distributed run). The fine-tune runs on ``convert/engine.py`` (one process, or DDP
under ``accelerate launch`` / ``torchrun``; ``batch`` is the global batch) and reads
``convert/train_data.py``'s windows. Afterwards the deltas are
stored in the requested encoding (``q8_0`` quantizes, ``none`` drops them) and the held-out
perplexity of exactly the stored model is measured against the independent-weight source.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch.nn.utils import parametrize

from aios.errors import UsageError
from aios.evaluation import pydoc_split
from aios.models import ModelHandle, resolve_model
from aios.models.from_gguf import hf_source
from convert import engine as eng
from convert import evaluation as ev
from convert import training as tr
from convert.alias import posthoc as A
from convert.alias.config import DELTA_NORMS
from convert.train_data import Prefetcher, RandomWindows, StreamedWindows


@dataclass(frozen=True)
class AliasTrainConfig:
    """Trained-aliasing config (versioned, embedded in the artifact)."""

    zones: str = "all"
    delta: str = "lowrank:8"
    types: tuple[str, ...] | None = None
    steps: int = 400
    lr: float = 1e-3
    batch: int = 16
    seq_len: int = 128
    lam: float = 1e-2  # final λ of λ Σ‖δ_i‖²
    lam_ramp: float = 0.3  # fraction of the steps over which λ rises from 0
    max_rel_delta: float | None = 0.09  # projection radius ‖δ_i‖ ≤ ρ‖W_c‖ reached at shrink_until (None: off)
    shrink_until: float = 0.6  # fraction of the steps at which the radius reaches max_rel_delta
    norm: str = "fro"  # projection norm: fro (the R3 criterion) or spectral (also bounds ‖δ‖₂/‖W_c‖₂)
    warmup: int = 20
    seed: int = 0
    version: int = 1


class _Member(torch.nn.Module):
    """Parametrization returning W_c + δ_i (the module's own stored weight is ignored)."""

    def __init__(self, canonical: torch.nn.Parameter, delta: torch.nn.ParameterList) -> None:
        super().__init__()
        self.canonical = canonical
        self.delta = delta  # [D] dense or [U, V] low-rank

    def delta_value(self) -> torch.Tensor:
        return self.delta[0] if len(self.delta) == 1 else self.delta[0] @ self.delta[1]

    @torch.no_grad()
    def rel_norm(self, norm: str = "fro") -> float:
        d, c = self.delta_value(), self.canonical
        if norm == "spectral":
            return float(torch.linalg.matrix_norm(d, ord=2) / torch.linalg.matrix_norm(c, ord=2).clamp_min(1e-30))
        return float(d.norm() / c.norm().clamp_min(1e-30))

    @torch.no_grad()
    def project(self, radius: float, norm: str = "fro") -> None:
        """Rescale δ so that ‖δ‖ ≤ radius·‖W_c‖ (Frobenius or spectral)."""
        rel = self.rel_norm(norm)
        if rel > radius:
            c = radius / rel
            for p in self.delta:
                p.mul_(c ** (1 / len(self.delta)))

    def delta_sq(self) -> torch.Tensor:
        if len(self.delta) == 1:
            return self.delta[0].pow(2).sum()
        U, V = self.delta
        return ((U.T @ U) * (V @ V.T)).sum()  # ‖U V‖²_F without forming U V

    def forward(self, _stored: torch.Tensor) -> torch.Tensor:
        return self.canonical + self.delta_value()


def reparameterize(tm: torch.nn.Module, handle: ModelHandle, types: list[str], layers: list[int],
                   encoding: str, rank: int | None) -> dict[str, list[tuple[int, _Member]]]:
    """Install W_c + δ_i on ``layers`` for each type; returns type -> [(layer, member)]."""
    out: dict[str, list[tuple[int, _Member]]] = {}
    for rel in types:
        mods = {i: tm.get_submodule(handle.arch.block(i, rel).rsplit(".", 1)[0]) for i in layers}
        W = {i: mods[i].weight.detach().clone() for i in layers}
        canon = torch.nn.Parameter(torch.stack(list(W.values())).mean(0))
        members = []
        for i in layers:
            d = W[i] - canon.detach()
            if encoding == "lowrank":
                U, S, Vh = torch.linalg.svd(d.double(), full_matrices=False)
                r = min(rank or 1, len(S))
                s = S[:r].sqrt()
                parts = [(U[:, :r] * s).float(), (s[:, None] * Vh[:r]).float()]
            else:  # dense, q8_0 and none train a dense delta
                parts = [d]
            m = _Member(canon, torch.nn.ParameterList([torch.nn.Parameter(p.contiguous()) for p in parts]))
            mods[i].weight.requires_grad_(False)
            parametrize.register_parametrization(mods[i], "weight", m, unsafe=True)
            members.append((i, m))
        out[rel] = members
    return out


def train_alias(model: str | ModelHandle, out: str | Path, cfg: AliasTrainConfig, *, outtype: str = "f32",
                gguf=None, dealias=None, progress: A.ProgressFn | None = None,
                device: str | None = None, train_data: str | Path | None = None,
                micro_batch: int | None = None, checkpoint_every: int = 0,
                resume: bool = False) -> A.AliasResult | None:
    """Trained aliasing; runs on the fine-tune engine (``convert/engine.py``): one process, or
    DDP under ``accelerate launch`` / ``torchrun``. Rank 0 writes ``out`` and returns the
    result; the other processes return None. ``checkpoint_every`` > 0 keeps the state in
    ``OUT.partial/`` (as relufy does); ``resume`` continues from it to the same weights."""
    encoding, rank = A.parse_delta(cfg.delta)
    if cfg.norm not in DELTA_NORMS:
        raise UsageError(f"norm must be {' or '.join(DELTA_NORMS)}, not '{cfg.norm}'.")
    if cfg.steps < 1 or cfg.batch < 1 or cfg.seq_len < 2 or cfg.lr <= 0 or cfg.lam < 0:
        raise UsageError("--steps, --batch must be ≥ 1, --seq-len ≥ 2, --lr > 0 and --lam ≥ 0.")
    out = Path(out)
    A.check_output(out)
    work = out.with_name(out.name + ".partial")
    if not resume and work.exists():
        raise UsageError(f"{work} holds an interrupted run; rerun with --resume to continue it, "
                         "or delete that folder to start over.")
    ckpt = eng.latest_checkpoint(work) if resume else None
    handle = hf_source(model if isinstance(model, ModelHandle) else resolve_model(str(model)))
    A.check_source(handle)
    dist = eng.start(device)
    if dist.strategy == "FSDP":
        raise UsageError("alias --train keeps each group's canonical whole on every process "
                         "(its projection step needs the full deltas): run it with DDP, not FSDP.")
    per_rank, accum, _micro = eng.batch_plan(cfg.batch, dist.world, micro_batch)
    say = (progress or (lambda _m: None)) if dist.is_main else (lambda _m: None)
    f = handle.facts
    layers = A.zone_layers(cfg.zones, f.n_layers, f.core_zone)
    if len(layers) < 2:
        raise UsageError("--zones must cover at least two layers to share a canonical.")
    post = A.AliasConfig(zones=cfg.zones, delta=cfg.delta, types=cfg.types, min_cosine=0.0,
                         require_bytes_saved=False)
    types = A.selected_types(handle, post)
    torch.manual_seed(cfg.seed)
    tm = handle.load_torch(dtype="float32")
    tok = handle.load_tokenizer()
    heldout = pydoc_split(tok, "heldout")
    if train_data is None:
        source = RandomWindows(pydoc_split(tok, "train"), cfg.seq_len, cfg.seed, dist.rank, dist.world)
    else:
        source = StreamedWindows(train_data, tok, cfg.seq_len, cfg.seed, dist.rank, dist.world)
    identity = json.loads(json.dumps({"config": asdict(cfg), "source": handle.spec,
                                      "train": {k: v for k, v in source.describe().items()
                                                if k in ("source", "texts_sha256", "fingerprint")}}))
    state = eng.read_run_state(ckpt) if ckpt is not None else None
    if state is not None and (state["identity"] != identity or state["world_size"] != dist.world):
        raise UsageError(f"The interrupted run in {work} used other options, data or process "
                         f"count; rerun it as it was started, or delete {work} to start over.")
    if state is None:
        base_ppl = ev.heldout_perplexity(tm, heldout)
        say(f"held-out perplexity of the source: {base_ppl:.3f}")
    groups = reparameterize(tm, handle, types, layers, encoding, rank)
    members = [m for ms in groups.values() for _, m in ms]
    if state is None:
        init_ppl = ev.heldout_perplexity(tm, heldout)
        say(f"after re-parameterization (deltas {'truncated to rank ' + str(rank) if rank else 'exact'}): {init_ppl:.3f}")
        with torch.no_grad():
            rel0 = [m.rel_norm(cfg.norm) for m in members]
    else:
        base_ppl, init_ppl, rel0 = state["base_ppl"], state["init_ppl"], state["rel0"]

    def adamw(m: torch.nn.Module) -> torch.optim.AdamW:
        params = [p for p in m.parameters() if p.requires_grad]
        return torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0,
                                 fused=dist.device.type == "cuda")

    model, opt = eng.prepare(dist, tm, adamw)
    first, log = 0, []
    if state is not None:
        source.load_state_dict(eng.load_checkpoint(dist, ckpt))
        first, log = state["step"], state["log"]
        say(f"resuming from step {first} of {cfg.steps}")
    elif dist.is_main and checkpoint_every:
        work.mkdir(parents=True, exist_ok=True)
    lam_now = [0.0]

    def loss_fn(m, x):
        loss = m(input_ids=x, labels=x).loss
        sq = torch.stack([mb.delta_sq() for mb in members]).sum() if members else loss.new_zeros(())
        return loss, lam_now[0] * sq, [float(sq.detach())]

    t0 = time.perf_counter()
    feed = Prefetcher(source, per_rank, first, cfg.steps, checkpoint_every)
    try:
        for step in range(first, cfg.steps):
            eng.fault_point(dist.rank, step)
            windows, snapshot = feed.get(step)
            lam_now[0] = tr.l1_at(step, cfg.steps, cfg.lam, 0.0, cfg.lam_ramp)
            lr = tr.lr_at(step, cfg.steps, cfg.lr, cfg.warmup, 0.1)
            r = eng.optimizer_step(dist, model, opt, windows, accum, lr, loss_fn, 1.0)
            if cfg.max_rel_delta is not None:  # identical on every rank: replicas stay equal
                s = tr.l1_at(step, cfg.steps, 1.0, 0.0, cfg.shrink_until)  # 0 -> 1 half-cosine
                for m, r0 in zip(members, rel0):
                    m.project(cfg.max_rel_delta + (max(r0, cfg.max_rel_delta) - cfg.max_rel_delta) * (1 - s), cfg.norm)
            if step % 25 == 0 or step == cfg.steps - 1:
                rel = _max_rel(groups)
                sq = r.stats[0] if r.stats else 0.0
                log.append({"step": step, "loss": round(r.loss, 4), "lam": lam_now[0],
                            "delta_sq": round(sq, 4), "max_rel_delta": round(rel, 4)})  # no wall times: same input + seed -> same bytes
                say(f"step {step}: loss {r.loss:.3f}, λ {lam_now[0]:.2e}, max ‖δ‖/‖W_c‖ {rel:.3f}")
            if checkpoint_every and (step + 1) % checkpoint_every == 0 and step + 1 < cfg.steps:
                eng.save_checkpoint(dist, work, step + 1,
                                    {"identity": identity, "step": step + 1, "log": log,
                                     "base_ppl": base_ppl, "init_ppl": init_ppl, "rel0": rel0},
                                    snapshot)
    finally:
        feed.close()
    seconds = time.perf_counter() - t0
    tm = dist.acc.unwrap_model(model).cpu()
    tm.eval()
    if not dist.is_main:
        dist.barrier()
        return None
    built = _freeze(tm, handle, groups, encoding, rank)
    ppl = ev.heldout_perplexity(tm, heldout)
    say(f"held-out perplexity of the stored aliased model: {ppl:.3f} (source {base_ppl:.3f})")
    weights = {k: v.detach().clone() for k, v in tm.state_dict().items()}
    report = {"command": "aios-convert alias --train", "mode": "trained", "config": asdict(cfg),
              "heldout": heldout.describe(), "train": source.describe(),
              "training": {"world_size": dist.world, "strategy": dist.strategy,
                           "precision": dist.precision, "gradient_accumulation": accum,
                           "tokens_seen": cfg.steps * cfg.batch * cfg.seq_len},
              "source_heldout_perplexity": round(base_ppl, 4), "reparameterized_heldout_perplexity": round(init_ppl, 4),
              "heldout_perplexity": round(ppl, 4), "perplexity_delta": round(ppl - base_ppl, 4),
              "zone_thresholds": "not applied: trained aliasing imposes the structure on the chosen layers",
              "training_log": log}
    try:
        A.write_folder(handle, out, built, report, state=weights)
        result = A.finish_exports(out, report, post, outtype=outtype, gguf=gguf, dealias=dealias)
        shutil.rmtree(work, ignore_errors=True)
    finally:
        dist.barrier()
    result.notes.append(f"fine-tuned {cfg.steps - first} steps in {seconds:.0f} s on {dist.world} "
                        f"process{'es' if dist.world > 1 else ''} ({dist.device.type}, {dist.precision})")
    return result


@torch.no_grad()
def _max_rel(groups) -> float:
    rel = 0.0
    for ms in groups.values():
        for _, m in ms:
            rel = max(rel, float(m.delta_value().norm() / m.canonical.norm()))
    return rel


@torch.no_grad()
def _freeze(tm: torch.nn.Module, handle: ModelHandle, groups, encoding: str, rank: int | None) -> list[A.BuiltGroup]:
    """Store the trained structure in ``encoding`` and put exactly the stored W_i into ``tm``."""
    built = []
    for rel, ms in groups.items():
        canon = ms[0][1].canonical.detach().numpy().astype(np.float32)
        W = {i: (m.canonical + m.delta_value()).detach().numpy().astype(np.float32) for i, m in ms}
        names = {i: handle.arch.block(i, rel) for i, _ in ms}
        bg = A.build_group(rel, W, canon, names, encoding, rank, "mean")
        for i, _ in ms:
            mod = tm.get_submodule(names[i].rsplit(".", 1)[0])
            parametrize.remove_parametrizations(mod, "weight", leave_parametrized=False)
            mod.weight.copy_(torch.from_numpy(bg.approx[i]))
        built.append(bg)
    return built
