"""llama.cpp as a reference in a child process: a crash there falls back to plain CPU buffers
or fails one test with one line, and never ends the test run (aios.reference.llamacpp).

The crash is injected (AIOS_LLAMACPP_CRASH), so the fallback is exercised on every machine, not
only on the AMX Xeons where llama.cpp's default buffers really crash on quantized files."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from aios.models.aliases import FIXTURES_DIR
from aios.reference import llamacpp

pytest.importorskip("llama_cpp")

IDS = list(range(5, 25))
REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def f32(tmp_path_factory) -> Path:
    from convert.gguf import GGUFExportConfig, export_gguf

    path = tmp_path_factory.mktemp("ref") / "tiny-llama.f32.gguf"
    export_gguf(str(FIXTURES_DIR / "tiny-llama"), path, GGUFExportConfig("f32"))
    return path


def test_default_buffers_when_nothing_crashes(f32, monkeypatch):
    monkeypatch.delenv(llamacpp.CRASH_ENV, raising=False)
    before = len(llamacpp.FALLBACKS)
    r = llamacpp.logits(f32, IDS, n_ctx=64, n_threads=1)
    assert r.config == llamacpp.DEFAULT and r.default_crash is None
    assert r.value.shape == (len(IDS), 2048) and np.isfinite(r.value).all()
    assert len(llamacpp.FALLBACKS) == before


def test_a_crash_on_default_buffers_falls_back_to_plain_ones_and_says_so(f32, monkeypatch):
    monkeypatch.delenv(llamacpp.CRASH_ENV, raising=False)
    want = llamacpp.logits(f32, IDS, n_ctx=64, n_threads=1).value
    monkeypatch.setenv(llamacpp.CRASH_ENV, "default")
    r = llamacpp.logits(f32, IDS, n_ctx=64, n_threads=1)
    assert r.config == "plain buffers, default crashed (SIGSEGV)" and r.default_crash == "SIGSEGV"
    np.testing.assert_allclose(r.value, want, rtol=0, atol=1e-4 * np.abs(want).max())
    assert llamacpp.greedy(f32, IDS, 4, n_ctx=64, n_threads=1).config.startswith("plain buffers")
    # the run's summary lists this test (tests/conftest.py)
    assert llamacpp.FALLBACKS[-1]["test"].endswith("test_a_crash_on_default_buffers_falls_back_to_plain_ones_and_says_so")
    assert llamacpp.FALLBACKS[-1]["file"] == str(f32)


def test_a_crash_on_plain_buffers_too_is_one_line_naming_file_and_signal(f32, monkeypatch):
    monkeypatch.setenv(llamacpp.CRASH_ENV, "all")
    with pytest.raises(llamacpp.LlamaCppCrash) as e:
        llamacpp.logits(f32, IDS, n_ctx=64)
    assert str(e.value) == ("llama.cpp killed by SIGSEGV on tiny-llama.f32.gguf (logits) on its plain CPU buffers "
                            "too (default buffers: killed by SIGSEGV)")
    # a vocabulary-only load builds no compute buffers: nothing to crash
    assert llamacpp.tokenize(f32, ["a b"], add_bos=False, special=False).config == llamacpp.DEFAULT


def test_a_file_llama_cpp_refuses_is_an_error_not_a_crash(tmp_path, monkeypatch):
    monkeypatch.delenv(llamacpp.CRASH_ENV, raising=False)
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 60)
    err = llamacpp.load_error(bad)
    assert err is not None and err.startswith("llama.cpp refused bad.gguf (load): ") and "\n" not in err
    with pytest.raises(llamacpp.LlamaCppError, match="refused bad.gguf"):
        llamacpp.logits(bad, IDS)


def test_exit_text():
    assert llamacpp.exit_text(-11) == "killed by SIGSEGV"
    assert llamacpp.exit_text(-9) == "killed by SIGKILL"
    assert llamacpp.exit_text(1) == "exited with status 1"
    assert llamacpp.exit_text(None) == "did not finish"


def test_the_child_runs_without_our_openmp_setting(monkeypatch):
    import runtime.kernels as K

    monkeypatch.setattr(K, "OMP_SET_HERE", ("GOMP_SPINCOUNT",))
    monkeypatch.setenv("GOMP_SPINCOUNT", "3000")
    monkeypatch.setenv("OMP_PROC_BIND", "false")  # the user's own setting stays
    env = llamacpp.clean_env()
    assert "GOMP_SPINCOUNT" not in env and env["OMP_PROC_BIND"] == "false"


def test_quantize_rows_matches_the_file_quantizer_bytes(f32):
    """llama.cpp's row encoder through the child: Q8_0 rows of a fixture matrix, decoded by gguf-py."""
    import gguf

    x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    r = llamacpp.quantize_rows(x, "q8_0", int(gguf.GGMLQuantizationType.Q8_0), 2 * 34)
    y = gguf.dequantize(r.value, gguf.GGMLQuantizationType.Q8_0).reshape(x.shape)
    assert r.value.shape == (4, 68) and np.abs(x - y).max() <= np.abs(x).max() / 127 * 0.51 + 1e-6
    assert r.seconds > 0


@pytest.mark.parametrize("inject, outcome", [("default", "1 passed"), ("all", "1 failed")])
def test_an_injected_crash_never_ends_a_test_run(f32, tmp_path, inject, outcome):
    """A pytest run whose one test asks llama.cpp for a reference that crashes: with the crash on
    default buffers only, the test passes on plain ones and the summary names it; on both, that
    test fails with the one line and the run still ends with its summary."""
    test = tmp_path / "test_ref.py"
    test.write_text(textwrap.dedent(f"""
        from aios.reference import llamacpp

        def test_reference():
            assert len(llamacpp.greedy({str(f32)!r}, list(range(5, 25)), 3, n_ctx=64).value) == 3
    """))
    env = {**llamacpp.clean_env(), llamacpp.CRASH_ENV: inject}
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(REPO),
                          "-c", str(REPO / "pyproject.toml"), "--confcutdir", str(REPO / "tests"),
                          "-p", "tests.conftest", str(test)],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    out = res.stdout + res.stderr
    assert outcome in out, out
    if inject == "default":
        assert res.returncode == 0, out
        assert "llama.cpp references on plain CPU buffers" in out and "::test_reference" in out
    else:
        assert res.returncode == 1, out
        assert "LlamaCppCrash: llama.cpp killed by SIGSEGV on tiny-llama.f32.gguf (greedy)" in out
