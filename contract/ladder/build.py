"""The ladder's rungs: each tier's artifact built with the existing converters, kept in DIR with a
record of how it was made, so a rerun resumes instead of rebuilding.

A rung is built on the last rung that was built (the source for the first). A converter that
cannot take that file (it raises an :class:`aios.errors.AiosError` with a one-sentence reason,
e.g. ``alias`` and ``svd-residual`` refuse an aios-run file with neuron-major down projections)
leaves its rung *skipped* with that reason; the next tier is built on the rung before it.

Atomicity: a rung is built in a scratch folder ``DIR/.building-<rung>-*`` (deleted in a
``finally``, and any left by a killed run deleted at the next start); its files are moved into
DIR by ``os.replace`` (the artifact last of them), then the record ``<rung>.record.json`` is
written atomically. Resume: a rung whose record names the same input sha256 and the same
settings, and whose artifact exists with the recorded sha256, is reused as it is.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from aios import __version__
from aios.errors import AiosError
from aios.io import sha256_file, write_atomic

TIERS = ("sparsify", "alias", "svd-residual", "layout")
# sparsify's fallback when the --max-ppl-ratio search lands above the budget on held-out tokens
SPARSIFY_TARGETS = (0.5, 0.4, 0.3, 0.2)
RECORD_VERSION = 1
Log = Callable[[str], None]


@dataclass
class Rung:
    """One rung of the ladder: the source ("dense") or one tier's artifact."""

    index: int
    name: str  # "dense" or a tier of TIERS
    status: str  # source | built | reused | skipped
    artifact: Path | None = None
    built_on: str | None = None  # the rung whose file it was converted from
    settings: dict = field(default_factory=dict)
    sha256: str | None = None
    reason: str | None = None  # why skipped
    build_seconds: float | None = None
    converter: dict = field(default_factory=dict)  # what the converter reported (chosen target, ...)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["artifact"] = None if self.artifact is None else self.artifact.name
        return d


def record_path(out: Path, name: str) -> Path:
    return out / f"{name}.record.json"


def artifact_name(index: int, name: str) -> str:
    return f"{index}-{name}.gguf"


def tier_settings(tier: str, cfg) -> dict:
    """The settings a tier is built with (the record's ``settings``: a change rebuilds the rung)."""
    if tier == "sparsify":
        s = {"max_ppl_ratio": cfg.budget_ppl, "fallback_targets": list(SPARSIFY_TARGETS), "scope": "all",
             "allocation": "uniform", "sparse_down": True, "tokens": cfg.calibration_tokens,
             "heldout_tokens": cfg.heldout_tokens}
        if input_major_supported():
            s["input_major"] = True
        return s
    if tier == "alias":
        return {"zones": "core", "delta": "lowrank:8", "canonical": "mean", "like": "input file's types"}
    if tier == "svd-residual":
        return {"energy": 0.95, "method": "activation-aware", "residual": "like the input file",
                "samples": cfg.calibration_samples, "max_tokens": 128}
    if tier == "layout":
        return {"samples": cfg.calibration_samples, "max_tokens": 128}
    raise AssertionError(tier)


def input_major_supported() -> bool:
    """Whether SparsifyConfig has ``input_major`` (every sparsified matrix stored input-major)."""
    from convert.sparsify.config import SparsifyConfig

    return "input_major" in {f.name for f in dataclasses.fields(SparsifyConfig)}


def clean_scratch(out: Path) -> None:
    """Delete scratch folders a killed run left behind (never a finished artifact)."""
    for p in out.glob(".building-*"):
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)


def reusable(out: Path, name: str, input_sha: str, settings: dict, log: Log) -> dict | None:
    """The record of rung ``name`` when it can be reused as it is, else None (and why, logged)."""
    rec_file = record_path(out, name)
    if not rec_file.is_file():
        return None
    try:
        rec = json.loads(rec_file.read_text())
    except (OSError, ValueError):
        log(f"{name}: record unreadable, rebuilding")
        return None
    if rec.get("record_version") != RECORD_VERSION or rec.get("input_sha256") != input_sha \
            or rec.get("settings") != json.loads(json.dumps(settings)):
        log(f"{name}: input or settings changed since the record, rebuilding")
        return None
    art = out / rec.get("artifact", "")
    if not rec.get("artifact") or not art.is_file() or sha256_file(art) != rec.get("artifact_sha256"):
        log(f"{name}: artifact missing or changed, rebuilding")
        return None
    return rec


def build_rung(index: int, tier: str, base: Rung, source_sha: str, out: Path, cfg, log: Log) -> Rung:
    """Build (or reuse) tier ``tier`` on ``base``'s file; a converter's refusal skips the rung."""
    settings = tier_settings(tier, cfg)
    input_sha = base.sha256 or sha256_file(base.artifact)  # type: ignore[arg-type]
    rec = reusable(out, tier, input_sha, settings, log)
    if rec is not None:
        log(f"{tier}: reusing {rec['artifact']} (record matches: same input, same settings)")
        return Rung(index, tier, "reused", out / rec["artifact"], base.name, settings, rec["artifact_sha256"],
                    build_seconds=rec.get("build_seconds"), converter=rec.get("converter", {}),
                    notes=rec.get("notes", []))
    name = artifact_name(index, tier)
    final = out / name
    for stale in (final, record_path(out, tier), final.with_name(final.stem + ".aios.json")):
        stale.unlink(missing_ok=True)  # an old rung of another input: never left beside the new one
    log(f"{tier}: building on {base.name} ({base.artifact.name})")  # type: ignore[union-attr]
    t0 = time.perf_counter()
    scratch = Path(tempfile.mkdtemp(prefix=f".building-{tier}-", dir=out))
    try:
        try:
            converter, notes = BUILDERS[tier](base.artifact, scratch / name, cfg, log)
        except AiosError as e:
            log(f"{tier}: skipped: {e.message}")
            return Rung(index, tier, "skipped", None, base.name, settings, reason=e.message)
        if not (scratch / name).is_file():
            reason = notes[0] if notes else f"{tier} wrote no file"
            log(f"{tier}: skipped: {reason}")
            return Rung(index, tier, "skipped", None, base.name, settings, reason=reason, converter=converter)
        for extra in sorted(scratch.glob(f"{final.stem}.*")):  # sidecars first, the artifact last
            if extra.name != name and extra.is_file():
                os.replace(extra, out / extra.name)
        os.replace(scratch / name, final)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    seconds = round(time.perf_counter() - t0, 3)
    sha = sha256_file(final)
    write_atomic(record_path(out, tier), json.dumps({
        "record_version": RECORD_VERSION, "tool_version": __version__, "rung": tier, "index": index,
        "built_on": base.name, "input": base.artifact.name, "input_sha256": input_sha,  # type: ignore[union-attr]
        "source_sha256": source_sha, "settings": settings, "artifact": name, "artifact_sha256": sha,
        "artifact_bytes": final.stat().st_size, "build_seconds": seconds, "converter": converter,
        "notes": notes}, indent=2, default=str) + "\n")
    log(f"{tier}: built {name} in {seconds:.1f} s")
    return Rung(index, tier, "built", final, base.name, settings, sha, build_seconds=seconds,
                converter=converter, notes=notes)


# --- one function per tier: (input file, output file, cfg, log) -> (converter facts, notes) ---------


def build_sparsify(src: Path, dst: Path, cfg, log: Log) -> tuple[dict, list[str]]:
    """Sparsest thresholds within the budget as the ladder measures it (held-out perplexity of
    aios/data/heldout.jsonl, ``measure.heldout_perplexity``): ``max_ppl_ratio`` first (bisected by
    sparsify on its calibration tokens); if the ladder's held-out ratio lands above the budget,
    fixed targets below the one it chose, descending (SPARSIFY_TARGETS)."""
    from contract.ladder.measure import heldout_perplexity
    from convert.sparsify import SparsifyConfig, sparsify

    extra = {"input_major": True} if input_major_supported() else {}
    base = dict(scope="all", sparse_down=True, tokens=cfg.calibration_tokens,
                heldout_tokens=max(cfg.heldout_tokens, 16), **extra)
    ppl_src = heldout_perplexity(src, cfg.heldout_tokens)
    tries = [SparsifyConfig(target=None, max_ppl_ratio=cfg.budget_ppl, **base)]
    tried: list[dict] = []
    result = None
    k = 0
    while k < len(tries):
        c = tries[k]
        k += 1
        what = f"max-ppl-ratio {c.max_ppl_ratio}" if c.target is None else f"target {c.target}"
        log(f"sparsify: calibrating ({what})")
        result = sparsify(src, dst, c, progress=phase_log("sparsify", log))
        ratio = round(heldout_perplexity(dst, cfg.heldout_tokens) / ppl_src, 4)
        tried.append({"target": result.target, "ladder_ppl_ratio": ratio,
                      "sparsify_heldout_ppl_ratio": result.heldout.get("ppl_ratio")})
        log(f"sparsify: target {result.target:.3f}: held-out perplexity ratio {ratio}")
        if ratio <= cfg.budget_ppl:
            break
        if k == 1:  # over the budget on held-out tokens: fixed targets below the one it chose
            tries += [SparsifyConfig(target=t, **base) for t in SPARSIFY_TARGETS if t < result.target]
    assert result is not None
    notes = []
    if tried[-1]["ladder_ppl_ratio"] > cfg.budget_ppl:
        notes.append(f"no target tried kept the held-out perplexity ratio within {cfg.budget_ppl}; "
                     f"kept the last ({result.target})")
    return {"target": result.target, "site": result.site, "scope": result.scope, "tried": tried,
            "heldout": {k: v for k, v in result.heldout.items() if not k.startswith("per_layer")}}, notes


def phase_log(tier: str, log: Log) -> Callable[[str, int, int], None]:
    """A converter's (phase, done, total) progress as log lines: each phase once when it starts
    and once when it is done, with its elapsed time (log-friendly: no redrawn bar)."""
    state: dict = {"phase": None, "t0": 0.0}

    def progress(phase: str, done: int, total: int) -> None:
        if phase != state["phase"]:
            state["phase"], state["t0"] = phase, time.perf_counter()
            log(f"{tier}: {phase} …")
        if done == total:
            log(f"{tier}: {phase}: {done}/{total} in {time.perf_counter() - state['t0']:.1f} s")

    return progress


def build_alias(src: Path, dst: Path, cfg, log: Log) -> tuple[dict, list[str]]:
    """Post-hoc aliasing at the contract's zone thresholds; the GGUF typed like its input."""
    from convert.alias.run import run_alias

    res = run_alias(str(src), dst.parent / "hf", gguf=dst, like=src, progress=lambda m: log(f"alias: {m}"))
    if res is None:
        return {}, ["alias returned nothing"]
    groups = res.report.get("groups") or []
    return {"groups": len(groups)}, list(res.warnings)


def build_svd_residual(src: Path, dst: Path, cfg, log: Log) -> tuple[dict, list[str]]:
    from convert.svd_residual import SvdResidualConfig, svd_residual

    res = svd_residual(str(src), dst, SvdResidualConfig(samples=cfg.calibration_samples), like=src,
                       progress=lambda m: log(f"svd-residual: {m}"))
    return {"selection": res.config.selection, "bits_per_weight": round(res.bits_per_weight, 3)}, list(res.warnings)


def build_layout(src: Path, dst: Path, cfg, log: Log) -> tuple[dict, list[str]]:
    from convert.layout import LayoutConfig, layout_gguf

    res = layout_gguf(str(src), dst, LayoutConfig(samples=cfg.calibration_samples))
    return {"blocks": res.summary(), "ffn_read_fraction": [round(x, 4) for x in res.ffn_read_fraction]}, []


BUILDERS = {"sparsify": build_sparsify, "alias": build_alias, "svd-residual": build_svd_residual,
            "layout": build_layout}
