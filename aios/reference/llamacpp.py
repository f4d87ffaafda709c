"""llama.cpp as a reference, in a child process that may die.

Every comparison with llama.cpp (tests, benchmarks, fixture builders) goes through this module.
Each call runs llama.cpp (llama-cpp-python) in a fresh child process, so a crash inside llama.cpp
kills the child, never the test run or the benchmark that asked.

Why: llama-cpp-python 0.3.36 built natively on a Xeon with AMX (``amx_tile``, ``amx_int8``)
dies inside its default *extra buffer types* (the AMX and weight-repacking CPU buffers) on
quantized files (Q4_0, Q8_0, Q4_K_M, IQ4, every Gemma 3 file: SIGSEGV on one such Xeon, SIGILL
in ``ggml_backend_amx_mul_mat`` on another); F32/F16 files run. Loaded into the pytest process, the first such file ended the whole run with no summary. The same build with its
plain CPU buffers (``llama_model_params.use_extra_bufts = False``, llama.cpp's ``--no-repack``)
computes these files correctly. So a call first runs llama.cpp as it comes (default buffers);
if the child dies of a signal, it runs again on plain buffers and the result says so
(:attr:`Result.config`). A crash on plain buffers too raises :class:`LlamaCppCrash`, one line
naming the file and the signal.

What the plain buffers change: llama.cpp reads every weight in place from the mmap and runs its
generic CPU kernels (AVX-512 VNNI / AVX2 int8 dot products). Its AMX tiles (prompt processing on
quantized files) and its repacked Q4_0/Q4_K/IQ4_NL layouts (faster GEMV) are off, so a speed
ratio against plain buffers is not a ratio against llama.cpp's best on that CPU.

Crash injection, so the fallback is tested on any machine: ``AIOS_LLAMACPP_CRASH=default`` makes
the child kill itself with SIGSEGV where it would load a model on default buffers;
``AIOS_LLAMACPP_CRASH=all`` on plain buffers too.

The child half of this file (``_serve`` and below) imports nothing of ours: it runs as a script,
with the environment the caller had minus the OpenMP settings ``runtime.kernels`` made for its
own threads (libgomp reads them once per process; see benchmarks/llamacpp_worker.py).
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT = "llama.cpp default buffers"
PLAIN = "plain buffers"
CRASH_ENV = "AIOS_LLAMACPP_CRASH"
TIMEOUT_S = 1800.0  # one call: the largest presets benchmark file loads and runs in minutes


class LlamaCppError(RuntimeError):
    """llama.cpp could not do what was asked (it refused the file, or it is not installed)."""


class LlamaCppCrash(LlamaCppError):
    """llama.cpp died of a signal on its plain CPU buffers too."""


@dataclass(frozen=True)
class Result:
    """What a call returned, and which llama.cpp configuration produced it."""

    value: Any
    config: str  # DEFAULT, or "plain buffers, default crashed (SIGSEGV)"
    default_crash: str | None = None  # the signal the default configuration died of
    seconds: float = 0.0  # time the operation itself took in the child (load included)


# Every call of this process that fell back to plain buffers: {"op", "file", "config", "test"};
# tests/conftest.py lists them at the end of a run (the closing notes name them).
FALLBACKS: list[dict] = []


def available() -> bool:
    """llama-cpp-python is installed (the test extra builds it)."""
    import importlib.util

    return importlib.util.find_spec("llama_cpp") is not None


def exit_text(rc: int | None) -> str:
    """How a child ended, for one line: "killed by SIGSEGV", "exited with status 1", or "did not
    finish" while it still runs (a crash inside llama.cpp prints nothing of its own)."""
    if rc is None:
        return "did not finish"
    if rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exited with status {rc}"


def plain_config(rc: int) -> str:
    """The configuration a run on plain buffers reports after the default one ended with return
    code ``rc`` (negative: the signal): "plain buffers, default crashed (SIGSEGV)". For callers
    that keep their own llama.cpp process (benchmarks/llamacpp_worker.py, a benchmark's own child)
    and fall back as :func:`call` does."""
    return f"{PLAIN}, default crashed ({exit_text(rc).removeprefix('killed by ')})"


def clean_env() -> dict[str, str]:
    """This process's environment without the OpenMP settings ``runtime.kernels`` made for its
    own threads (the user's own settings stay)."""
    env = dict(os.environ)
    kernels = sys.modules.get("runtime.kernels")
    for key in getattr(kernels, "OMP_SET_HERE", ()):
        env.pop(key, None)
    return env


def no_core_dump() -> None:
    """In a child about to run llama.cpp: a crash writes no core file (a multi-GB model mapped)."""
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _run_child(request: dict, timeout: float) -> tuple[int | None, Any, str]:
    """(return code, the child's answer or None, the last line it wrote to stderr)."""
    with tempfile.TemporaryDirectory(prefix="aios-llamacpp-") as tmp:
        req, out = Path(tmp) / "request.pkl", Path(tmp) / "answer.pkl"
        req.write_bytes(pickle.dumps(request))
        try:
            proc = subprocess.run([sys.executable, __file__, str(req), str(out)], env=clean_env(),
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                  timeout=timeout, preexec_fn=no_core_dump)
        except subprocess.TimeoutExpired as e:
            tail = (e.stderr or b"").decode(errors="replace").strip().splitlines()
            return None, None, tail[-1] if tail else ""
        tail = proc.stderr.decode(errors="replace").strip().splitlines()
        answer = pickle.loads(out.read_bytes()) if out.exists() else None
        return proc.returncode, answer, tail[-1] if tail else ""


def call(op: str, path: str | os.PathLike | None = None, *, timeout: float = TIMEOUT_S, plain_only: bool = False,
         **args: Any) -> Result:
    """Run ``op`` (see ``_OPS``) on ``path`` in a child: default buffers first, plain buffers if
    that child died of a signal (``plain_only``: plain buffers only, where the default ones
    would repack the weights and sum otherwise). Raises :class:`LlamaCppCrash` if the plain one
    dies too, and :class:`LlamaCppError` if llama.cpp refused (the child's own one-line error)."""
    if not available():
        raise LlamaCppError("llama-cpp-python is not installed (pip install -e '.[test]' builds it)")
    name = Path(path).name if path is not None else op
    crash: int | None = None  # the default child's return code when it died of a signal
    for plain in (True,) if plain_only else (False, True):
        rc, answer, last = _run_child({"op": op, "path": None if path is None else str(path), "plain": plain,
                                       "args": args}, timeout)
        if rc is not None and rc < 0:  # died of a signal: llama.cpp crashed (or was killed)
            if plain:
                raise LlamaCppCrash(f"llama.cpp {exit_text(rc)} on {name} ({op}) on its plain CPU buffers too "
                                    f"(default buffers: {exit_text(crash)})")
            crash = rc
            continue
        if rc is None:
            raise LlamaCppError(f"llama.cpp did not finish {op} on {name} within {timeout:.0f} s")
        if answer is None:
            raise LlamaCppError(f"llama.cpp worker {exit_text(rc)} on {name} ({op}): {last or 'nothing on stderr'}")
        if "error" in answer:
            raise LlamaCppError(f"llama.cpp refused {name} ({op}): {answer['error']}")
        if plain_only:
            return Result(answer["value"], PLAIN, None, answer["seconds"])
        if crash is None:
            return Result(answer["value"], DEFAULT, None, answer["seconds"])
        sig = exit_text(crash).removeprefix("killed by ")
        config = f"{PLAIN}, default crashed ({sig})"
        FALLBACKS.append({"op": op, "file": str(path), "config": config,
                          "test": os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]})
        return Result(answer["value"], config, sig, answer["seconds"])
    raise AssertionError("unreachable")


# --- what callers ask for ---------------------------------------------------------------------


def logits(path, ids, *, window: int | None = None, plain_only: bool = False, **llama_kw) -> Result:
    """llama.cpp's logits (len(ids), vocab) at every position of ``ids``; with ``window``, in
    windows of that many tokens, each from a fresh context (as ``runtime.perplexity`` scores);
    ``plain_only``: on its plain buffers. ``llama_kw`` go to ``llama_cpp.Llama`` (n_ctx,
    n_batch, n_threads, type_k, ...)."""
    return call("logits", path, plain_only=plain_only, ids=[int(i) for i in ids], window=window, llama_kw=llama_kw)


def greedy(path, ids, n: int, *, plain_only: bool = False, **llama_kw) -> Result:
    """The ``n`` tokens llama.cpp picks greedily after ``ids`` (a list of ints); ``plain_only``:
    on its plain buffers."""
    return call("greedy", path, plain_only=plain_only, ids=[int(i) for i in ids], n=n, llama_kw=llama_kw)


def tokenize(path, texts: list[str], *, add_bos: bool, special: bool) -> Result:
    """llama.cpp's token ids for each text, from the vocabulary stored in ``path``."""
    return call("tokenize", path, texts=list(texts), add_bos=add_bos, special=special)


def detokenize(path, seqs: list[list[int]], *, special: bool) -> Result:
    """llama.cpp's bytes for each id sequence."""
    return call("detokenize", path, seqs=[[int(i) for i in s] for s in seqs], special=special)


def load_error(path, **llama_kw) -> str | None:
    """None when llama.cpp loads ``path`` (and evaluates one token), else its error."""
    try:
        call("load", path, llama_kw=llama_kw)
    except LlamaCppCrash:
        raise
    except LlamaCppError as e:
        return str(e)
    return None


def quantize(src, dst, ftype: int | str, nthread: int | None = None) -> Result:
    """llama.cpp's ``llama_model_quantize`` of the GGUF ``src`` into ``dst`` with ``ftype`` (a
    ``llama_ftype`` value, or a preset name such as "Q4_K_M")."""
    return call("quantize", src, dst=str(dst), ftype=ftype, nthread=nthread)


def quantize_rows(x, type_name: str, qtype: int, row_bytes: int, imatrix=None) -> Result:
    """The rows of ``x`` (n_rows, n_cols) as llama.cpp's ``ggml_quantize_chunk`` encodes them in
    ggml type ``qtype``: (n_rows, row_bytes) uint8."""
    import numpy as np

    return call("quantize_rows", None, x=np.ascontiguousarray(x, np.float32), qtype=int(qtype),
                row_bytes=int(row_bytes), imatrix=None if imatrix is None else np.ascontiguousarray(imatrix, np.float32),
                type_name=type_name)


def quantize_rows_timed(x, type_name: str, qtype: int, row_bytes: int, imatrix=None) -> Result:
    """:func:`quantize_rows` for a benchmark: ``value`` is (the rows, the seconds the encoding
    alone took in the child). ``Result.seconds`` also counts importing llama-cpp-python there
    (~0.2 s), which would swamp the encoding of a small tensor."""
    import numpy as np

    return call("quantize_rows_timed", None, x=np.ascontiguousarray(x, np.float32), qtype=int(qtype),
                row_bytes=int(row_bytes), imatrix=None if imatrix is None else np.ascontiguousarray(imatrix, np.float32),
                type_name=type_name)


def graph_tensors(path, ids, names, *, plain_only: bool = False, **llama_kw) -> Result:
    """The float32 graph tensors ``names`` (last write of each) as llama.cpp evaluates ``ids`` in
    one batch, by name ("attn_norm-0", "Qcur-0", ...); ``plain_only``: on its plain buffers."""
    return call("graph_tensors", path, plain_only=plain_only, ids=[int(i) for i in ids], names=sorted(names),
                llama_kw=llama_kw)


def load(path, *, plain: bool = False, **llama_kw):
    """``llama_cpp.Llama(model_path=path, **llama_kw)`` in *this* process, on default or plain
    CPU buffers. For the benchmarks' worker processes only: anything that may crash belongs in a
    child (``call``). The high-level Llama has no parameter for the buffers, so its default
    model parameters are wrapped for the one call."""
    import llama_cpp.llama as L

    inject = os.environ.get(CRASH_ENV, "")
    if not llama_kw.get("vocab_only") and (inject == "all" or (inject == "default" and not plain)):
        os.kill(os.getpid(), signal.SIGSEGV)  # the crash the fallback is for, on demand
    orig = L.llama_cpp.llama_model_default_params

    def params():
        p = orig()
        if plain:
            p.use_extra_bufts = False
        return p

    L.llama_cpp.llama_model_default_params = params
    try:
        return L.Llama(model_path=str(path), **{"verbose": False, **llama_kw})
    finally:
        L.llama_cpp.llama_model_default_params = orig


# --- the child ---------------------------------------------------------------------------------


def _op_logits(path, plain, ids, window, llama_kw):
    import numpy as np

    llm = load(path, plain=plain, logits_all=True, **llama_kw)
    try:
        out = []
        step = window or len(ids)
        for w0 in range(0, len(ids), step):
            chunk = ids[w0 : w0 + step]
            llm.reset()
            llm.eval(chunk)
            out.append(np.array(llm.scores[: len(chunk)], np.float32))
        return np.concatenate(out)
    finally:
        llm.close()


def _op_greedy(path, plain, ids, n, llama_kw):
    import numpy as np

    llm = load(path, plain=plain, logits_all=True, **llama_kw)
    try:
        out = []
        llm.eval(ids)
        for _ in range(n):
            t = int(np.argmax(llm.scores[llm.n_tokens - 1]))
            out.append(t)
            llm.eval([t])
        return out
    finally:
        llm.close()


def _op_tokenize(path, plain, texts, add_bos, special):
    llm = load(path, plain=plain, vocab_only=True)
    try:
        return [llm.tokenize(t.encode(), add_bos=add_bos, special=special) for t in texts]
    finally:
        llm.close()


def _op_detokenize(path, plain, seqs, special):
    llm = load(path, plain=plain, vocab_only=True)
    try:
        return [llm.detokenize(s, special=special) for s in seqs]
    finally:
        llm.close()


def _op_load(path, plain, llama_kw):
    llm = load(path, plain=plain, **llama_kw)
    try:
        llm.eval([0])
    finally:
        llm.close()
    return True


def _op_quantize(path, plain, dst, ftype, nthread):
    import ctypes

    import llama_cpp

    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype = getattr(llama_cpp, "LLAMA_FTYPE_MOSTLY_" + ftype) if isinstance(ftype, str) else int(ftype)
    if nthread is not None:
        p.nthread = nthread
    rc = llama_cpp.llama_model_quantize(str(path).encode(), str(dst).encode(), ctypes.byref(p))
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize returned {rc}")
    return str(dst)


def _op_quantize_rows(path, plain, x, qtype, row_bytes, imatrix, type_name):
    import ctypes

    import llama_cpp
    import numpy as np

    lib = ctypes.CDLL(str(Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"))
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                        ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    lib.ggml_quantize_init.argtypes = [ctypes.c_int]
    n_rows, n_cols = x.shape
    out = np.zeros((n_rows, row_bytes), np.uint8)
    lib.ggml_quantize_init(qtype)
    n = lib.ggml_quantize_chunk(qtype, x.ctypes.data, out.ctypes.data, 0, n_rows, n_cols,
                                None if imatrix is None else imatrix.ctypes.data)
    if n != out.nbytes:
        raise RuntimeError(f"ggml_quantize_chunk wrote {n} bytes for {type_name}, expected {out.nbytes}")
    return out


def _op_quantize_rows_timed(path, plain, **kw):
    import time

    import llama_cpp  # noqa: F401 - imported (and its libraries loaded) before the clock starts

    t0 = time.perf_counter()
    out = _op_quantize_rows(path, plain, **kw)
    return out, time.perf_counter() - t0


def _op_graph_tensors(path, plain, ids, names, llama_kw):
    import ctypes

    import llama_cpp
    import numpy as np
    from llama_cpp._internals import LlamaContext

    class GGMLTensor(ctypes.Structure):  # the head of ggml.h's struct ggml_tensor
        _fields_ = [("type", ctypes.c_int32), ("buffer", ctypes.c_void_p), ("ne", ctypes.c_int64 * 4),
                    ("nb", ctypes.c_size_t * 4), ("op", ctypes.c_int32), ("op_params", ctypes.c_int32 * 16),
                    ("flags", ctypes.c_int32), ("src", ctypes.c_void_p * 10), ("view_src", ctypes.c_void_p),
                    ("view_offs", ctypes.c_size_t), ("data", ctypes.c_void_p), ("name", ctypes.c_char * 64)]

    wanted, got = set(names), {}

    @llama_cpp.ggml_backend_sched_eval_callback
    def cb(t, ask, _):
        tt = GGMLTensor.from_address(t)
        name = tt.name.decode()
        if ask:
            return name in wanted
        if tt.type == 0:  # GGML_TYPE_F32
            base = np.ctypeslib.as_array((ctypes.c_float * 1).from_address(tt.data))
            got[name] = np.array(np.lib.stride_tricks.as_strided(base, shape=list(tt.ne)[::-1],
                                                                  strides=list(tt.nb)[::-1]))
        return True

    kw = {"n_ctx": len(ids), "n_batch": len(ids), **llama_kw}
    llm = load(path, plain=plain, **kw)
    try:
        llm.context_params.cb_eval = cb
        llm._ctx.close()
        llm._ctx = LlamaContext(model=llm._model, params=llm.context_params, verbose=False)
        llm.reset()
        llm.eval(list(ids))
    finally:
        llm.close()
    return got


_OPS = {"logits": _op_logits, "greedy": _op_greedy, "tokenize": _op_tokenize, "detokenize": _op_detokenize,
        "load": _op_load, "quantize": _op_quantize, "quantize_rows": _op_quantize_rows,
        "quantize_rows_timed": _op_quantize_rows_timed, "graph_tensors": _op_graph_tensors}


def _serve(request_file: str, answer_file: str) -> None:
    """The child: one request in, one answer out (written atomically: no answer file means it
    died before it finished)."""
    import time

    req = pickle.loads(Path(request_file).read_bytes())
    t0 = time.perf_counter()
    try:
        value = _OPS[req["op"]](req["path"], req["plain"], **req["args"])
        answer = {"value": value, "seconds": time.perf_counter() - t0}
    except Exception as e:  # noqa: BLE001 - llama.cpp's refusal goes back to the caller as one line
        answer = {"error": f"{type(e).__name__}: {e}".strip().splitlines()[0]}
    tmp = Path(answer_file + ".tmp")
    tmp.write_bytes(pickle.dumps(answer))
    os.replace(tmp, answer_file)


if __name__ == "__main__":
    _serve(sys.argv[1], sys.argv[2])
