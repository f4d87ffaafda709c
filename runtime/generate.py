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
    """The tokenizer embedded in the GGUF, or one from ``tokenizer_dir`` (transformers'). A
    SentencePiece vocabulary is read straight from the file as llama.cpp tokenizes it
    (``aios.models.spm_tokenizer``: 0.3 s where transformers' took 1.4 s from its cache); any other
    is built by transformers once and cached, and a cached one loads as a ``LightTokenizer``
    (``aios.models.light_tokenizer``: same ids and text, no ``import transformers``)."""
    from aios.models.light_tokenizer import load_gguf_tokenizer_light
    from aios.models.spm_tokenizer import load_spm_tokenizer

    try:
        if tokenizer_dir is not None:
            from transformers import AutoTokenizer  # (imports torch: not on the GGUF path)

            return AutoTokenizer.from_pretrained(str(tokenizer_dir))
        return load_spm_tokenizer(gguf_path) or load_gguf_tokenizer_light(gguf_path)
    except Exception as e:  # transformers raises many types for a missing/odd tokenizer
        raise InvalidModelError(
            f"No usable tokenizer in {gguf_path.name} ({str(e).splitlines()[0][:160]}); "
            "pass --tokenizer DIR with a tokenizer.json."
        ) from e


# end-of-turn tokens llama.cpp also ends generation on, by text (llama-vocab.cpp's EOG list)
END_OF_TURN = ("<end_of_turn>", "<|eot_id|>", "<|im_end|>", "<|end|>", "<|endoftext|>", "<|eom_id|>",
               "<|return|>", "<|call|>", "</s>")


def chat_prompt(tok, prompt: str, template: str | None = None) -> str:
    """``prompt`` as one user turn of the model's chat, ready for the reply: the GGUF's own
    ``tokenizer.chat_template`` (or ``template``, a Jinja text) rendered with the generation
    prompt, special tokens as text (tokenize it without adding BOS: the template writes it)."""
    template = template or getattr(tok, "chat_template", None)
    if not template:
        raise UsageError("This model's GGUF has no chat template (tokenizer.chat_template); pass "
                         "--chat-template FILE with a Jinja chat template, or drop --chat.")
    try:
        return tok.apply_chat_template([{"role": "user", "content": prompt}], chat_template=template,
                                       add_generation_prompt=True, tokenize=False)
    except Exception as e:  # jinja2's TemplateError and friends: the template is the user's input
        raise UsageError(f"The chat template does not render: {str(e).splitlines()[0][:160]}.") from e


def stop_ids(tok) -> set[int]:
    """The ids that end a reply: EOS and the vocabulary's end-of-turn tokens."""
    vocab = tok.get_vocab()
    ids = {vocab[t] for t in END_OF_TURN if t in vocab}
    if tok.eos_token_id is not None:
        ids.add(int(tok.eos_token_id))
    return ids


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


def generate(model: Model, prompt_ids: list[int], n: int, *, chunk: int = 512,
             sampling: Sampling = Sampling(), eos: int | set[int] | None = None) -> tuple[list[int], Timing]:
    """Prefill ``prompt_ids`` in chunks, then decode ``n`` tokens (fewer when one of ``eos`` comes,
    which is kept as the last token); bytes counted per phase."""
    stop = {eos} if isinstance(eos, int) else set(eos or ())
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
        if tok in stop:
            break
        if len(out) == n:
            break
        logits = model.forward([tok])
        tm.decode_ffn_nnz += model.ffn_nnz
    tm.decode_s = time.perf_counter() - t0
    tm.generated = max(0, len(out) - 1)  # forwards run during decode (the last token needs none)
    tm.decode_bytes = diff(model.counter.snapshot(), mid)
    return out, tm
