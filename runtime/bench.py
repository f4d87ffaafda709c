"""``aios-run bench``: run artifacts side by side, measure tokens/s and MB/token by term.

The first (file, mode) run is the baseline; every other run gets its measured MB/token
reduction against it, next to the checker's *projected* reduction for that artifact and
the ratio measured / projected — the line that confirms or refutes the contract's promise.

Layering: a runtime library module. The projection is an argument (``project``): the command
(``runtime/cli.py``) passes ``aios-contract check``'s, so nothing here imports above the runtime.
The bench's Markdown (:func:`to_markdown`) lives here too, so ``aios-run bench -o`` and
``aios-contract report`` render the same bytes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from aios import __version__
from aios.data import load_heldout
from aios.errors import AiosError, UsageError
from aios.io import write_atomic
from runtime.generate import Sampling, Timing, generate, load_tokenizer
from runtime.model import RELU_FAMILY, Model
from runtime.modes import LOSSY_MODES, MODES

BENCH_SCHEMA_VERSION = "1"


@dataclass
class BenchRow:
    file: str
    mode: str
    lossy: bool
    activation: str
    weight_bytes: int
    prompt_tokens: int
    decode_forwards: int
    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    decode_mb_per_token: dict[str, float]  # by term, measured by the software counter
    decode_mb_per_token_total: float
    arithmetic: str  # the block kernels' arithmetic for this file's types (runtime.kernels.arithmetic_label)
    ffn_density: float | None  # nonzero FFN activations / all, during decode
    distinct_weight_mb_per_token: float | None = None  # one decode step, each stored tensor counted once
    predictor_fnr: float | None = None  # predict mode, decode: firing neurons predicted silent / firing
    predicted_density: float | None = None  # predict mode, decode: up/gate rows computed / all
    heldout_perplexity: float | None = None  # measured by running the file (--perplexity-tokens)
    perplexity_ratio_vs_baseline: float | None = None
    cachegrind_mb_per_token: float | None = None  # simulated: LL misses × line size, decode slope
    cachegrind_kernel_mb_per_token: float | None = None  # the part missed in JIT kernel code (weight reads)
    cachegrind_reduction_vs_baseline: float | None = None  # total simulated vs total software
    cachegrind_over_software: float | None = None
    cachegrind_kernel_reduction_vs_baseline: float | None = None  # kernel simulated vs software weights
    software_weight_reduction_vs_baseline: float | None = None
    cachegrind_kernel_over_software_weights: float | None = None
    reduction_vs_baseline: float | None = None
    projected_reduction: float | None = None
    measured_over_projected: float | None = None
    projection_note: str = ""
    notes: list[str] = field(default_factory=list)


def decode_mb_per_token(tm: Timing) -> dict[str, float]:
    """Measured MB read per decode step, by term (weights, kv_cache, activations)."""
    return {k: v / max(1, tm.generated) / 1e6 for k, v in tm.decode_bytes.items()}


def model_arithmetic(model: Model) -> str:
    """The arithmetic the model's matmuls run in, from its tensor types and its arithmetic
    (``model.arith``): "int8 (Q8_0 activations, ...)" or "float" (runtime.kernels.arithmetic_label)."""
    from runtime.kernels import arithmetic_label

    return arithmetic_label(model.arith, {t.tensor_type.name for t in model.reader.tensors})


def shares_weights(rows: list[dict]) -> bool:
    """Whether a dense run reads clearly fewer distinct weight bytes than weight bytes per step:
    a file sharing tensors between layers (aliased), whose distinct bytes are worth showing."""
    return any(r.get("distinct_weight_mb_per_token") is not None and r["mode"] == "dense"
               and r["distinct_weight_mb_per_token"] < 0.95 * r["decode_mb_per_token"]["weights"]
               for r in rows)


def _prompt_ids(tok, n_tokens: int) -> list[int]:
    ids: list[int] = []
    for passage in load_heldout():  # tokenized passage by passage until enough tokens
        ids += tok(passage + "\n\n")["input_ids"]
        if len(ids) >= n_tokens:
            break
    ids = ids[:n_tokens]
    if len(ids) < n_tokens:
        raise UsageError(f"The held-out text has only {len(ids)} tokens; use --prompt-tokens ≤ {len(ids)}.")
    return list(ids)


def _prediction_stats(model: Model) -> dict:
    """False-negative rate and predicted density over the run's decode steps."""
    s = model.pred_stats
    if model.mode != "predict" or not s["rows"]:
        return {}
    return {"predictor_fnr": round(s["missed"] / max(1, s["fired"]), 6),
            "predicted_density": round(s["predicted"] / s["rows"], 6)}


def _cachegrind_rows(rows: list[BenchRow], predictor: str | None, ll_bytes: int | None,
                     tokens: tuple[int, int], progress, arithmetic: str) -> dict:
    """Simulated DRAM MB/token for every row (valgrind cachegrind; minutes per row)."""
    import shutil
    import tempfile

    from runtime.hw_counters import cachegrind_mb_per_token, default_ll_bytes

    if not shutil.which("valgrind"):
        raise UsageError("--cachegrind needs valgrind on PATH (e.g. apt-get install valgrind).")
    ll = ll_bytes or default_ll_bytes()
    n1, n2 = tokens
    with tempfile.TemporaryDirectory(prefix="aios-cg-") as tmp:
        for k, r in enumerate(rows):
            if progress:
                progress(f"cachegrind {Path(r.file).name} [{r.mode}]", k, len(rows))
            work = Path(tmp) / str(k)
            work.mkdir()
            res = cachegrind_mb_per_token(r.file, r.mode, n1, n2, ll, work,
                                          predictor=predictor if r.mode == "predict" else None,
                                          arithmetic=arithmetic)
            r.cachegrind_mb_per_token = round(res["mb_per_token"], 6)
            r.cachegrind_kernel_mb_per_token = round(res["kernel_mb_per_token"], 6)
    return {"evidence": "simulated (cachegrind last-level misses x 64-byte lines, slope between two decode "
                        "lengths; NUMBA_NUM_THREADS=1)", "ll_bytes": ll, "decode_tokens": [n1, n2]}


def _measure_row(model: Model, path: Path, mode: str, ids: list[int], n: int, chunk: int) -> BenchRow:
    """One timed, byte-counted decode of ``n`` tokens after the prompt ``ids`` (measured)."""
    generate(model, ids[:8], 2, chunk=chunk)  # warm-up: numba kernels load/compile
    out, tm = generate(model, ids, n, chunk=chunk, sampling=Sampling())
    # one more decode step counted on its own: each stored tensor once (a canonical
    # shared by several layers counts once) — the footprint one token touches
    distinct = None
    if model.pos < model.hp.n_ctx:
        model.counter.reset()
        model.forward([(out or ids)[-1]])
        distinct = round(model.counter.distinct_weight_bytes() / 1e6, 6)
    if mode == "predict":  # the same decode again, untimed, counting the predictor's misses
        model.measure_fnr = True
        generate(model, ids, n, chunk=chunk, sampling=Sampling())
        model.measure_fnr = False
    per_tok = decode_mb_per_token(tm)
    hp = model.hp
    density = tm.decode_ffn_nnz / max(1, tm.generated * hp.n_layers * hp.d_ffn)
    return BenchRow(
        file=str(path), mode=mode, lossy=mode in LOSSY_MODES, activation=hp.activation,
        weight_bytes=model.weight_bytes, prompt_tokens=len(ids), decode_forwards=tm.generated,
        prefill_tokens_per_s=round(tm.prefill_tps, 2), decode_tokens_per_s=round(tm.decode_tps, 2),
        decode_mb_per_token={k: round(v, 6) for k, v in per_tok.items()},
        decode_mb_per_token_total=round(sum(per_tok.values()), 6),
        arithmetic=model_arithmetic(model),
        distinct_weight_mb_per_token=distinct,
        ffn_density=round(density, 6),
        **_prediction_stats(model),
    )


Projection = Callable[[Path, int], tuple[float | None, str]]


def _compare_to_baseline(rows: list[BenchRow], context: int, project: Projection | None) -> None:
    """Measured reductions of every row against the first (and, with ``project``, the
    reduction it projects for each file at ``context`` tokens: ``aios-run bench`` passes
    ``aios-contract check``'s, so this module imports nothing above the runtime)."""
    base = rows[0]
    for r in rows[1:]:
        if r.heldout_perplexity and base.heldout_perplexity:
            r.perplexity_ratio_vs_baseline = round(r.heldout_perplexity / base.heldout_perplexity, 4)
        r.reduction_vs_baseline = round(1 - r.decode_mb_per_token_total / base.decode_mb_per_token_total, 6)
        if project is not None:
            proj, note = project(Path(r.file), context)
            r.projected_reduction, r.projection_note = proj, note
            if proj:
                r.measured_over_projected = round(r.reduction_vs_baseline / proj, 4)
    for r in rows[1:]:
        if r.cachegrind_mb_per_token is None or not base.cachegrind_mb_per_token:
            continue
        r.cachegrind_reduction_vs_baseline = round(1 - r.cachegrind_mb_per_token / base.cachegrind_mb_per_token, 6)
        if r.reduction_vs_baseline:
            r.cachegrind_over_software = round(r.cachegrind_reduction_vs_baseline / r.reduction_vs_baseline, 4)
        if base.cachegrind_kernel_mb_per_token:
            r.cachegrind_kernel_reduction_vs_baseline = round(
                1 - r.cachegrind_kernel_mb_per_token / base.cachegrind_kernel_mb_per_token, 6)
            w, bw = r.decode_mb_per_token["weights"], base.decode_mb_per_token["weights"]
            r.software_weight_reduction_vs_baseline = round(1 - w / bw, 6) if bw else None
            if r.software_weight_reduction_vs_baseline:
                r.cachegrind_kernel_over_software_weights = round(
                    r.cachegrind_kernel_reduction_vs_baseline / r.software_weight_reduction_vs_baseline, 4)


def bench(files: list[str], *, modes: list[str] | None = None, prompt_tokens: int = 64, n: int = 32,
          chunk: int = 64, tokenizer: str | None = None, project: Projection | None = None,
          predictor: str | None = None, cachegrind: bool = False, ll_bytes: int | None = None,
          cachegrind_tokens: tuple[int, int] = (2, 6), perplexity_tokens: int = 0, progress=None,
          threads: int | None = None, arithmetic: str | None = None) -> dict:
    from runtime.kernels import Arithmetic, set_threads

    threads = set_threads(threads)  # default: physical cores
    arith = Arithmetic.of(arithmetic)  # None: the default (int8)
    modes = modes or ["dense"]
    bad = [m for m in modes if m not in MODES]
    if bad:
        raise UsageError(f"Unknown mode {', '.join(bad)}; choose from {', '.join(MODES)}.")
    rows: list[BenchRow] = []
    skipped: list[str] = []
    for f in files:
        path = Path(f)
        if not path.is_file():
            from aios.errors import ModelNotFoundError

            raise ModelNotFoundError(f"No such GGUF file: {f}.")
        tok = load_tokenizer(path, Path(tokenizer) if tokenizer else None)
        ids = _prompt_ids(tok, prompt_tokens)
        for mode in modes:
            model = Model(path, mode="dense", arithmetic=arith)
            if mode != "dense" and model.hp.activation not in RELU_FAMILY and model.thresholds is None:
                skipped.append(f"{path.name} [{mode}]: activation '{model.hp.activation}' has no exact zeros")
                continue
            if mode != "dense":
                try:
                    model = Model(path, mode=mode, predictor=predictor if mode == "predict" else None,
                                  arithmetic=arith)
                except AiosError as e:  # one unsupported (file, mode) pair: skip it, run the rest
                    skipped.append(f"{path.name} [{mode}]: {e.message}")
                    continue
            rows.append(_measure_row(model, path, mode, ids, n, chunk))
            if perplexity_tokens:
                from runtime.perplexity import heldout_ids, perplexity

                # lossy modes token by token, as decoding runs them (a chunk would union the rows)
                ppl = perplexity(model, heldout_ids(tok, perplexity_tokens), per_token=mode in LOSSY_MODES)
                rows[-1].heldout_perplexity = round(ppl["perplexity"], 4)
    if not rows:
        raise UsageError("Nothing to run: every (file, mode) pair was skipped.")
    cg_settings = None
    if cachegrind:
        cg_settings = _cachegrind_rows(rows, predictor, ll_bytes, cachegrind_tokens, progress, arith.name)
    base = rows[0]
    _compare_to_baseline(rows, base.prompt_tokens + n // 2, project)
    return {
        "schema_version": BENCH_SCHEMA_VERSION,
        "cachegrind": cg_settings,
        "tool": "aios-run bench",
        "tool_version": __version__,
        "evidence": "measured (software byte counter: bytes the runtime's kernels read)",
        "settings": {"prompt_tokens": prompt_tokens, "new_tokens": n, "chunk": chunk, "modes": modes,
                     "perplexity_tokens": perplexity_tokens, "threads": threads,
                     "arithmetic": arith.name},
        "baseline": {"file": base.file, "mode": base.mode},
        "rows": [asdict(r) for r in rows],
        "skipped": skipped,
    }


def to_markdown(result: dict) -> str:
    lines = [
        "## aios-run bench",
        "",
        f"Baseline: `{Path(result['baseline']['file']).name}` [{result['baseline']['mode']}] · "
        f"{result['settings']['prompt_tokens']} prompt tokens, {result['settings']['new_tokens']} generated.",
        "",
        "| File | Mode | Arithmetic | Prefill tok/s | Decode tok/s | MB/token weights | KV | activations | total "
        "| distinct weights | FFN density | Measured reduction | Projected reduction | Measured / projected |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        mb = r["decode_mb_per_token"]

        def pct(x):
            return "—" if x is None else f"{x:.1%}"

        mode = r["mode"] + (" (lossy)" if r["lossy"] else "")
        lines.append(
            f"| {Path(r['file']).name} | {mode} | {r.get('arithmetic', '—')} | {r['prefill_tokens_per_s']:.1f} | {r['decode_tokens_per_s']:.1f} "
            f"| {mb['weights']:.4f} | {mb['kv_cache']:.4f} | {mb['activations']:.4f} | {r['decode_mb_per_token_total']:.4f} "
            f"| {'—' if r.get('distinct_weight_mb_per_token') is None else format(r['distinct_weight_mb_per_token'], '.4f')} | {pct(r['ffn_density'])} | {pct(r['reduction_vs_baseline'])} | {pct(r['projected_reduction'])} "
            f"| {'—' if r['measured_over_projected'] is None else r['measured_over_projected']} |"
        )
    if any(r.get("heldout_perplexity") for r in result["rows"]):
        lines += ["", f"Held-out perplexity, measured by running each file on the first "
                  f"{result['settings']['perplexity_tokens']} held-out tokens (lossy modes token by token):", ""]
        for r in result["rows"]:
            ratio = r.get("perplexity_ratio_vs_baseline")
            lines.append(f"- `{Path(r['file']).name}` [{r['mode']}{' (lossy)' if r['lossy'] else ''}]: "
                         f"{r['heldout_perplexity']}" + ("" if ratio is None else f" ({ratio}x the baseline)"))
    for r in result["rows"]:
        if r.get("predictor_fnr") is not None:
            lines.append(f"\nPredictor on `{Path(r['file']).name}`: measured false-negative rate "
                         f"{r['predictor_fnr']:.2%} (firing neurons predicted silent, their contribution lost), "
                         f"up/gate rows computed {r['predicted_density']:.1%}.")
    cg = result.get("cachegrind")
    if cg:
        lines += ["", f"Cachegrind estimate ({cg['evidence']}; LL {cg['ll_bytes'] / 2**20:.2f} MiB). "
                  "*Kernel* is the part missed inside the JIT-compiled kernels (the weight reads), compared "
                  "with the software count's weights term; *all* includes the interpreter, numpy and libc.", "",
                  "| File | Mode | Simulated MB/token all | kernel | Reduction all (sim / software) "
                  "| Reduction kernel vs weights (sim / software) | Ratio |",
                  "|---|---|---|---|---|---|---|"]

        def f(x, pct=True):
            return "—" if x is None else (f"{x:.1%}" if pct else f"{x}")

        for r in result["rows"]:
            lines.append(
                f"| {Path(r['file']).name} | {r['mode']} | {f(r['cachegrind_mb_per_token'], False)} "
                f"| {f(r['cachegrind_kernel_mb_per_token'], False)} "
                f"| {f(r['cachegrind_reduction_vs_baseline'])} / {f(r['reduction_vs_baseline'])} "
                f"| {f(r['cachegrind_kernel_reduction_vs_baseline'])} / {f(r['software_weight_reduction_vs_baseline'])} "
                f"| {f(r['cachegrind_kernel_over_software_weights'], False)} |")
    for s in result["skipped"]:
        lines.append(f"\nSkipped: {s}")
    lines.append("\n*distinct weights*: one decode step's weight bytes with each stored tensor counted once "
                 "(what it reads if a tensor shared by several layers stays cached); exact in dense mode, "
                 "a lower bound in sparse modes.")
    lines.append("\nMB/token is measured by the runtime's byte counter; projected figures come from "
                 "`aios-contract check` and are not measurements.")
    return "\n".join(lines) + "\n"


def write_bench(result: dict, out_dir: str | Path) -> list[Path]:
    out = Path(out_dir)
    return [write_atomic(out / "aios-bench.json", json.dumps(result, indent=2) + "\n"),
            write_atomic(out / "aios-bench.md", to_markdown(result))]
