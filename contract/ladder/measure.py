"""What the ladder measures on each rung, by running its file in aios-run's engine, and what the
checker projects for it.

Per rung (all ``measured`` unless labelled): the byte counter's MB/token by term (weights by
matrix kind, KV cache, activations) over ``decode_tokens`` greedy decode steps after a prompt of
held-out text; decode tokens/s of our runtime in the rung's best mode beside llama.cpp's dense
decode of the *source* file, alternated round by round (ours, llama.cpp; then llama.cpp, ours; ...)
with the median of the per-round ratios; the held-out perplexity (aios/data/heldout.jsonl, one
EOS-separated stream, windows of 128 tokens); the exact-zero fraction of FFN activations during
the decode; and ``aios-contract check``'s tier and *projected* MB/token (at the same context),
compared term by term with the measured ledger.
"""

from __future__ import annotations

import re
import statistics
from pathlib import Path

import numpy as np

from aios.errors import AiosError

WINDOW = 128  # perplexity window (the converters' protocol)
TOLERANCE = 0.05  # projected vs measured: a term differing by more than this is explained
_ROLE = re.compile(r"^blk\.\d+\.([a-z_]+?)(?:\.(?:weight|t|lr_u|lr_v|residual|delta|canonical).*)?$")


def prompt_ids(tok, n: int) -> list[int]:
    """The first ``n`` tokens of the bundled held-out passages (the bench's prompt)."""
    from aios.data import load_heldout

    ids: list[int] = []
    for passage in load_heldout():
        ids += tok(passage + "\n\n", add_special_tokens=False, verbose=False)["input_ids"]
        if len(ids) >= n:
            break
    return ids[:n]


def heldout_stream(tok, n: int) -> list[int]:
    """The first ``n`` tokens of the held-out texts as one EOS-separated stream."""
    from aios.data import load_heldout

    ids: list[int] = []
    for text in load_heldout():
        if tok.eos_token_id is not None:
            ids.append(tok.eos_token_id)
        ids += tok(text, add_special_tokens=False, verbose=False)["input_ids"]
        if len(ids) >= n:
            break
    return ids[:n]


def heldout_perplexity(path: Path, tokens: int) -> float:
    """Held-out perplexity of ``path`` as the ladder measures every rung (thresholds applied: the
    runtime applies them in every mode)."""
    from runtime.generate import load_tokenizer
    from runtime.model import Model
    from runtime.perplexity import perplexity

    ids = heldout_stream(load_tokenizer(path), tokens)
    model = Model(path, mode="dense", n_ctx=WINDOW + 1)
    return perplexity(model, ids, window=min(WINDOW, max(2, len(ids))))["perplexity"]


def weight_kind(name: str, tied: bool) -> str:
    """The matrix kind a counted tensor belongs to: head, embedding, attn_q, ffn_down, ...
    (neuron-major, low-rank and alias parts fold into the matrix they stand for)."""
    if name.startswith("output."):
        return "head"
    if name.startswith("token_embd"):
        return "head (tied embedding)" if tied else "embedding"
    m = _ROLE.match(name)
    if m:
        return m.group(1)
    return "other"


def best_mode(path: Path) -> str:
    """``sparse`` where the file has exact zeros to skip (thresholds or a ReLU-family FFN), else
    ``dense`` (the source rung is always run dense)."""
    from runtime.model import RELU_FAMILY, Model

    m = Model(path, mode="dense", n_ctx=64)
    if m.thresholds is None and m.hp.activation not in RELU_FAMILY:
        return "dense"
    try:
        Model(path, mode="sparse", n_ctx=64)
    except AiosError:
        return "dense"
    return "sparse"


def ledger(model, ids: list[int], n: int) -> dict:
    """MB/token by term and weights by kind over ``n`` greedy decode steps after ``ids``."""
    model.reset()
    logits = model.forward(ids)
    model.counter.reset()
    nnz = 0
    for _ in range(n):
        logits = model.forward([int(np.argmax(logits[-1]))])
        nnz += model.ffn_nnz
    per_term = {k: v / n / 1e6 for k, v in model.counter.snapshot().items()}
    names = set(model.counter.per_tensor)
    tied = not any(t.startswith("output.") for t in names)
    kinds: dict[str, float] = {}
    for name, b in model.counter.per_tensor.items():
        k = weight_kind(name, tied)
        kinds[k] = kinds.get(k, 0.0) + b / n / 1e6
    hp = model.hp
    return {"mb_per_token": {k: round(v, 6) for k, v in per_term.items()},
            "mb_per_token_total": round(sum(per_term.values()), 6),
            "weights_by_kind": {k: round(v, 6) for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])},
            "exact_zero_fraction": round(1 - nnz / max(1, n * hp.n_layers * hp.d_ffn), 4)}


def measure_rung(path: Path, mode: str, cfg, llama=None, log=lambda m: None) -> dict:
    """Run ``path`` in aios-run's engine (``mode``) and, with ``llama`` (a
    :class:`~contract.ladder.llamacpp_decode.LlamaCppDecode` of the source), alternate timed rounds
    with it (a llama.cpp failure ends the comparison, recorded in ``llama.failed``)."""
    from contract.ladder.llamacpp_decode import LlamaCppUnavailable
    from runtime.generate import generate, load_tokenizer
    from runtime.model import Model
    from runtime.perplexity import perplexity

    tok = load_tokenizer(path)
    ids = prompt_ids(tok, cfg.prompt_tokens)
    n = cfg.decode_tokens
    model = Model(path, mode=mode, n_ctx=max(len(ids) + n + 8, WINDOW + 1))
    generate(model, ids[:8], 2)  # warm-up: kernels load or compile
    out = {"evidence": "measured", "mode": mode, "prompt_tokens": len(ids), "decode_tokens": n,
           **ledger(model, ids, n)}
    ours: list[float] = []
    theirs: list[float] = []
    for r in range(cfg.rounds):
        for side in (("ours", "llama.cpp") if r % 2 == 0 else ("llama.cpp", "ours")):
            if side == "ours":
                ours.append(generate(model, ids, n)[1].decode_tps)
            elif llama is not None and not llama.failed:
                try:
                    theirs.append(llama(ids, n))
                except LlamaCppUnavailable as e:  # the comparison stops, the ladder goes on
                    llama.failed = str(e)
                    log(f"llama.cpp: {e}")
    out["decode_tok_s"] = round(statistics.median(ours), 3)
    out["decode_tok_s_rounds"] = [round(x, 3) for x in ours]
    if theirs:
        out["llamacpp_tok_s"] = round(statistics.median(theirs), 3)
        out["llamacpp_tok_s_rounds"] = [round(x, 3) for x in theirs]
        out["ratio_vs_llamacpp"] = round(statistics.median(a / b for a, b in zip(ours, theirs)), 4)
    ppl_ids = heldout_stream(tok, cfg.heldout_tokens)
    res = perplexity(model, ppl_ids, window=min(WINDOW, max(2, len(ppl_ids))))  # = heldout_perplexity
    out["perplexity"] = round(res["perplexity"], 4)
    out["perplexity_tokens"] = res["tokens_scored"]
    log(f"{path.name} [{mode}]: {out['mb_per_token_total']:.4f} MB/token, {out['decode_tok_s']:.1f} tok/s"
        + (f" (llama.cpp {out['llamacpp_tok_s']:.1f})" if theirs else "") + f", perplexity {out['perplexity']}")
    return out


def check_rung(path: Path, context: int, samples: int) -> dict:
    """``aios-contract check``'s tier and projection for ``path`` (R1 on ``samples`` calibration
    texts of 64 tokens, as ``aios-run bench`` asks it); an error is reported, not raised."""
    from contract.check import check_model

    try:
        rep = check_model(str(path), samples=samples, max_tokens=64, context=context)
    except AiosError as e:
        return {"error": e.message}
    except Exception as e:  # noqa: BLE001 - an unexpected model quirk: the ladder goes on
        return {"error": f"{e.__class__.__name__}: {str(e)[:200]}"}
    p = rep.projection
    out: dict = {"tier": rep.tier, "tier_name": rep.tier_name,
                 "requirements": {r.id: r.status.value for r in rep.requirements}}
    if p is not None:
        terms = {t.term: round(t.projected_bytes / 1e6, 6) for t in p.terms}
        out["projection"] = {"evidence": "projected", "context": p.context, "terms": terms,
                             "mb_per_token_total": p.projected_mb_per_token,
                             "spec_projected_reduction": p.spec_projected_reduction}
    return out


# the projection's terms (contract/projection.py) gathered onto the byte counter's three terms by
# their names' start, so a term the projection adds (e.g. attention outside the core zone) is counted
PROJECTED_PREFIX = {"weights": "weights", "kv_cache": "kv", "activations": "activation"}
WHY = {
    "weights": "the projection counts every stored weight byte and skips FFN rows at the checker's measured zero "
               "fraction (R1 on calibration texts); the counter reads what the decode really skipped",
    "kv_cache": "the projection reads the whole cache at its context (L × H_kv × d_head × C × 4); the counter "
                "reads the positions filled so far and writes each new entry",
    "activations": "the projection counts no activation traffic when R4's footprint fits L2; the counter counts "
                   "every intermediate vector written and read back between kernels",
}


def compare(measured: dict, projection: dict | None) -> dict | None:
    """Projected beside measured MB/token, term by term; terms differing by > 5 % explained."""
    if not projection:
        return None
    terms = []
    for term, prefix in PROJECTED_PREFIX.items():
        proj = sum(v for t, v in projection["terms"].items() if t.lower().startswith(prefix))
        meas = measured["mb_per_token"].get(term, 0.0)
        diff = (proj - meas) / meas if meas else (0.0 if not proj else None)
        off = diff is None or abs(diff) > TOLERANCE
        terms.append({"term": term, "measured_mb": round(meas, 6), "projected_mb": round(proj, 6),
                      "difference": None if diff is None else round(diff, 4), "differs": off,
                      "why": WHY[term] if off else ""})
    total_p, total_m = projection["mb_per_token_total"], measured["mb_per_token_total"]
    total = (total_p - total_m) / total_m if total_m else None
    return {"measured_mb_per_token": total_m, "projected_mb_per_token": total_p,
            "difference": None if total is None else round(total, 4),
            "differs": total is None or abs(total) > TOLERANCE,
            "terms_differing": [t["term"] for t in terms if t["differs"]], "terms": terms}
