"""``aios-contract ladder``: walk one model up the contract's tiers and measure every rung.

Rung 0 is the source GGUF as it is ("dense"). Each tier of ``--tiers`` (default: sparsify, alias,
svd-residual, layout) is built by the existing converter on the last rung built before it
(``build``: atomic, recorded, resumed), then every rung is run in aios-run's engine and checked
(``measure``): measured MB/token by term, decode tokens/s against llama.cpp's dense decode of the
source, held-out perplexity ratio, exact zeros, and the checker's tier and projected MB/token
beside the measured one. ``report`` writes ``ladder.json`` (schema ``contract/spec/ladder.schema.json``)
and ``ladder.md``; the HTML page with the ladder plot is ``reports.ladder``.

The gate (``require_reduction``): the best rung within the perplexity budget must reduce the
measured MB/token by at least that fraction against the source (exit 1 when not, 0 when met).

The ladder composes the converters, the runtime and the checker, so its library modules import
``convert`` and ``runtime`` (a documented exception of docs/design.md, "Layering").
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from aios import __version__
from aios.errors import AiosError, ExitCode, InvalidModelError, ModelNotFoundError, UsageError
from aios.io import sha256_file
from contract.ladder.build import TIERS, Rung, build_rung, clean_scratch
from contract.ladder.measure import best_mode, check_rung, compare, measure_rung

LADDER_SCHEMA_VERSION = "1"
DEFAULT_BUDGET = 1.10

__all__ = ["DEFAULT_BUDGET", "LADDER_SCHEMA_VERSION", "TIERS", "LadderConfig", "parse_tiers", "run_ladder"]


@dataclass(frozen=True)
class LadderConfig:
    budget_ppl: float = DEFAULT_BUDGET  # largest held-out perplexity ratio vs the source
    tiers: tuple[str, ...] = TIERS
    require_reduction: float | None = None  # the gate: best rung within budget reduces MB/token by ≥ this
    heldout_tokens: int = 4096  # held-out tokens of each rung's perplexity (and sparsify's check)
    decode_tokens: int = 32  # decode steps per measurement and per timed round
    prompt_tokens: int = 32
    rounds: int = 3  # alternated timing rounds, ours and llama.cpp
    llamacpp: bool = True
    calibration_tokens: int = 2048  # sparsify's calibration tokens
    calibration_samples: int | None = None  # svd-residual's and layout's calibration texts (None: all)
    check_samples: int = 32  # R1 calibration texts of each rung's check (64 tokens each)
    threads: int | None = None  # None: physical cores (both engines)

    def validate(self) -> None:
        if not self.budget_ppl > 1:
            raise UsageError(f"--budget-ppl is a perplexity ratio above 1, e.g. 1.10; got {self.budget_ppl}.")
        if self.require_reduction is not None and not 0 <= self.require_reduction < 1:
            raise UsageError(f"--require-reduction is a fraction in [0, 1), e.g. 0.3; got {self.require_reduction}.")
        for name in ("heldout_tokens", "decode_tokens", "prompt_tokens", "rounds", "calibration_tokens",
                     "check_samples"):
            if getattr(self, name) < (16 if name == "heldout_tokens" else 1):
                raise UsageError(f"--{name.replace('_', '-')} is too small: {getattr(self, name)}.")


def parse_tiers(text: str) -> tuple[str, ...]:
    """``sparsify,layout`` as a tuple in the order given; an unknown name is a usage error."""
    names = tuple(t.strip() for t in text.split(",") if t.strip())
    bad = [t for t in names if t not in TIERS]
    if bad or not names:
        raise UsageError(f"Unknown tier {', '.join(bad) or '(none given)'}; choose from {', '.join(TIERS)}.")
    if len(set(names)) != len(names):
        raise UsageError(f"--tiers names a tier twice: {text}.")
    return names


def source_gguf(model: str, out: Path, log: Callable[[str], None]) -> Path:
    """MODEL as a GGUF: the file itself, or an HF folder exported once to ``DIR/0-source.gguf``."""
    from aios.models import resolve_model

    p = Path(model)
    if p.is_dir():
        dst = out / "0-source.gguf"
        if not dst.is_file():  # export_gguf writes atomically: a file under this name is whole
            from convert.gguf import GGUFExportConfig, export_gguf

            log(f"dense: exporting {p} to {dst.name} (f16)")
            export_gguf(str(p), dst, GGUFExportConfig("f16"))
        p = dst
    elif not p.is_file():
        raise ModelNotFoundError(f"No such file or folder: {model}; pass a .gguf file (or an HF folder).")
    handle = resolve_model(str(p))  # a corrupt or foreign file fails here, one sentence, exit 4
    if handle.kind != "gguf":
        raise InvalidModelError(f"'{model}' is not a GGUF file; pass a .gguf (or an HF folder to export).")
    return p


def run_ladder(model: str, out_dir: str | Path, cfg: LadderConfig = LadderConfig(),
               log: Callable[[str], None] = lambda m: None) -> dict:
    """Build, measure and gate the ladder of ``model`` into ``out_dir``; returns the report dict."""
    from runtime.kernels import set_threads

    cfg.validate()
    t0 = time.perf_counter()
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise UsageError(f"-o {out} is a file; pass a folder for the ladder's artifacts and reports.")
    made = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    clean_scratch(out)
    try:
        src = source_gguf(model, out, log)
    except AiosError:
        if made and not any(out.iterdir()):  # a bad MODEL leaves no empty folder behind
            out.rmdir()
        raise
    threads = set_threads(cfg.threads)
    source_sha = sha256_file(src)
    rungs = [Rung(0, "dense", "source", src, settings={"file": src.name}, sha256=source_sha)]
    base = rungs[0]
    for k, tier in enumerate(cfg.tiers, start=1):
        log(f"[rung {k}/{len(cfg.tiers)}] {tier}")
        on_source = base is not rungs[0] and built_on_source(out, tier, source_sha)
        r = build_rung(k, tier, rungs[0] if on_source else base, source_sha, out, cfg, log)
        if r.artifact is None and base is not rungs[0] and not on_source:
            # the tier does not compose with the rung before it: measure it on the source instead
            log(f"{tier}: does not take {base.name}'s file ({r.reason}); building it on the source")
            alone = build_rung(k, tier, rungs[0], source_sha, out, cfg, log)
            if alone.artifact is None:  # the source's reason is the one that matters
                alone.reason = f"{alone.reason} (on the source; it does not take {base.name}'s file either)"
            r = alone
        if r.artifact is not None and base is not rungs[0] and r.built_on == "dense":
            r.notes.insert(0, f"built on the source: {tier} does not take {base.name}'s file")
        rungs.append(r)
        if r.artifact is not None and r.built_on == base.name:
            base = r
    llama = llama_info = None
    if cfg.llamacpp:
        from contract.ladder.llamacpp_decode import LlamaCppDecode

        llama = LlamaCppDecode(str(src), threads, cfg.prompt_tokens + cfg.decode_tokens + 16)
    rows = []
    context = cfg.prompt_tokens + cfg.decode_tokens // 2  # the bench's: KV bytes at the decode's middle
    for r in rungs:
        row = {**r.to_json(), "measured": None, "check": None, "projection_vs_measured": None}
        rows.append(row)
        if r.artifact is None:
            continue
        try:
            mode = "dense" if r.name == "dense" else best_mode(r.artifact)
            log(f"measuring rung {r.index} {r.name} ({mode}){' against llama.cpp' if llama else ''}")
            row["measured"] = measure_rung(r.artifact, mode, cfg, llama=llama, log=log)
            log(f"checking rung {r.index} {r.name}")
            row["check"] = check_rung(r.artifact, context, cfg.check_samples)
        except AiosError as e:  # the runtime or the checker cannot take this rung: said, the ladder goes on
            if r.name == "dense":
                raise
            log(f"rung {r.index} {r.name}: not measured: {e.message}")
            row.update(measured=None, check=None, not_measured=e.message)
            continue
        row["projection_vs_measured"] = compare(row["measured"], (row["check"] or {}).get("projection"))
    if llama is not None:
        llama_info = llama.describe()
    summarize(rows, cfg)
    best, gate = choose_and_gate(rows, cfg)
    return {"schema_version": LADDER_SCHEMA_VERSION, "tool": "aios-contract ladder", "tool_version": __version__,
            "created_utc": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "source": {"model": str(model), "file": src.name, "sha256": source_sha, "bytes": src.stat().st_size},
            "settings": {**asdict(cfg), "tiers": list(cfg.tiers), "threads": threads, "context": context},
            "llamacpp": llama_info, "rungs": rows, "best": best, "gate": gate,
            "evidence": "measured: aios-run's software byte counter, timed decode and held-out perplexity; "
                        "projected: aios-contract check's projection (never a measurement)",
            "seconds": round(time.perf_counter() - t0, 3)}


def built_on_source(out: Path, tier: str, source_sha: str) -> bool:
    """Whether an earlier run built ``tier`` on the source (it did not compose): resume it so."""
    import json

    from contract.ladder.build import record_path

    try:
        rec = json.loads(record_path(out, tier).read_text())
    except (OSError, ValueError):
        return False
    return rec.get("built_on") == "dense" and rec.get("input_sha256") == source_sha


def summarize(rows: list[dict], cfg: LadderConfig) -> None:
    """Reduction vs the source, perplexity ratio and the budget verdict of every measured rung."""
    src = rows[0]["measured"]
    for row in rows:
        m = row["measured"]
        if m is None:
            row.update(reduction_vs_source=None, ppl_ratio=None, within_budget=None)
            continue
        row["reduction_vs_source"] = round(1 - m["mb_per_token_total"] / src["mb_per_token_total"], 4)
        row["ppl_ratio"] = round(m["perplexity"] / src["perplexity"], 4)
        row["within_budget"] = row["ppl_ratio"] <= cfg.budget_ppl


def choose_and_gate(rows: list[dict], cfg: LadderConfig) -> tuple[dict, dict]:
    ok = [r for r in rows if r["within_budget"]]
    best_row = max(ok, key=lambda r: r["reduction_vs_source"]) if ok else rows[0]
    best = {"rung": best_row["name"], "index": best_row["index"], "reduction_vs_source": best_row["reduction_vs_source"],
            "ppl_ratio": best_row["ppl_ratio"], "ratio_vs_llamacpp": (best_row["measured"] or {}).get("ratio_vs_llamacpp")}
    x = cfg.require_reduction
    if x is None:
        return best, {"require_reduction": None, "met": None, "exit_code": int(ExitCode.OK),
                      "reason": "no gate requested (use --require-reduction)"}
    met = best["reduction_vs_source"] is not None and best["reduction_vs_source"] >= x
    what = (f"best rung within perplexity ratio {cfg.budget_ppl:g}: {best['rung']}, measured MB/token "
            f"reduction {best['reduction_vs_source']:.1%} {'≥' if met else '<'} required {x:.1%}")
    return best, {"require_reduction": x, "met": met, "exit_code": int(ExitCode.OK if met else ExitCode.NOT_MET),
                  "reason": what}
