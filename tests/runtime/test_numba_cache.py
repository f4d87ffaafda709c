"""numba's cache folder, chosen by ``runtime`` on import: one per content of runtime/'s sources
(an edited kernel compiles afresh), under $AIOS_CACHE; a NUMBA_CACHE_DIR the user set stays."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import runtime

ROOT = Path(__file__).resolve().parents[2]
# where a kernel of each kind of module caches, and what the environment says, in a fresh process
PROBE = """
import json, os, sys
if sys.argv[1] == "numba-first":
    import numba  # numba's config read the environment before runtime chose
import numba
from runtime import kernels
print(json.dumps({"kernel": kernels.quantize_q8._cache.cache_path, "config": numba.config.CACHE_DIR,
                  "env": os.environ.get("NUMBA_CACHE_DIR"), "chosen": os.environ.get("AIOS_NUMBA_CACHE_DIR")}))
"""


def _probe(env: dict[str, str], order: str = "runtime-first") -> dict:
    base = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", runtime.CHOSEN_ENV, "AIOS_CACHE")}
    res = subprocess.run([sys.executable, "-c", PROBE, order], env={**base, **env}, cwd=ROOT,
                         capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_the_key_follows_the_sources_only(tmp_path):
    (tmp_path / "kernels").mkdir()
    (tmp_path / "a.py").write_text("from numba import njit\n")
    (tmp_path / "kernels" / "b.py").write_text("y = 2  # njit\n")
    key = runtime.sources_key(tmp_path)
    assert len(key) == 16 and runtime.sources_key(tmp_path) == key
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "c.py").write_text("z = 3\n")
    (tmp_path / "kernels" / "notes.txt").write_text("not a source")
    (tmp_path / ".#a.py").symlink_to(tmp_path / "missing")  # an editor's lock link
    assert runtime.sources_key(tmp_path) == key
    (tmp_path / "plain.py").write_text("import numpy\n")  # no compiled code: not in the key
    assert runtime.sources_key(tmp_path) == key
    (tmp_path / "kernels" / "b.py").write_text("y = 3  # njit\n")
    assert runtime.sources_key(tmp_path) != key
    assert runtime.numba_cache_dir().name == f"{runtime.sources_key()}-{runtime.machine_key()}"


def test_kernels_cache_under_the_folder_of_these_sources(tmp_path):
    want = str(tmp_path / "numba" / f"{runtime.sources_key()}-{runtime.machine_key()}")
    for order in ("runtime-first", "numba-first"):
        got = _probe({"AIOS_CACHE": str(tmp_path)}, order)
        assert got["config"] == got["env"] == got["chosen"] == want, (order, got)
        assert got["kernel"].startswith(want + os.sep), (order, got)
    # a child of a process that chose (for other sources, maybe) chooses again for its own
    got = _probe({"AIOS_CACHE": str(tmp_path), "NUMBA_CACHE_DIR": str(tmp_path / "other"),
                  runtime.CHOSEN_ENV: str(tmp_path / "other")})
    assert got["config"] == got["env"] == want, got


def test_a_users_numba_cache_dir_stays(tmp_path):
    user = str(tmp_path / "mine")
    got = _probe({"AIOS_CACHE": str(tmp_path), "NUMBA_CACHE_DIR": user})
    assert got["config"] == got["env"] == user and got["chosen"] is None, got
    assert got["kernel"].startswith(user + os.sep)


def test_prune_keeps_the_recent_and_the_recently_used(tmp_path):
    now = time.time()
    folders = []
    for i in range(runtime.KEEP + 4):  # the oldest last
        p = tmp_path / f"{i:016x}"
        p.mkdir()
        age = 0 if i < 2 else runtime.KEEP_DAYS * 86400 + 3600 * i
        os.utime(p, (now - age, now - age))
        folders.append(p)
    (tmp_path / "not-a-key").mkdir()
    current = folders[-1]  # in use by this process, however old its stamp
    runtime.prune(tmp_path, current)
    left = sorted(p.name for p in tmp_path.iterdir())
    # KEEP - 1 most recent besides the current one stay (two of them used lately), older ones go
    assert left == sorted([f.name for f in folders[:runtime.KEEP - 1]] + [current.name, "not-a-key"])


def test_a_fresh_cache_is_announced_before_the_first_pass(tmp_path, monkeypatch):
    """One line names the types that compile when this sources' cache folder holds no index yet;
    none once it does (the first aios-run on a fresh install is not a silent minute)."""
    import runtime

    monkeypatch.setattr(runtime, "numba_cache_dir", lambda: tmp_path / "numba" / "k")
    line = runtime.compile_notice({"Q6_K", "q4_k"})
    assert line.startswith("compiling kernels for Q4_K/Q6_K (first run") and str(tmp_path) in line
    (tmp_path / "numba" / "k" / "kernels_x").mkdir(parents=True)
    (tmp_path / "numba" / "k" / "kernels_x" / "mm.py311.nbi").write_bytes(b"")
    assert runtime.compile_notice({"Q4_K"}) is None


def test_the_notice_without_types_and_in_bench_and_check(tmp_path, monkeypatch):
    """bench (several files) and check (a GGUF) announce the compile too, before any file loads."""
    import runtime

    monkeypatch.setattr(runtime, "numba_cache_dir", lambda: tmp_path / "numba" / "k")
    assert runtime.compile_notice(()).startswith("compiling kernels (first run")
    import inspect

    from contract import cli as ccli
    from runtime import cli as rcli

    assert "notice_compile(None)" in inspect.getsource(rcli.bench.callback)
    assert "compile_notice(())" in inspect.getsource(ccli.check.callback)


def test_another_cpu_or_version_opens_another_folder(monkeypatch):
    """The folder is keyed on the CPU's features and the numba/llvmlite/Python versions too: a cache
    written on another CPU (other flags: other instructions compiled in) or by another numba is
    never the one this process opens."""
    import importlib.metadata as md

    here = runtime.numba_cache_dir()
    desc = runtime.cpu_description()
    assert "flags" in desc or not Path("/proc/cpuinfo").exists()
    monkeypatch.setattr(runtime, "cpu_description", lambda: desc.replace("avx2", "").replace("amx_tile", ""))
    assert runtime.numba_cache_dir() != here and runtime.numba_cache_dir().parent == here.parent
    monkeypatch.undo()
    real = md.version
    monkeypatch.setattr(md, "version", lambda name: "0.0.1" if name == "numba" else real(name))
    assert runtime.numba_cache_dir() != here
    monkeypatch.undo()
    assert runtime.numba_cache_dir() == here


RUN = """
import sys, numpy as np
from runtime.model import Model
np.save(sys.argv[2], Model(sys.argv[1], arithmetic="float").forward(list(range(3, 19)), all_logits=True))
"""


def test_two_processes_compiling_at_once_on_a_fresh_cache(tmp_path):
    """Two processes on an empty cache compile the same kernels at once: both finish, with the same
    logits, and leave the cache that a third process loads."""
    from tests.conftest import write_gguf

    model = write_gguf(tmp_path / "m.gguf")
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", runtime.CHOSEN_ENV)}
    env["AIOS_CACHE"] = str(tmp_path / "cache")
    procs = [subprocess.Popen([sys.executable, "-c", RUN, str(model), str(tmp_path / f"l{i}.npy")], env=env,
                              cwd=ROOT, stderr=subprocess.PIPE, text=True) for i in range(2)]
    for p in procs:
        _, err = p.communicate(timeout=900)
        assert p.returncode == 0, err[-2000:]
    import numpy as np

    a, b = np.load(tmp_path / "l0.npy"), np.load(tmp_path / "l1.npy")
    assert np.array_equal(a, b)
    folder = next((tmp_path / "cache" / "numba").iterdir())
    assert list(folder.rglob("*.nbi"))
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-c", RUN, str(model), str(tmp_path / "l2.npy")], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=900, check=False)
    assert res.returncode == 0, res.stderr[-2000:]
    assert np.array_equal(np.load(tmp_path / "l2.npy"), a)
    assert time.perf_counter() - t0 < 60  # loaded, not compiled again
