"""llama.cpp's dense decode of the ladder's source file, timed in a child process of its own.

Each call runs one child (``python llamacpp_decode.py``): it loads the file with llama-cpp-python
(``aios.reference.llamacpp.load``), decodes two untimed tokens after the prompt (warm-up), then
times ``n`` greedy decode steps and prints one JSON line {"decode_tok_s": ...}. Load and warm-up
are never part of the figure. A child that dies of a signal on llama.cpp's default buffers is run
again on its plain CPU buffers (``use_extra_bufts=False``, its ``--no-repack``), and the
configuration says so (docs: the AMX Xeon crash of llama-cpp-python 0.3.36). The child runs with
the caller's environment minus the OpenMP settings our kernels made for their own threads
(``aios.reference.llamacpp.clean_env``); this module imports nothing of the runtime.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass

CHILD_TIMEOUT_S = 900.0


class LlamaCppUnavailable(Exception):
    """llama.cpp could not run the source (not installed, refused the file, crashed twice)."""


@dataclass
class LlamaCppDecode:
    """Timed decodes of ``path`` by llama.cpp, on ``threads`` threads and a context of ``n_ctx``."""

    path: str
    threads: int
    n_ctx: int
    plain: bool = False
    config: str = ""
    failed: str | None = None  # why llama.cpp could not run (the comparison stopped there)

    def describe(self) -> dict:
        """llama.cpp's configuration, named in the report."""
        try:
            from importlib.metadata import version

            v = version("llama_cpp_python")
        except Exception:  # noqa: BLE001 - metadata names vary by build
            v = None
        from aios.reference.llamacpp import DEFAULT

        return {"engine": "llama.cpp via llama-cpp-python", "llama_cpp_python": v, "threads": self.threads,
                "n_ctx": self.n_ctx, "n_batch": 512, "buffers": self.config or DEFAULT,
                "decode": "greedy, one token per llama_decode, dense (stock llama.cpp ignores aios.* keys)",
                "file": self.path, "failed": self.failed}

    def __call__(self, ids: list[int], n: int) -> float:
        """Decode tokens/s of one child run (default buffers, plain after a crash)."""
        from aios.reference.llamacpp import (
            DEFAULT,
            available,
            clean_env,
            exit_text,
            no_core_dump,
            plain_config,
        )

        if not available():
            raise LlamaCppUnavailable("llama-cpp-python is not installed (pip install -e '.[test]'); "
                                      "pass --no-llamacpp to skip the comparison.")
        while True:
            args = [sys.executable, __file__, self.path, "1" if self.plain else "0", str(self.threads),
                    str(self.n_ctx), json.dumps([int(i) for i in ids]), str(n)]
            try:
                proc = subprocess.run(args, capture_output=True, text=True, env=clean_env(), check=False,
                                      preexec_fn=no_core_dump, timeout=CHILD_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                raise LlamaCppUnavailable(f"llama.cpp did not finish a decode of {self.path} in "
                                          f"{CHILD_TIMEOUT_S:.0f} s") from None
            if proc.returncode < 0 and not self.plain:  # died of a signal: plain buffers from now on
                self.plain, self.config = True, plain_config(proc.returncode)
                continue
            lines = proc.stdout.strip().splitlines()
            if proc.returncode != 0 or not lines:
                last = (proc.stderr.strip().splitlines() or ["nothing on stderr"])[-1]
                raise LlamaCppUnavailable(f"llama.cpp {exit_text(proc.returncode)} on {self.path}: {last[:200]}")
            self.config = self.config or DEFAULT
            return float(json.loads(lines[-1])["decode_tok_s"])


def child(path: str, plain: bool, threads: int, n_ctx: int, ids: list[int], n: int) -> dict:
    import numpy as np

    from aios.reference.llamacpp import load

    llm = load(path, plain=plain, n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, logits_all=False)
    try:
        llm.reset()
        llm.eval(ids)
        for _ in range(2):  # warm-up, untimed (as our runtime's first steps)
            llm.eval([int(np.argmax(llm.scores[llm.n_tokens - 1]))])
        llm.reset()
        llm.eval(ids)
        t = time.perf_counter()
        for _ in range(n):
            llm.eval([int(np.argmax(llm.scores[llm.n_tokens - 1]))])
        return {"decode_tok_s": n / (time.perf_counter() - t)}
    finally:
        llm.close()


if __name__ == "__main__":
    a = sys.argv[1:]
    print(json.dumps(child(a[0], a[1] == "1", int(a[2]), int(a[3]), json.loads(a[4]), int(a[5]))), flush=True)
