"""``aios-run``: run converted GGUF artifacts and measure MB/token.

The top layer: commands parse options, call one library function (``runtime.generate``,
``runtime.bench``, ``runtime.predictor``) and render; the numbers come from those modules.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
from rich.table import Table

from aios.cli_common import EXIT_CODES_HELP, AiosGroup, make_console, version_option
from runtime.kernels import ARITHMETICS
from runtime.modes import MODES

console = make_console()
MODE_HELP = ("FFN execution: dense, sparse (exact: skip rows of zero activations), map (static sparsity map, "
             "lossy), predict (low-rank activation predictor picks up/gate rows, lossy; see fit-predictor).")
PREDICTOR_HELP = "Predictor file for --mode predict (default: MODEL with suffix .predictor.npz)."
THREADS_HELP = "Threads for the kernels (default: this machine's physical cores)."
ARITHMETIC_HELP = ("int8: llama.cpp's arithmetic (block types: activations quantized to 8-bit blocks per "
                   "matmul, integer dot products; F16 weights: activations rounded to fp16), float (weights "
                   "decoded to float, float32 activations: exact to float32 rounding), int16 (float, two int8 "
                   "activation planes in the many-token tiles) or llamacpp (int8 with every sum in llama.cpp's "
                   "order: logits bit-identical to its plain CPU buffers; slower).")


@click.group(cls=AiosGroup, epilog=EXIT_CODES_HELP)
@version_option()
def main() -> None:
    """Run GGUF artifacts on the CPU and measure bytes read per token."""


def _gguf_args(_ctx: click.Context, _param: click.Parameter, value):
    """MODEL must be a .gguf file: an HF folder or a model name gets the export command (exit 2)."""
    from aios.errors import UsageError

    for v in (value,) if isinstance(value, str) else value:
        p = Path(v)
        if p.is_dir() or (not p.exists() and p.suffix.lower() != ".gguf" and not any(c in v for c in "/\\")):
            raise UsageError(f"aios-run runs .gguf files and '{v}' is "
                             f"{'a folder' if p.is_dir() else 'not a file'}; export it first: "
                             f"`aios-convert gguf {v} -o {p.name or 'model'}.gguf`.")
        if p.is_file():  # a truncated or corrupt file says so first (not "No usable tokenizer")
            from aios.models.tensors import GGUFStore

            GGUFStore(p)
    return value


def notice_compile(m) -> None:
    """One stderr line when the kernels will compile before the first token (runtime.compile_notice);
    ``m``: the loaded model (its types named), or None (before several files load: bench)."""
    from rich.markup import escape

    from aios.cli_common import err_console
    from runtime import compile_notice

    kinds = set() if m is None else {p.kind for op in [m.tok_embd, m.output, *(v for L in m.layers for v in L.values())]
                                     if hasattr(op, "parts") for p in op.parts()}
    line = compile_notice(kinds)
    if line:
        err_console.print(f"[dim]{escape(line)}…[/]", soft_wrap=True)


@main.command()
@click.argument("model", callback=_gguf_args)
@click.option("-p", "--prompt", required=True, help="Prompt text.")
@click.option("-n", "n_tokens", type=int, default=32, show_default=True, help="Tokens to generate.")
@click.option("--mode", type=click.Choice(MODES), default="dense", show_default=True,
              help=MODE_HELP)
@click.option("--predictor", type=click.Path(dir_okay=False), default=None, help=PREDICTOR_HELP)
@click.option("--chunk", type=int, default=512, show_default=True,
              help="Prefill chunk size (tokens per forward; from 32 on, GEMMs).")
@click.option("--temperature", type=float, default=0.0, show_default=True, help="0 = greedy.")
@click.option("--top-k", type=int, default=0, show_default=True)
@click.option("--top-p", type=float, default=1.0, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--ctx", "--context", "n_ctx", type=int, default=None, help="Context length (default: the model's).")
@click.option("--tokenizer", type=click.Path(file_okay=False), default=None, help="Folder with tokenizer.json (default: from the GGUF).")
@click.option("--threads", type=click.IntRange(min=1), default=None, help=THREADS_HELP)
@click.option("--arithmetic", type=click.Choice(ARITHMETICS), default=ARITHMETICS[0], show_default=True,
              help=ARITHMETIC_HELP)
@click.option("--chat", is_flag=True, help="Send the prompt as a user turn through the GGUF's chat template "
              "and print the reply alone; stops at the end of the turn.")
@click.option("--chat-template", type=click.Path(dir_okay=False, exists=True), default=None,
              help="A Jinja chat template file to use instead of the GGUF's (implies --chat).")
def generate(model, prompt, n_tokens, mode, predictor, chunk, temperature, top_k, top_p, seed, n_ctx, tokenizer,
             threads, arithmetic, chat, chat_template) -> None:
    """Generate text from MODEL (.gguf) and print speed and MB/token."""
    import time

    from runtime.bench import decode_mb_per_token, model_arithmetic
    from runtime.generate import Sampling, chat_prompt, load_tokenizer, stop_ids
    from runtime.generate import generate as gen
    from runtime.kernels import set_threads
    from runtime.model import Model
    from runtime.modes import LOSSY_MODES

    threads = set_threads(threads)
    path = Path(model)
    t0 = time.perf_counter()
    m = Model(path, mode=mode, n_ctx=n_ctx, predictor=predictor, arithmetic=arithmetic)
    notice_compile(m)
    tok = load_tokenizer(path, Path(tokenizer) if tokenizer else None)
    chat = chat or chat_template is not None
    if chat:  # the template writes BOS and the turn markers itself
        text = chat_prompt(tok, prompt, Path(chat_template).read_text() if chat_template else None)
        ids = tok(text, add_special_tokens=False)["input_ids"]
    else:
        ids = tok(prompt)["input_ids"]
    if ids:  # load numba's compiled kernels outside the timed prefill (one token, then forgotten)
        m.forward(list(ids[:1]))
        m.reset()
    load_s = time.perf_counter() - t0
    out, tm = gen(m, list(ids), n_tokens, chunk=chunk, sampling=Sampling(temperature, top_k, top_p, seed),
                  eos=stop_ids(tok) if chat else None)
    if chat:
        console.print(tok.decode(out, skip_special_tokens=True), soft_wrap=True, markup=False, highlight=False)
    else:
        console.print(prompt + tok.decode(out), soft_wrap=True, markup=False, highlight=False)
    if tm.generated == 0:  # no decode step: there is no per-token figure to report
        console.print(f"[dim]{len(ids)} prompt tokens at {tm.prefill_tps:.1f} tok/s; no decode step ran (the "
                      f"first token comes from the prefill), so no MB/token or decode speed was measured: "
                      f"use -n 2 or more.[/]", soft_wrap=True)
        return
    per = decode_mb_per_token(tm)
    label = " (lossy)" if mode in LOSSY_MODES else ""
    console.print(
        f"[dim]{len(ids)} prompt tokens at {tm.prefill_tps:.1f} tok/s, {tm.generated} decode steps at "
        f"{tm.decode_tps:.1f} tok/s; measured MB/token {sum(per.values()):.3f} (weights {per['weights']:.3f}, "
        f"KV {per['kv_cache']:.3f}, activations {per['activations']:.3f}); mode {mode}{label}; {threads} thread{'s' if threads != 1 else ''}; "
        f"arithmetic {model_arithmetic(m)}; "
        f"load {load_s:.2f} s (not in the rates)[/]",
        soft_wrap=True,
    )


@main.command()
@click.argument("models", nargs=-1, required=True, callback=_gguf_args)
@click.option("--arithmetic", type=click.Choice(ARITHMETICS), default=ARITHMETICS[0], show_default=True,
              help=ARITHMETIC_HELP)
def warm(models, arithmetic) -> None:
    """Compile (or load from numba's cache) the kernels MODELS' forward passes use: a decode step,
    a prompt in the many-token form and a held-out perplexity window (its own arithmetic,
    runtime.perplexity), per file. Run once on a CI image or a fresh install, so the first
    `generate` or `check` does not compile; the cache outlives reinstalls of the same sources
    ($AIOS_CACHE/numba/<hash of the runtime's sources>)."""
    import time

    from runtime import numba_cache_dir
    from runtime.kernels import GEMM_MIN_TOKENS
    from runtime.model import Model
    from runtime.perplexity import perplexity

    for model in models:
        t0 = time.perf_counter()
        m = Model(Path(model), mode="dense", n_ctx=GEMM_MIN_TOKENS + 2, arithmetic=arithmetic)
        ids = [1 + i % max(1, m.tok_embd.n_out - 1) for i in range(GEMM_MIN_TOKENS + 1)]
        m.forward(ids[:1])  # a decode step
        m.reset()
        m.forward(ids[:-1], all_logits=True)  # a prompt as GEMMs / integer tiles, every token's logits
        perplexity(m, ids, window=len(ids))  # the quality gate's window, in its arithmetic (int16)
        console.print(f"{model}: kernels ready in {time.perf_counter() - t0:.1f} s (arithmetic {arithmetic})",
                      soft_wrap=True, markup=False, highlight=False)
    console.print(f"numba cache: {numba_cache_dir()}", soft_wrap=True, markup=False, highlight=False)


def checker_projection(path, context: int) -> tuple[float | None, str]:
    """``aios-contract check``'s projected reduction for ``path`` at the bench's context (the
    command layer joins the two packages; ``runtime.bench`` takes it as an argument)."""
    from aios.errors import AiosError
    from contract.check import check_model

    try:
        rep = check_model(str(path), samples=32, max_tokens=64, context=context)
    except AiosError as e:
        return None, f"checker could not project: {e.message}"
    except Exception as e:  # transformers' GGUF loader may not know the file
        return None, f"checker could not project: {e.__class__.__name__}: {str(e)[:120]}"
    p = rep.projection
    return (p.projected_reduction if p else None), f"checker projection at context {context}, tier {rep.tier}"


def _bench_progress(message: str, done: int, total: int) -> None:
    """One stderr line per long step (cachegrind runs take minutes each; silent with --quiet)."""
    from rich.markup import escape

    from aios.cli_common import err_console

    err_console.print(f"[dim]{escape(message)} ({done + 1}/{total})…[/]", soft_wrap=True)


def _size(text: str) -> int:
    import re

    from aios.errors import UsageError

    m = re.fullmatch(r"\s*(\d+)\s*([KMG]i?B?|B)?\s*", text, re.I)
    if not m:
        raise UsageError(f"--ll-size '{text}' is not a size such as 32MiB or 1048576.")
    unit = (m.group(2) or "B").upper().rstrip("B").rstrip("I")
    return int(m.group(1)) * {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}[unit]


def _two_ints(text: str) -> tuple[int, int]:
    from aios.errors import UsageError

    try:
        a, b = (int(x) for x in text.split(","))
    except ValueError:
        raise UsageError(f"--cachegrind-tokens '{text}' must be two integers such as 2,6.") from None
    if not 0 < a < b:
        raise UsageError("--cachegrind-tokens needs 0 < first < second.")
    return a, b


@main.command()
@click.argument("models", nargs=-1, required=True, callback=_gguf_args)
@click.option("--modes", "--mode", "modes", default="dense", show_default=True,
              help="Comma-separated modes run for every file. " + MODE_HELP)
@click.option("--prompt-tokens", type=int, default=64, show_default=True,
              help="Prompt length per run (tokens of the bundled held-out text).")
@click.option("-n", "n_tokens", type=int, default=32, show_default=True, help="Tokens to generate per run.")
@click.option("--chunk", type=int, default=512, show_default=True, help="Prefill chunk size.")
@click.option("--tokenizer", type=click.Path(file_okay=False), default=None,
              help="Folder with tokenizer.json (default: from each GGUF).")
@click.option("--no-project", is_flag=True, help="Skip the checker's projection (faster).")
@click.option("--predictor", type=click.Path(dir_okay=False), default=None, help=PREDICTOR_HELP)
@click.option("--perplexity-tokens", type=click.IntRange(min=0), default=0, show_default=True,
              help="Also measure held-out perplexity over this many tokens per run (lossy modes token by token).")
@click.option("--cachegrind", is_flag=True,
              help="Also estimate DRAM MB/token with valgrind cachegrind (LL misses x line size; minutes per run).")
@click.option("--ll-size", default=None, help="Simulated last-level cache for --cachegrind, e.g. 32MiB, 1MiB "
              "(default: this machine's L3). Smaller than the model to see weight streaming.")
@click.option("--cachegrind-tokens", default="2,6", show_default=True,
              help="The two decode lengths whose difference gives the per-token slope.")
@click.option("-o", "--output", "out_dir", type=click.Path(file_okay=False), default=None, help="Write aios-bench.json/.md here.")
@click.option("--baseline-model", type=click.Path(dir_okay=False), default=None,
              help="Run this GGUF before MODELS, so that it is the baseline of every measured reduction "
                   "(e.g. the original model of a relufied one) instead of the first MODEL.")
@click.option("--json", "as_json", is_flag=True,
              help="Print the full result as JSON on stdout instead of the table (stdout is JSON only; with -o "
                   "the files are written too, their paths on stderr).")
@click.option("--threads", type=click.IntRange(min=1), default=None, help=THREADS_HELP)
@click.option("--arithmetic", type=click.Choice(ARITHMETICS), default=ARITHMETICS[0], show_default=True,
              help=ARITHMETIC_HELP)
def bench(models, modes, prompt_tokens, n_tokens, chunk, tokenizer, no_project, predictor, perplexity_tokens,
          cachegrind, ll_size, cachegrind_tokens, out_dir, baseline_model, as_json, threads, arithmetic) -> None:
    """Run MODELS side by side; the first run (or --baseline-model) is the baseline for measured reductions."""
    from runtime.bench import bench as run_bench
    from runtime.bench import write_bench

    if baseline_model:
        _gguf_args(click.get_current_context(), None, (baseline_model,))  # type: ignore[arg-type]
    notice_compile(None)
    res = run_bench(([baseline_model] if baseline_model else []) + list(models), modes=[m.strip() for m in modes.split(",") if m.strip()],
                    prompt_tokens=prompt_tokens, n=n_tokens, chunk=chunk, tokenizer=tokenizer,
                    project=None if no_project else checker_projection, predictor=predictor, cachegrind=cachegrind,
                    perplexity_tokens=perplexity_tokens,
                    ll_bytes=_size(ll_size) if ll_size else None, cachegrind_tokens=_two_ints(cachegrind_tokens),
                    progress=_bench_progress,
                    threads=threads, arithmetic=arithmetic)
    from aios.cli_common import err_console, warn

    for s in res["skipped"]:  # a warning: on stderr, so that stdout stays the result
        warn(s, "skipped")
    if as_json:  # stdout is the JSON and nothing else (`aios-run bench F.gguf --json | jq`)
        json.dump(res, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        _print_bench(res, perplexity_tokens > 0)
    if out_dir:
        for p in write_bench(res, out_dir):
            (err_console if as_json else console).print(f"wrote {p}", soft_wrap=True)


def _print_bench(res: dict, ppl: bool) -> None:
    """The result table on stdout, then the cachegrind and predictor lines."""
    from runtime.bench import shares_weights

    t = Table(title="aios-run bench (MB/token measured by the software byte counter)")
    shared = shares_weights(res["rows"])  # aliased file: also its distinct weight bytes per step
    for col in ("file", "mode", "arithmetic", "decode tok/s", "MB/token") + (("distinct weights MB",) if shared else ()) + (
            "FFN density", "measured red.", "projected red.", "meas/proj") + (("held-out ppl",) if ppl else ()):
        t.add_column(col)
    for r in res["rows"]:
        pct = lambda x: "—" if x is None else f"{x:.1%}"  # noqa: E731
        t.add_row(Path(r["file"]).name, r["mode"] + (" (lossy)" if r["lossy"] else ""), r["arithmetic"],
                  f"{r['decode_tokens_per_s']:.1f}",
                  f"{r['decode_mb_per_token_total']:.4f}",
                  *((f"{r['distinct_weight_mb_per_token'] or 0:.4f}",) if shared else ()), pct(r["ffn_density"]), pct(r["reduction_vs_baseline"]),
                  pct(r["projected_reduction"]), str(r["measured_over_projected"] or "—"),
                  *((f"{r['heldout_perplexity']:.3f}",) if ppl else ()))
    console.print(t)
    if res.get("cachegrind"):
        for r in res["rows"]:
            red = r["cachegrind_kernel_reduction_vs_baseline"]
            console.print(f"cachegrind {Path(r['file']).name} [{r['mode']}]: simulated DRAM "
                          f"{r['cachegrind_mb_per_token']:.4f} MB/token, {r['cachegrind_kernel_mb_per_token']:.4f} in "
                          f"kernels" + ("" if red is None else
                                        f"; kernel reduction {red:.1%} vs software weights reduction "
                                        f"{r['software_weight_reduction_vs_baseline']:.1%} (ratio "
                                        f"{r['cachegrind_kernel_over_software_weights']})"))
    for r in res["rows"]:
        if r.get("predictor_fnr") is not None:
            console.print(f"predictor on {Path(r['file']).name}: measured false-negative rate "
                          f"{r['predictor_fnr']:.2%}, up/gate rows computed {r['predicted_density']:.1%} (lossy)")


@main.command("fit-predictor")
@click.argument("model", callback=_gguf_args)
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None,
              help="Predictor file (default: MODEL with suffix .predictor.npz).")
@click.option("--rank", type=int, default=32, show_default=True, help="Rank r of the predictor A·B.")
@click.option("--target-fnr", type=float, default=0.01, show_default=True,
              help="Per-neuron false-negative rate the thresholds aim for on calibration tokens.")
@click.option("--calibration", type=click.Path(dir_okay=False), default=None,
              help="JSONL/TXT calibration texts (default: the bundled set).")
@click.option("--max-tokens", type=int, default=4096, show_default=True,
              help="Calibration tokens collected in total (all texts together).")
@click.option("--tokenizer", type=click.Path(file_okay=False), default=None)
def fit_predictor(model, output, rank, target_fnr, calibration, max_tokens, tokenizer) -> None:
    """Fit the low-rank FFN activation predictor used by --mode predict (ReLU-family GGUFs)."""
    from aios.data import load_texts
    from runtime import predictor as P
    from runtime.fit_predictor import fit

    path = Path(model)
    if not path.is_file():
        from aios.errors import ModelNotFoundError

        raise ModelNotFoundError(f"No such GGUF file: {model}.")
    cfg = P.PredictorConfig(rank=rank, target_fnr=target_fnr, max_tokens=max_tokens)
    with console.status("collecting FFN inputs and fitting per-layer predictors…"):
        pred = fit(path, cfg, texts=load_texts(calibration), tokenizer_dir=tokenizer)
    out = P.save(pred, output or P.default_path(path))
    h = pred.info["heldout"]
    console.print(f"wrote {out}: rank {rank}, {len(pred.layers)} layers, {pred.nbytes / 1e6:.3f} MB; on "
                  f"{pred.info['calibration_tokens']} calibration tokens (20 % held out, measured): "
                  f"false-negative rate {h['fnr']:.2%}, true density {h['true_density']:.1%}, "
                  f"predicted density {h['predicted_density']:.1%}")


if __name__ == "__main__":  # pragma: no cover
    main()
