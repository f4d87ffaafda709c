"""Benchmark: fine-tune throughput of the relufy engine at real model dimensions.

Builds a random-init checkpoint at Falcon-7B (d 4544, 71 heads, MQA, vocab 65024) or
Llama-3.1-8B (d 4096, 32 heads, 8 KV heads, d_ffn 14336, vocab 128256) dimensions with
``--layers`` blocks and ReLU already swapped in, then runs the relufy fine-tune step of
``convert/engine.py`` (the same ``optimizer_step``, activation-L1 penalty and AdamW the command
runs; SDPA attention, bf16 autocast and fused AdamW on a GPU) for ``--steps`` timed steps after
``--warmup`` untimed ones. Reports, side by side in one run:

* tokens/s of the fine-tune step, and peak GPU memory (CUDA) or peak RSS;
* MFU against the device's dense bf16 peak (``convert.engine.GPU_BF16_PEAK``, or
  ``--peak-tflops``), with FLOPs/token = 6 × matmul parameters + 12·L·d·T;
* the same FLOP rate as a fraction of a *measured* dense matmul of the model's width on the
  same device and dtype (what this machine can actually do right now; shared machines drift).

    python benchmarks/finetune_throughput.py --arch llama-3.1-8b --layers 4 --device cuda
    python benchmarks/finetune_throughput.py --arch falcon-7b --layers 1 --seq-len 256 --micro-batch 1 --steps 2  # CPU

Run it under ``torchrun --nproc_per_node N`` for DDP; tokens/s is then the sum over ranks.
Random weights and random token ids: the numbers are about speed, not about the model.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import time
from pathlib import Path

import torch

ARCHS = {
    "falcon-7b": dict(model_type="falcon", hidden_size=4544, num_attention_heads=71,
                      vocab_size=65024, multi_query=True, new_decoder_architecture=False,
                      parallel_attn=True, bias=False, activation="relu"),
    "llama-3.1-8b": dict(model_type="llama", hidden_size=4096, num_attention_heads=32,
                         num_key_value_heads=8, intermediate_size=14336, vocab_size=128256,
                         rope_theta=500000.0, hidden_act="relu", tie_word_embeddings=False),
}


def build(arch: str, layers: int, seq_len: int) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    spec = dict(ARCHS[arch])
    cfg = AutoConfig.for_model(spec.pop("model_type"), num_hidden_layers=layers,
                               max_position_embeddings=max(2048, seq_len), **spec)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)


def matmul_flops(device: torch.device, d: int, dtype: torch.dtype, seconds: float = 2.0) -> float:
    """Measured FLOP/s of (4d × d) @ (d × d) on ``device`` in ``dtype``."""
    a = torch.randn(4 * d, d, device=device, dtype=dtype)
    b = torch.randn(d, d, device=device, dtype=dtype)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    a @ b
    sync()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        a @ b
        n += 1
    sync()
    return n * 2 * 4 * d * d * d / (time.perf_counter() - t0)


def cpu_name() -> str:
    """The CPU model as lscpu names it (closing notes quote it beside every figure)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arch", choices=sorted(ARCHS), default="llama-3.1-8b")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--micro-batch", type=int, default=4, help="windows per forward per process")
    ap.add_argument("--accum", type=int, default=1, help="micro-batches per step")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    ap.add_argument("--gradient-checkpointing", action="store_true")
    ap.add_argument("--peak-tflops", type=float, default=None,
                    help="dense bf16 peak of the device, when the built-in table lacks it")
    ap.add_argument("-o", "--output", type=Path, default=Path("finetune_throughput.json"))
    args = ap.parse_args()

    import os

    from convert import engine as eng
    from convert import training as tr

    if args.peak_tflops:
        os.environ["AIOS_PEAK_TFLOPS"] = str(args.peak_tflops)
    dist = eng.start(args.device)
    model = build(args.arch, args.layers, args.seq_len)
    facts = model.config
    downs = [m for n, m in model.named_modules() if n.endswith(("mlp.dense_4h_to_h", "mlp.down_proj"))]
    tap = tr.ActivationTap(downs)
    flops = eng.flops_per_token(model, args.layers, facts.hidden_size, args.seq_len)
    params = sum(p.numel() for p in model.parameters())
    model, opt = eng.prepare(dist, model, lambda m: eng.make_optimizer(m, 1e-5, 0.1, dist.device),
                             args.gradient_checkpointing)

    def loss_fn(m, x):
        out = m(input_ids=x, labels=x)
        pen = 1.0 * tap.l1_penalty()
        dens = tap.density()
        tap.clear()
        return out.loss, pen, dens

    per_rank = args.micro_batch * args.accum
    gen = torch.Generator().manual_seed(dist.rank)
    sync = torch.cuda.synchronize if dist.device.type == "cuda" else (lambda: None)
    if dist.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for step in range(args.warmup + args.steps):
        x = torch.randint(0, facts.vocab_size, (per_rank, args.seq_len), generator=gen)
        sync()
        r = eng.optimizer_step(dist, model, opt, x, args.accum, 1e-5, loss_fn, 1.0)
        sync()
        if step >= args.warmup:
            times.append(r.seconds)
        if dist.is_main:
            print(f"step {step}: loss {r.loss:.3f}, {per_rank * args.seq_len / r.seconds:,.0f} "
                  f"tok/s per process{' (warm-up)' if step < args.warmup else ''}", flush=True)
    rate = sum(dist.gather(per_rank * args.seq_len * len(times) / sum(times)))
    dtype = torch.bfloat16 if dist.precision == "bf16" else torch.float32
    measured = matmul_flops(dist.device, facts.hidden_size, dtype)
    peak = eng.peak_flops(dist.device)
    achieved = rate * flops / dist.world
    result = {
        "arch": args.arch, "layers": args.layers, "parameters": params, "seq_len": args.seq_len,
        "micro_batch": args.micro_batch, "accum": args.accum, "world_size": dist.world,
        "device": torch.cuda.get_device_name() if dist.device.type == "cuda" else cpu_name(),
        "precision": dist.precision,
        "gradient_checkpointing": args.gradient_checkpointing,
        "tokens_per_second": round(rate, 1), "flops_per_token": flops,
        "achieved_flops_per_process": achieved, "peak_flops": peak,
        "mfu": round(achieved / peak, 4) if peak else None,
        "measured_matmul_flops": measured,
        "fraction_of_measured_matmul": round(achieved / measured, 4),
        "peak_gpu_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2)
        if dist.device.type == "cuda" else None,
        "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
    }
    if dist.is_main:
        args.output.write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
