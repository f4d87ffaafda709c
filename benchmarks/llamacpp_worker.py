"""llama.cpp (llama-cpp-python) in a process of its own, for the benchmarks' timed decode.

Why a separate process:

* llama.cpp's CPU backend runs its threads through OpenMP, the same libgomp that numba's
  threading layer uses, and libgomp reads its wait policy once per process. ``runtime.kernels``
  sets the wait of its own threads at import (OMP_WAIT_POLICY=PASSIVE until 2026-11-25,
  GOMP_SPINCOUNT=3000 since; see the comment there), so a llama.cpp loaded into the same process
  waits that way too. Passive, its threads slept between parallel regions instead of spinning as
  its default lets them: on a 2-core AMD EPYC, Llama-3.1-8B-dims Q4_0, 31.6-32.2 tok/s in our
  process against 33.0-34.4 with spinning allowed (alternated processes). Here it runs with the
  environment it would have on its own: the benchmark's, minus what our runtime set
  (``aios.reference.llamacpp.clean_env``).
* llama.cpp may crash. llama-cpp-python 0.3.36 built natively on a Xeon with AMX segfaults in its
  default extra buffer types (AMX, weight repacking) on quantized files. A crash kills this child,
  not the benchmark: :class:`LlamaCpp` then starts a new child on llama.cpp's plain CPU buffers
  (``use_extra_bufts = False``, its ``--no-repack``) and records that in :attr:`LlamaCpp.config`,
  which every benchmark prints beside its ratios ("llama.cpp default buffers", or "plain
  buffers, default crashed (SIGSEGV)"). A crash on plain buffers too raises
  :class:`aios.reference.llamacpp.LlamaCppCrash`, one line. The same fallback as every one-shot
  call of ``aios.reference.llamacpp`` (``AIOS_LLAMACPP_CRASH=default|all`` injects the crash).

The child imports nothing of the runtime (only ``aios.reference.llamacpp``, which imports nothing
of ours), so it keeps llama.cpp's defaults. Times are measured inside it: its start-up and model
load are never part of a tokens/s figure.

    python benchmarks/llamacpp_worker.py MODEL.gguf REPACK(0|1) THREADS [BATCH [ALL_LOGITS(0|1)]]

REPACK 1 loads on llama.cpp's default buffers, 0 on its plain CPU buffers. It answers one JSON
line {"ready": true, "load_s": ...} after the load and a warm-up decode, then one request per
stdin line: ``N`` decodes N tokens after the benchmarks' prompt and answers one JSON line
{"decode_tok_s": ...}; ``q`` (or end of input) quits. With BATCH > 0 it loads for prompts of up
to BATCH tokens (n_batch = n_ubatch = BATCH) and ``N`` evaluates the prompt of N tokens
(``prompt_tokens``) in one call, answering {"prefill_tok_s": ...}; ALL_LOGITS 1 computes every
prompt token's logits (``logits_all``, as a perplexity window does).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from aios.reference.llamacpp import (DEFAULT, FALLBACKS, LlamaCppCrash, LlamaCppError,  # noqa: E402
                                     no_core_dump, clean_env, exit_text, load, plain_config)

PROMPT = list(range(1, 9))
# the configuration of a deliberate no-repack arm (presets_real_dims.py --llamacpp-no-repack)
PLAIN_ASKED = "plain buffers, as asked (no repack)"

__all__ = ["DEFAULT", "PLAIN_ASKED", "PROMPT", "LlamaCpp", "LlamaCppCrash", "LlamaCppError", "clean_env",
           "decode", "exit_text", "load"]


def decode(llm, n: int) -> dict:
    """Greedy decode of n tokens after PROMPT (and one untimed first step, as ours): tokens/s."""
    import numpy as np

    llm.reset()
    llm.eval(PROMPT)
    tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
    llm.eval([tok])
    t = time.perf_counter()
    for _ in range(n):
        tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        llm.eval([tok])
    return {"decode_tok_s": n / (time.perf_counter() - t)}


class _Died(Exception):
    """The child ended: its return code (None if it did not) and its last line on stderr."""

    def __init__(self, rc: int | None, last: str) -> None:
        super().__init__(rc, last)
        self.rc, self.last = rc, last


class LlamaCpp:
    """llama.cpp on one file in a child process (``threads`` 2 unless given), loaded once; each
    call decodes n tokens there and returns {"decode_tok_s": ...} (``batch`` > 0: each call
    evaluates a prompt of n ≤ batch tokens in one batch, {"prefill_tok_s": ...}).

    ``repack=True`` (llama.cpp's default buffers): if the child dies of a signal, at start-up or
    during a request, a new child loads the file on plain buffers and the request is asked again;
    :attr:`config` then says "plain buffers, default crashed (SIGSEGV)" (with "after N requests
    on default buffers" if some were answered before). ``repack=False`` runs on plain buffers from
    the start (:data:`PLAIN_ASKED`). A crash on plain buffers raises :class:`LlamaCppCrash`; a
    child that exits on its own (bad file) raises :class:`LlamaCppError` with its last line."""

    def __init__(self, path, repack: bool = True, threads: int = 2, batch: int = 0, all_logits: bool = False) -> None:
        self.path, self.threads, self.batch, self.all_logits = Path(path), threads, batch, all_logits
        self.plain = not repack
        self.config = DEFAULT if repack else PLAIN_ASKED
        self.default_crash: str | None = None  # "SIGSEGV" once the default child died of it
        self.requests = 0  # answered on the current configuration
        self.load_s: float | None = None  # the load and warm-up decode, timed in the child
        self.proc: subprocess.Popen | None = None
        self._recorded = False  # the fallback is in aios.reference.llamacpp.FALLBACKS
        self._start()

    # --- the child's life -------------------------------------------------------------------

    def _spawn(self) -> None:
        self.proc = subprocess.Popen([sys.executable, __file__, str(self.path), "0" if self.plain else "1",
                                      str(self.threads), str(self.batch), "1" if self.all_logits else "0"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env=clean_env(), preexec_fn=no_core_dump)

    def _start(self) -> None:
        while True:
            self._spawn()
            try:
                ready = self._read()
            except _Died as d:
                self._died(d)  # raises unless it can go on on plain buffers
                continue
            self.load_s = ready.get("load_s")
            if self.default_crash and not self._recorded:  # listed once it runs on plain buffers
                FALLBACKS.append({"op": "decode worker", "file": str(self.path), "config": self.config,
                                  "test": os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]})
                self._recorded = True
            return

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            try:
                rc = self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:  # stdout closed but still running: ours to end
                self.proc.kill()
                self.proc.wait()
                rc = None
            err = self.proc.stderr.read().strip().splitlines()
            raise _Died(rc, err[-1] if err else "")
        return json.loads(line)

    def _died(self, d: _Died) -> None:
        """After the child ended: raise, or switch to plain buffers (the caller starts again)."""
        name = self.path.name
        if d.rc is None or d.rc >= 0:
            raise LlamaCppError(f"llama.cpp worker {exit_text(d.rc)} on {name}: {d.last or 'nothing on stderr'}")
        if self.plain:
            before = f" (default buffers: killed by {self.default_crash})" if self.default_crash else ""
            raise LlamaCppCrash(f"llama.cpp worker {exit_text(d.rc)} on {name} on its plain CPU buffers"
                                f"{' too' if self.default_crash else ''}{before}")
        self.default_crash = exit_text(d.rc).removeprefix("killed by ")
        self.config = plain_config(d.rc)
        if self.requests:
            self.config += f" after {self.requests} request{'s' if self.requests > 1 else ''} on default buffers"
        self.plain = True
        self.requests = 0

    # --- requests ---------------------------------------------------------------------------

    def __call__(self, n: int) -> dict:
        while True:
            try:
                try:
                    self.proc.stdin.write(f"{n}\n")
                    self.proc.stdin.flush()
                except BrokenPipeError:
                    pass  # it died since the last answer: the read below says how
                answer = self._read()
            except _Died as d:
                self._died(d)
                self._start()
                continue
            self.requests += 1
            return answer

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.proc.stdin.write("q\n")
                self.proc.stdin.close()
            except BrokenPipeError:
                pass
            self.proc.wait(timeout=60)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown: the child ends with its stdin
            pass


def prompt_tokens(n: int, vocab: int) -> list[int]:
    """The prefill benchmarks' prompt: ``n`` fixed pseudo-random ids in [1, min(vocab, 20000)),
    the same list in this child and in ours (benchmarks/prefill_vs_llamacpp.py)."""
    import numpy as np

    return [int(t) for t in np.random.default_rng(0).integers(1, min(vocab, 20000), n)]


def prefill(llm, n: int, vocab: int) -> dict:
    """One prompt of ``n`` tokens evaluated in one call from an empty context (logits of the last
    token only, llama.cpp's default for a prompt): tokens/s."""
    toks = prompt_tokens(n, vocab)
    llm.reset()
    t = time.perf_counter()
    llm.eval(toks)
    return {"prefill_tok_s": n / (time.perf_counter() - t)}


def main() -> None:
    path, repack, threads = sys.argv[1], sys.argv[2] == "1", int(sys.argv[3])
    batch = int(sys.argv[4]) if len(sys.argv) > 4 else 0  # > 0: prompts of up to this many tokens
    all_logits = len(sys.argv) > 5 and sys.argv[5] == "1"  # every prompt token's logits (perplexity)
    t = time.perf_counter()
    if batch:  # one ubatch per prompt, as llama-bench's pp test (n_batch = n_ubatch = prompt)
        llm = load(path, plain=not repack, n_ctx=batch + 16, n_threads=threads, n_threads_batch=threads,
                   n_batch=batch, n_ubatch=batch, logits_all=all_logits)
        prefill(llm, 16, llm.n_vocab())
    else:
        llm = load(path, plain=not repack, n_ctx=256, n_threads=threads, n_batch=8, logits_all=True)
        decode(llm, 2)
    print(json.dumps({"ready": True, "load_s": time.perf_counter() - t}), flush=True)
    for line in sys.stdin:
        if line.strip() in ("", "q"):
            break
        if batch:
            print(json.dumps(prefill(llm, int(line), llm.n_vocab())), flush=True)
        else:
            print(json.dumps(decode(llm, int(line))), flush=True)


if __name__ == "__main__":
    main()
