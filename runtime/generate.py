"""Token generation: tokenizer from the GGUF, chunked prefill, KV-cached decode, sampling."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from aios.errors import InvalidModelError, UsageError
from runtime.accounting import diff
from runtime.model import Model


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.temperature < 0 or self.top_k < 0 or not 0 < self.top_p <= 1:
            raise UsageError("Sampling needs temperature ≥ 0, top-k ≥ 0 and 0 < top-p ≤ 1.")


def sample(logits: np.ndarray, s: Sampling, rng: np.random.Generator) -> int:
    """One token id from a (vocab,) logit vector."""
    if s.temperature == 0:
        return int(np.argmax(logits))
    z = logits.astype(np.float64) / s.temperature
    if s.top_k:
        kth = np.partition(z, -s.top_k)[-s.top_k]
        z = np.where(z < kth, -np.inf, z)
    p = np.exp(z - z.max())
    p /= p.sum()
    if s.top_p < 1:
        order = np.argsort(-p)
        cum = np.cumsum(p[order])
        cut = order[cum - p[order] >= s.top_p]  # drop tokens once the kept mass reaches top_p
        p[cut] = 0
        p /= p.sum()
    return int(rng.choice(len(p), p=p))


def load_tokenizer(gguf_path: Path, tokenizer_dir: Path | None = None):
    """The tokenizer embedded in the GGUF (via transformers), or one from ``tokenizer_dir``."""
    from transformers import AutoTokenizer

    from aios.models.gguf_tokenizer import load_gguf_tokenizer

    try:
        if tokenizer_dir is not None:
            return AutoTokenizer.from_pretrained(str(tokenizer_dir))
        return load_gguf_tokenizer(gguf_path)
    except Exception as e:  # transformers raises many types for a missing/odd tokenizer
        raise InvalidModelError(
            f"No usable tokenizer in {gguf_path.name} ({str(e).splitlines()[0][:160]}); "
            "pass --tokenizer DIR with a tokenizer.json."
        ) from e


@dataclass
class Timing:
    prompt_tokens: int = 0
    generated: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    prefill_bytes: dict[str, int] = field(default_factory=dict)
    decode_bytes: dict[str, int] = field(default_factory=dict)
    decode_ffn_nnz: int = 0

    @property
    def prefill_tps(self) -> float:
        return self.prompt_tokens / self.prefill_s if self.prefill_s else 0.0

    @property
    def decode_tps(self) -> float:
        return self.generated / self.decode_s if self.decode_s else 0.0


def generate(model: Model, prompt_ids: list[int], n: int, *, chunk: int = 64,
             sampling: Sampling = Sampling(), eos: int | None = None) -> tuple[list[int], Timing]:
    """Prefill ``prompt_ids`` in chunks, then decode ``n`` tokens; bytes counted per phase."""
    if not prompt_ids:
        raise UsageError("The prompt is empty after tokenization.")
    if chunk <= 0 or n < 0:
        raise UsageError("--chunk must be positive and -n non-negative.")
    if len(prompt_ids) + n > model.hp.n_ctx:
        raise UsageError(
            f"Prompt ({len(prompt_ids)} tokens) plus {n} new tokens exceed the context of {model.hp.n_ctx}."
        )
    rng = np.random.default_rng(sampling.seed)
    model.reset()
    tm = Timing(prompt_tokens=len(prompt_ids))
    before = model.counter.snapshot()
    t0 = time.perf_counter()
    logits = None
    for c0 in range(0, len(prompt_ids), chunk):
        logits = model.forward(prompt_ids[c0 : c0 + chunk])
    tm.prefill_s = time.perf_counter() - t0
    mid = model.counter.snapshot()
    tm.prefill_bytes = diff(mid, before)
    out: list[int] = []
    t0 = time.perf_counter()
    for _ in range(n):
        tok = sample(logits[-1], sampling, rng)  # type: ignore[index]
        out.append(tok)
        if eos is not None and tok == eos:
            break
        if len(out) == n:
            break
        logits = model.forward([tok])
        tm.decode_ffn_nnz += model.ffn_nnz
    tm.decode_s = time.perf_counter() - t0
    tm.generated = max(0, len(out) - 1)  # forwards run during decode (the last token needs none)
    tm.decode_bytes = diff(model.counter.snapshot(), mid)
    return out, tm
