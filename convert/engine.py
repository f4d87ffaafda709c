"""The training engine of the fine-tunes (relufy, trained alias), on top of ``accelerate``.

The same code runs on one CPU, one GPU, several GPUs (DDP; FSDP from an accelerate config)
and several nodes: started plainly it is one process; started by ``accelerate launch`` or
``torchrun`` it joins their process group (gloo on CPUs, NCCL on GPUs). Nothing here knows
about relufy or aliasing: they hand it a model, a loss and their data source.

* **Global batch.** A step consumes ``global_windows`` windows of ``seq_len`` tokens over all
  processes; each process runs ``accum`` micro-batches of ``micro`` windows
  (``global_windows = world × accum × micro``). Gradients of all but the last micro-batch
  skip DDP's all-reduce (``no_sync``), losses are divided by ``accum``, DDP averages over
  ranks: the update is the gradient of the mean micro-batch loss over the global batch, the
  same for any split of it into processes and micro-batches (up to float summation order).
* **Precision.** bf16 autocast on GPUs that support it (accelerate's ``mixed_precision``;
  ``accelerate launch --mixed_precision`` overrides), fp32 on CPUs. Fused AdamW on CUDA.
* **Clipping** by the global gradient norm (``accelerator.clip_grad_norm_``, correct under
  FSDP's sharded gradients).
* **Checkpoints** (``save_checkpoint``): ``accelerator.save_state`` (model and optimizer,
  sharded under FSDP; the RNG state of every rank) into ``checkpoint-STEP/`` plus one data
  state file per rank and the run state from rank 0, then rank 0 points ``latest`` at it
  (atomic rename) and removes the older one. A crash while writing leaves ``latest`` on the
  previous complete checkpoint. The work folder must be on a file system all nodes share.
* **Faults.** ``AIOS_FAULT_KILL=RANK:STEP`` makes that rank SIGKILL itself before that step:
  how the tests prove that a crash of one rank loses nothing but the steps since the last
  checkpoint. It has no other use.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import signal
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from aios.errors import InvalidModelError, UsageError
from aios.io import write_atomic

POINTER = "latest"
RUN_STATE = "aios_state.pt"
FAULT_ENV = "AIOS_FAULT_KILL"

# Dense bf16 tensor-core peaks (FLOP/s) by device-name fragment, for the MFU estimate.
# Vendor data sheets, without sparsity; an unknown device reports no MFU unless
# AIOS_PEAK_TFLOPS gives its peak.
GPU_BF16_PEAK = {"H200": 989e12, "H100 PCIe": 756e12, "H100": 989e12, "GH200": 989e12,
                 "A100": 312e12, "L40S": 362e12, "L40": 181e12, "L4": 121e12, "A10G": 70e12,
                 "A10": 125e12, "RTX 4090": 165e12, "MI300X": 1307e12}


@dataclass
class Dist:
    """This process's place in the run (one process when not launched)."""

    acc: Any  # accelerate.Accelerator

    @property
    def rank(self) -> int:
        return self.acc.process_index

    @property
    def world(self) -> int:
        return self.acc.num_processes

    @property
    def is_main(self) -> bool:
        return self.acc.is_main_process

    @property
    def device(self) -> torch.device:
        return self.acc.device

    @property
    def precision(self) -> str:
        """bf16 / fp16 (autocast over fp32 master weights) or fp32."""
        mp = str(self.acc.mixed_precision)
        return "fp32" if mp == "no" else mp

    @property
    def backend(self) -> str | None:
        return self.acc.state.backend if self.world > 1 else None

    @property
    def strategy(self) -> str:
        """accelerate's distributed type (MULTI_CPU, MULTI_GPU, FSDP, ...) or "single"."""
        kind = str(self.acc.distributed_type).split(".")[-1]
        return "single" if kind == "NO" else kind

    def barrier(self) -> None:
        self.acc.wait_for_everyone()

    def mean(self, values: list[float]) -> list[float]:
        """Mean of each value over all processes (identity on one process)."""
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        if self.world > 1:
            t = self.acc.reduce(t, reduction="mean")
        return [float(x) for x in t.cpu()]

    def gather(self, value: float) -> list[float]:
        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        return [float(x) for x in (self.acc.gather(t) if self.world > 1 else t).cpu()]


def start(device: str | None) -> Dist:
    """The accelerator for ``device`` (auto / cpu / cuda); joins a launcher's process group."""
    from accelerate import Accelerator

    if device not in (None, "auto", "cpu", "cuda"):
        raise UsageError(f"Unknown device '{device}'; choose auto, cpu or cuda.")
    has_cuda = torch.cuda.is_available()
    if device == "cuda" and not has_cuda:
        raise UsageError("--device cuda was requested but torch sees no CUDA GPU.")
    cpu = device == "cpu" or not has_cuda
    mp = os.environ.get("ACCELERATE_MIXED_PRECISION") or (
        "bf16" if not cpu and torch.cuda.is_bf16_supported() else "no")
    dist = Dist(Accelerator(cpu=cpu, mixed_precision=mp))
    launched = int(os.environ.get("WORLD_SIZE", "1"))
    if dist.world != launched:  # every process would think it is the only one and write OUT
        raise UsageError(
            f"The launcher started {launched} processes but accelerate formed a group of "
            f"{dist.world} (FSDP and DeepSpeed need CUDA GPUs); on CPUs use DDP: "
            f"`torchrun --standalone --nproc_per_node {launched} -m convert.cli ...`.")
    return dist


def batch_plan(global_windows: int, world: int, micro: int | None) -> tuple[int, int, int]:
    """(windows per process per step, micro-batches per step, windows per micro-batch)."""
    if global_windows % world:
        raise UsageError(f"The global batch ({global_windows} windows) must divide evenly over "
                         f"{world} processes; choose a multiple of {world}.")
    per_rank = global_windows // world
    micro = micro or per_rank
    if micro < 1 or per_rank % micro:
        raise UsageError(f"--micro-batch {micro} must divide the {per_rank} windows each process "
                         "takes per step.")
    return per_rank, per_rank // micro, micro


def parse_tokens(text: str) -> int:
    """``2B``, ``500M``, ``64k``, ``1e9`` or ``123456`` → a token count."""
    t = str(text).strip().upper().replace("_", "")
    scale = {"K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}.get(t[-1:], 1)
    try:
        n = float(t[:-1] if scale != 1 else t) * scale
    except ValueError:
        raise UsageError(f"--tokens '{text}' is not a token count (examples: 2B, 500M, 64k).") from None
    if not n >= 1:
        raise UsageError(f"--tokens must be positive (got {text}).")
    return int(n)


def steps_for(tokens: int, global_windows: int, seq_len: int) -> int:
    return max(1, math.ceil(tokens / (global_windows * seq_len)))


def make_optimizer(model: torch.nn.Module, lr: float, weight_decay: float,
                   device: torch.device) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only; fused kernels on CUDA."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=lr, betas=(0.9, 0.95),
                             eps=1e-8, fused=device.type == "cuda")


def prepare(dist: Dist, model: torch.nn.Module, opt_factory: Callable[[torch.nn.Module], Any],
            gradient_checkpointing: bool = False):
    """Wrap ``model`` for the run (DDP / FSDP / nothing) and build its optimizer."""
    if gradient_checkpointing:
        if not hasattr(model, "activation_checkpointing_enable"):
            raise UsageError("--gradient-checkpointing needs a transformers model.")
        model.activation_checkpointing_enable({"use_reentrant": False})
    model = model.to(dist.device)
    if dist.strategy == "FSDP":  # FSDP shards the parameters first; the optimizer takes the shards
        model = dist.acc.prepare(model)
        opt = dist.acc.prepare(opt_factory(model))
    else:
        model, opt = dist.acc.prepare(model, opt_factory(model))
    return model, opt


@dataclass
class StepResult:
    loss: float  # mean task loss over the global batch
    extra: float  # mean of the extra term (penalty) over the global batch
    stats: list[float]  # caller's per-step statistics, averaged over micro-batches and ranks
    grad_norm: float
    seconds: float  # wall time of this step on this process


def optimizer_step(dist: Dist, model, opt, windows: torch.Tensor, accum: int, lr: float,
                   loss_fn: Callable[[Any, torch.Tensor], tuple[torch.Tensor, torch.Tensor, list[float]]],
                   clip: float) -> StepResult:
    """One update from this process's ``windows`` (accum × micro, T).

    ``loss_fn(model, x)`` returns (task loss, extra term, [statistics]); the gradient is taken
    of task + extra.
    """
    t0 = time.perf_counter()
    for group in opt.param_groups:
        group["lr"] = lr
    model.train()
    micro = windows.shape[0] // accum
    loss_sum = extra_sum = 0.0
    stats_sum: list[float] | None = None
    for j in range(accum):
        x = windows[j * micro:(j + 1) * micro].to(dist.device, non_blocking=True)
        sync = j == accum - 1 or dist.world == 1
        with (nullcontext() if sync else dist.acc.no_sync(model)), dist.acc.autocast():
            loss, extra, stats = loss_fn(model, x)
            dist.acc.backward((loss + extra) / accum)
        loss_sum += float(loss.detach())
        extra_sum += float(extra.detach())
        stats_sum = stats if stats_sum is None else [a + b for a, b in zip(stats_sum, stats)]
    norm = dist.acc.clip_grad_norm_(model.parameters(), clip)
    opt.step()
    opt.zero_grad(set_to_none=True)
    reduced = dist.mean([loss_sum / accum, extra_sum / accum, *[s / accum for s in stats_sum or []]])
    return StepResult(reduced[0], reduced[1], reduced[2:], float(norm), time.perf_counter() - t0)


def fault_point(rank: int, step: int) -> None:
    """SIGKILL this process before ``step`` when ``AIOS_FAULT_KILL=RANK:STEP`` names it."""
    spec = os.environ.get(FAULT_ENV)
    if spec and spec == f"{rank}:{step}":
        os.kill(os.getpid(), signal.SIGKILL)


# --- checkpoints -------------------------------------------------------------------------------


def save_checkpoint(dist: Dist, work: Path, step: int, run_state: dict, data_state: dict) -> None:
    """Write ``work/checkpoint-STEP`` on every rank, then point ``work/latest`` at it."""
    target = work / f"checkpoint-{step}"
    if dist.is_main and target.exists():  # a torn one from a crashed attempt
        shutil.rmtree(target)
    dist.barrier()
    quiet = logging.getLogger("accelerate.utils.other")  # "Removed shared tensor" for tied weights:
    level, quiet.level = quiet.level, logging.ERROR      # expected, restored by load_state
    try:
        dist.acc.save_state(str(target))
    finally:
        quiet.setLevel(level)
    torch.save(data_state, target / f"data_state_{dist.rank}.pt")
    if dist.is_main:
        torch.save({**run_state, "world_size": dist.world}, target / RUN_STATE)
    dist.barrier()
    if dist.is_main:
        write_atomic(work / POINTER, target.name + "\n")
        for old in work.glob("checkpoint-*"):
            if old.name != target.name:
                shutil.rmtree(old, ignore_errors=True)
    dist.barrier()


def latest_checkpoint(work: Path) -> Path | None:
    pointer = work / POINTER
    if not pointer.is_file():
        return None
    path = work / pointer.read_text().strip()
    return path if (path / RUN_STATE).is_file() else None


def _unreadable(path: Path, e: Exception) -> InvalidModelError:
    return InvalidModelError(f"The checkpoint {path} cannot be read ({type(e).__name__}); delete "
                             f"{path.parent} to start over.")


def read_run_state(path: Path) -> dict:
    try:
        return torch.load(path / RUN_STATE, map_location="cpu", weights_only=True)
    except Exception as e:  # a torn or foreign file: say so, keep it for inspection
        raise _unreadable(path, e) from e


def load_checkpoint(dist: Dist, path: Path) -> dict:
    """Restore model, optimizer and RNGs of this rank; returns this rank's data state."""
    try:
        dist.acc.load_state(str(path))
        return torch.load(path / f"data_state_{dist.rank}.pt", map_location="cpu", weights_only=True)
    except Exception as e:
        raise _unreadable(path, e) from e


def full_state_dict(dist: Dist, model) -> dict[str, torch.Tensor]:
    """The unsharded weights (a collective: every rank calls it; complete on rank 0)."""
    return dist.acc.get_state_dict(model)


# --- throughput ---------------------------------------------------------------------------------


def flops_per_token(model: torch.nn.Module, n_layers: int, d_model: int, seq_len: int) -> float:
    """Training FLOPs per token: 6 × matmul parameters + 12·L·d·T for attention (PaLM, app. B)."""
    matmul = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    return 6.0 * matmul + 12.0 * n_layers * d_model * seq_len


def peak_flops(device: torch.device) -> float | None:
    """Peak dense bf16 FLOP/s of ``device`` (AIOS_PEAK_TFLOPS overrides); None when unknown."""
    env = os.environ.get("AIOS_PEAK_TFLOPS")
    if env:
        return float(env) * 1e12
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in GPU_BF16_PEAK.items() if k in name), None)


__all__ = ["Dist", "StepResult", "batch_plan", "fault_point", "flops_per_token", "full_state_dict",
           "latest_checkpoint", "load_checkpoint", "make_optimizer", "optimizer_step",
           "parse_tokens", "peak_flops", "prepare", "read_run_state", "save_checkpoint", "start",
           "steps_for"]
