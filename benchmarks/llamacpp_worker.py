"""llama.cpp (llama-cpp-python) in a process of its own, for the benchmarks' side-by-side runs.

Why a separate process: llama.cpp's CPU backend runs its threads through OpenMP, the same
libgomp that numba's threading layer uses, and libgomp reads its wait policy once per process.
``runtime.kernels`` sets the wait of its own threads at import (OMP_WAIT_POLICY=PASSIVE until
2026-11-25, GOMP_SPINCOUNT=3000 since; see the comment there), so a llama.cpp loaded into the same
process waits that way too. Passive, its threads slept between parallel regions instead of
spinning as its default lets them: on a 2-core AMD EPYC, Llama-3.1-8B-dims Q4_0, 31.6-32.2 tok/s
in our process against 33.0-34.4 with spinning allowed (alternated processes). Here it runs with
the environment it would have on its own: the benchmark's, minus what our runtime set.

This module imports nothing of the runtime, so a child that runs it keeps llama.cpp's defaults.

    python benchmarks/llamacpp_worker.py MODEL.gguf REPACK(0|1) THREADS

then one request per stdin line: ``N`` decodes N tokens after the benchmarks' prompt and answers
one JSON line {"decode_tok_s": ...}; ``q`` (or end of input) quits.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

PROMPT = list(range(1, 9))


def llama(path, repack: bool = True, **kw):
    """llama_cpp.Llama(model_path=path, **kw), with llama.cpp's weight repacking on (its
    default) or off. On x86 with AVX2 llama.cpp copies Q4_0, Q4_K and IQ4_NL weights at load
    into row-interleaved layouts ("CPU_REPACK" extra buffers) that its GEMV reads faster: RSS
    1.4-1.7 × a Q4_0 file and a longer load (2-core AMD EPYC, Llama-3.1-8B and Falcon-7B dims). Off
    (``use_extra_bufts = false``, llama.cpp's --no-repack), it reads every weight in place from
    the mmap, the contract aios-run keeps. The high-level Llama has no parameter for it, so its
    default model parameters are wrapped for the one call."""
    import llama_cpp.llama as L

    orig = L.llama_cpp.llama_model_default_params

    def params():
        p = orig()
        p.use_extra_bufts = bool(repack)
        return p

    L.llama_cpp.llama_model_default_params = params
    try:
        return L.Llama(model_path=str(path), **kw)
    finally:
        L.llama_cpp.llama_model_default_params = orig


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


def exit_text(rc: int | None) -> str:
    """How a child ended, for a one-line error: "exited with status 1", "killed by SIGSEGV"
    (a crash inside llama.cpp prints nothing of its own: on a 16-core Xeon, 2026-11-26,
    llama-cpp-python built there died so at every model load), or "failed" if still running."""
    if rc is None:
        return "failed"
    if rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exited with status {rc}"


def clean_env() -> dict:
    """This process's environment without the OpenMP settings ``runtime.kernels`` made for its
    own threads (the user's own settings stay)."""
    env = dict(os.environ)
    for key in sys.modules["runtime.kernels"].OMP_SET_HERE if "runtime.kernels" in sys.modules else ():
        env.pop(key, None)
    return env


class LlamaCpp:
    """llama.cpp on one file in a child process (``--threads`` 2 unless given), loaded once;
    each call decodes n tokens there and returns {"decode_tok_s": ...}."""

    def __init__(self, path, repack: bool = True, threads: int = 2) -> None:
        self.proc = subprocess.Popen([sys.executable, __file__, str(path), str(int(repack)), str(threads)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env=clean_env())
        self._read()  # "ready" after the load and a warm-up decode

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            err = self.proc.stderr.read().strip().splitlines()
            try:
                rc = self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                rc = None
            raise RuntimeError(f"llama.cpp worker {exit_text(rc)}: {err[-1] if err else 'nothing on stderr'}")
        return json.loads(line)

    def __call__(self, n: int) -> dict:
        self.proc.stdin.write(f"{n}\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.write("q\n")
            self.proc.stdin.close()
            self.proc.wait(timeout=60)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown: the child ends with its stdin
            pass


def main() -> None:
    path, repack, threads = sys.argv[1], sys.argv[2] == "1", int(sys.argv[3])
    llm = llama(path, repack, n_ctx=256, n_threads=threads, n_batch=8, logits_all=True, verbose=False)
    decode(llm, 2)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        if line.strip() in ("", "q"):
            break
        print(json.dumps(decode(llm, int(line))), flush=True)


if __name__ == "__main__":
    main()
