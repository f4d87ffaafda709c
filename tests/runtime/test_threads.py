"""``--threads``: the kernels' thread count on generate and bench, a threading layer that
spins only briefly before it sleeps (OpenMP's default spin collapses decode when another
process uses a core: measured 12-30 tok/s spinning vs 900-1280 passive on the tiny fixture),
and small work on one thread (a sleeping thread's wake-up costs more than it saves)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import numba
import pytest
from click.testing import CliRunner

from aios.errors import UsageError
from runtime import kernels as K
from runtime.kernels import threads
from runtime.cli import main


def test_set_threads_applies_and_defaults_to_physical_cores():
    pool, before = numba.config.NUMBA_NUM_THREADS, numba.get_num_threads()
    try:
        assert K.set_threads(1) == 1 and numba.get_num_threads() == 1
        assert K.set_threads(None) == min(K.physical_cores(), pool) == numba.get_num_threads()
        for bad in (0, pool + 1):
            with pytest.raises(UsageError, match="outside 1..") as e:
                K.set_threads(bad)
            assert "NUMBA_NUM_THREADS" in str(e.value)
    finally:
        numba.set_num_threads(before)


def test_openmp_spins_briefly_unless_the_user_chose():
    code = ("import runtime.kernels as K, os; "
            "print(os.environ.get('GOMP_SPINCOUNT'), os.environ.get('OMP_WAIT_POLICY'), K.OMP_SET_HERE)")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}

    def run(**extra):
        return subprocess.run([sys.executable, "-c", code], env={**env, **extra}, capture_output=True,
                              text=True, check=True).stdout.strip()

    assert run() == f"{K.SPIN_COUNT} None ('GOMP_SPINCOUNT',)"
    assert run(OMP_WAIT_POLICY="PASSIVE") == "None PASSIVE ()"  # the user's policy stays theirs
    assert run(GOMP_SPINCOUNT="50") == "50 None ()"


def test_small_work_runs_on_one_thread():
    """``threads_for``: one thread below SERIAL_BYTES, the set_threads count above; before any
    set_threads call, numba's setting at the first call is the count above."""
    pool, before = numba.config.NUMBA_NUM_THREADS, numba.get_num_threads()
    if pool < 2:
        pytest.skip("numba's pool has one thread here")
    try:
        K.set_threads(2)
        K.threads_for(K.SERIAL_BYTES - 1)
        assert numba.get_num_threads() == 1
        K.threads_for(K.SERIAL_BYTES)
        assert numba.get_num_threads() == 2
        K.set_threads(1)
        K.threads_for(10 * K.SERIAL_BYTES)
        assert numba.get_num_threads() == 1
        threads._THREADS.update(want=0, now=0)  # library use: no set_threads call
        numba.set_num_threads(2)
        K.threads_for(10)
        assert numba.get_num_threads() == 1
        K.threads_for(10 * K.SERIAL_BYTES)
        assert numba.get_num_threads() == 2
    finally:
        numba.set_num_threads(before)
        threads._THREADS.update(want=0, now=0)


def test_generate_and_bench_take_threads(exported, tmp_path):
    path, _ = exported("tiny-falcon", "f32")
    before = numba.get_num_threads()
    try:
        res = CliRunner().invoke(main, ["generate", str(path), "-p", "x", "-n", "2", "--threads", "1"])
        assert res.exit_code == 0, res.output
        assert "1 thread" in res.stdout and numba.get_num_threads() == 1
        res = CliRunner().invoke(main, ["generate", str(path), "-p", "x", "--threads", "999"])
        assert res.exit_code == 2 and "--threads 999" in res.stderr
        out = tmp_path / "bench"
        res = CliRunner().invoke(main, ["bench", str(path), "--prompt-tokens", "4", "-n", "2", "--no-project",
                                        "--threads", "1", "-o", str(out)])
        assert res.exit_code == 0, res.output
        assert json.loads((out / "aios-bench.json").read_text())["settings"]["threads"] == 1
    finally:
        numba.set_num_threads(before)


def test_llamacpp_worker_runs_without_our_openmp_setting(exported, monkeypatch):
    """The benchmarks' llama.cpp runs in a child whose environment lacks what runtime.kernels set
    (libgomp is one per process: in ours, llama.cpp's threads would wait as ours do), and
    answers decode requests there, on llama.cpp's default buffers when nothing crashes."""
    pytest.importorskip("llama_cpp")
    from aios.reference import llamacpp

    worker = _worker_module()
    assert worker.clean_env is llamacpp.clean_env and worker.exit_text is llamacpp.exit_text  # one copy
    monkeypatch.delenv(llamacpp.CRASH_ENV, raising=False)
    monkeypatch.setattr(K, "OMP_SET_HERE", ("GOMP_SPINCOUNT",))
    monkeypatch.setenv("GOMP_SPINCOUNT", K.SPIN_COUNT)
    monkeypatch.setenv("OMP_PROC_BIND", "false")  # the user's own setting stays
    env = worker.clean_env()
    assert "GOMP_SPINCOUNT" not in env and env["OMP_PROC_BIND"] == "false"
    path, _ = exported("tiny-falcon", "f32")
    lc = worker.LlamaCpp(path, threads=1)
    try:
        assert lc(3)["decode_tok_s"] > 0
        assert lc.config == llamacpp.DEFAULT and lc.default_crash is None and lc.load_s > 0
    finally:
        lc.close()
    assert lc.proc.returncode == 0


def _worker_module():
    import importlib.util
    from pathlib import Path

    src = Path(__file__).resolve().parents[2] / "benchmarks" / "llamacpp_worker.py"
    spec = importlib.util.spec_from_file_location("llamacpp_worker", src)
    worker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(worker)
    return worker


def test_llamacpp_worker_names_the_signal_a_crash_died_of(tmp_path, monkeypatch):
    """A llama.cpp that crashes in its child prints nothing: the benchmarks' error says how the
    child ended instead of "no output" (seen on a Xeon where llama-cpp-python segfaulted at load),
    and a child that exits on its own (a file it refuses) is an error with its last line, not a
    crash to fall back from."""
    from aios.reference import llamacpp

    worker = _worker_module()
    assert worker.exit_text(-11) == "killed by SIGSEGV"
    assert worker.exit_text(1) == "exited with status 1"
    monkeypatch.delenv(llamacpp.CRASH_ENV, raising=False)
    lc = worker.LlamaCpp.__new__(worker.LlamaCpp)
    lc.path, lc.plain, lc.default_crash, lc.requests = tmp_path / "m.gguf", True, None, 0
    # SIGKILL: no handler can print anything (a SIGSEGV child might, under PYTHONFAULTHANDLER)
    lc.proc = subprocess.Popen([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with pytest.raises(llamacpp.LlamaCppCrash,
                       match="^llama.cpp worker killed by SIGKILL on m.gguf on its plain CPU buffers$"):
        lc(1)
    lc.proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit('no model here')"],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with pytest.raises(llamacpp.LlamaCppError,
                       match="^llama.cpp worker exited with status 1 on m.gguf: no model here$"):
        lc(1)
    if llamacpp.available():  # the real child on a file that is no GGUF: refused, not crashed
        bad = tmp_path / "bad.gguf"
        bad.write_bytes(b"GGUF" + b"\0" * 60)
        with pytest.raises(llamacpp.LlamaCppError) as e:
            worker.LlamaCpp(bad, threads=1)
        assert not isinstance(e.value, llamacpp.LlamaCppCrash)
        msg = str(e.value)
        assert msg.startswith("llama.cpp worker exited with status 1 on bad.gguf: ") and "\n" not in msg


def test_llamacpp_worker_restarts_on_plain_buffers_after_a_crash_and_says_so(exported, monkeypatch):
    """A llama.cpp that dies of a signal on its default buffers (AIOS_LLAMACPP_CRASH=default, as
    llama-cpp-python built natively on AMX Xeons does on quantized files) is started again on its
    plain CPU buffers, answers there, and the worker names that configuration; crashing on plain
    buffers too (=all) is one LlamaCppCrash line, not a hang."""
    pytest.importorskip("llama_cpp")
    from aios.reference import llamacpp

    worker = _worker_module()
    path, _ = exported("tiny-falcon", "f32")
    monkeypatch.setenv(llamacpp.CRASH_ENV, "default")  # the worker's children inherit it
    lc = worker.LlamaCpp(path, threads=1)
    try:
        assert lc(2)["decode_tok_s"] > 0
        assert lc.config == "plain buffers, default crashed (SIGSEGV)" and lc.default_crash == "SIGSEGV"
        assert lc.plain and llamacpp.FALLBACKS[-1]["config"] == lc.config
    finally:
        lc.close()
    assert lc.proc.returncode == 0
    # a crash during a request: the request is asked again of a child on plain buffers
    monkeypatch.delenv(llamacpp.CRASH_ENV)
    lc = worker.LlamaCpp(path, threads=1)
    try:
        assert lc(2)["decode_tok_s"] > 0 and lc.config == llamacpp.DEFAULT
        os.kill(lc.proc.pid, signal.SIGSEGV)  # the child this test started
        lc.proc.wait()
        assert lc(2)["decode_tok_s"] > 0
        assert lc.config == "plain buffers, default crashed (SIGSEGV) after 1 request on default buffers"
    finally:
        lc.close()
    # a deliberate no-repack arm runs on plain buffers from the start: no crash, and it says so
    plain = worker.LlamaCpp(path, repack=False, threads=1)
    try:
        assert plain(2)["decode_tok_s"] > 0 and plain.config == worker.PLAIN_ASKED
    finally:
        plain.close()
    monkeypatch.setenv(llamacpp.CRASH_ENV, "all")
    with pytest.raises(llamacpp.LlamaCppCrash) as e:
        worker.LlamaCpp(path, threads=1)
    assert str(e.value) == (f"llama.cpp worker killed by SIGSEGV on {path.name} on its plain CPU buffers too "
                            "(default buffers: killed by SIGSEGV)")
    assert isinstance(e.value, RuntimeError) and "\n" not in str(e.value)


@pytest.mark.parametrize("content", [None, '{"rows": 1}', "not json"])
def test_presets_benchmark_table_of_a_bad_results_file_is_one_sentence(tmp_path, content):
    import subprocess
    import sys
    from pathlib import Path

    res = tmp_path / "results.json"
    if content is not None:
        res.write_text(content)
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "presets_real_dims.py"
    r = subprocess.run([sys.executable, str(script), "--table", str(res)], capture_output=True, text=True)
    assert r.returncode == 1
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and str(res) in lines[0], r.stderr
