"""``--threads``: the kernels' thread count on generate and bench, a threading layer that
spins only briefly before it sleeps (OpenMP's default spin collapses decode when another
process uses a core: measured 12-30 tok/s spinning vs 900-1280 passive on the tiny fixture),
and small work on one thread (a sleeping thread's wake-up costs more than it saves)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numba
import pytest
from click.testing import CliRunner

from aios.errors import UsageError
from runtime import kernels as K
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
        K._THREADS.update(want=0, now=0)  # library use: no set_threads call
        numba.set_num_threads(2)
        K.threads_for(10)
        assert numba.get_num_threads() == 1
        K.threads_for(10 * K.SERIAL_BYTES)
        assert numba.get_num_threads() == 2
    finally:
        numba.set_num_threads(before)
        K._THREADS.update(want=0, now=0)


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
    answers decode requests there."""
    pytest.importorskip("llama_cpp")
    worker = _worker_module()
    monkeypatch.setattr(K, "OMP_SET_HERE", ("GOMP_SPINCOUNT",))
    monkeypatch.setenv("GOMP_SPINCOUNT", K.SPIN_COUNT)
    monkeypatch.setenv("OMP_PROC_BIND", "false")  # the user's own setting stays
    env = worker.clean_env()
    assert "GOMP_SPINCOUNT" not in env and env["OMP_PROC_BIND"] == "false"
    path, _ = exported("tiny-falcon", "f32")
    lc = worker.LlamaCpp(path)
    try:
        assert lc(3)["decode_tok_s"] > 0
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


def test_llamacpp_worker_names_the_signal_a_crash_died_of():
    """A llama.cpp that crashes in its child prints nothing: the benchmarks' error says how the
    child ended instead of "no output" (seen on a Xeon where llama-cpp-python segfaulted at load)."""
    import subprocess
    import sys

    worker = _worker_module()
    assert worker.exit_text(-11) == "killed by SIGSEGV"
    assert worker.exit_text(1) == "exited with status 1"
    lc = worker.LlamaCpp.__new__(worker.LlamaCpp)
    # SIGKILL: no handler can print anything (a SIGSEGV child might, under PYTHONFAULTHANDLER)
    lc.proc = subprocess.Popen([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with pytest.raises(RuntimeError, match="llama.cpp worker killed by SIGKILL: nothing on stderr"):
        lc._read()
    lc.proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit('no model here')"],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with pytest.raises(RuntimeError, match="llama.cpp worker exited with status 1: no model here"):
        lc._read()


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
