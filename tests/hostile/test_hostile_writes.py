"""Nothing half-written: Ctrl-C in the middle of every conversion, a full disk, and two writers
racing for the same output all leave either nothing or one writer's complete, valid file."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from aios.data import load_texts
from aios.io import DiskFullError, write_atomic

ROOT = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, PYTHONPATH=str(ROOT))


def cli(module: str, *args: str) -> list[str]:
    """argv running ``module``'s click group (console scripts may not be on PATH in tests)."""
    return [sys.executable, "-c", "import importlib, sys; importlib.import_module(sys.argv.pop(1)).main()",
            module, *args]

# Runs a console script in a subprocess with os.fsync patched: at the Nth fsync of a temp
# file (a dot-file: every writer's temp names start with ".") it prints a marker and sleeps,
# so the test can send SIGINT at the last moment before the rename into the final name.
WRAPPER = """
import os, signal, sys, time
# a shell runs background jobs with SIGINT ignored, and Python then keeps it ignored: restore
# the default so the test behaves the same when the suite itself runs in the background
signal.signal(signal.SIGINT, signal.default_int_handler)
_fsync, seen = os.fsync, [0]
def fsync(fd):
    name = os.readlink(f"/proc/self/fd/{fd}")
    if "/." in name:
        seen[0] += 1
        if seen[0] == int(os.environ["AIOS_TEST_FSYNC_AT"]):
            sys.stderr.write(f"AIOS-TEST-FSYNC {name}\\n"); sys.stderr.flush()
            time.sleep(120)
    return _fsync(fd)
os.fsync = fsync
module, sys.argv = sys.argv[1], sys.argv[1:]
import importlib
importlib.import_module(module).main()
"""


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The bundled tiny-falcon-relu (real BPE tokenizer), its F32 GGUF export, calibration texts."""
    from aios.models.aliases import FIXTURES_DIR
    from convert.gguf import GGUFExportConfig, export_gguf

    d = tmp_path_factory.mktemp("models")
    folder = FIXTURES_DIR / "tiny-falcon-relu"
    gguf = d / "falcon.gguf"
    export_gguf(str(folder), gguf, GGUFExportConfig("f32"))
    calib = d / "cal.txt"
    calib.write_text("\n\n".join(load_texts(limit=4)))
    return folder, gguf, calib


def _interrupt(tmp_path: Path, module: str, args: list[str], fsync_at: int = 1) -> tuple[int, str, str]:
    """Run ``module``'s CLI, SIGINT it while its Nth temp file is complete but not renamed."""
    wrapper = tmp_path / "wrapper.py"
    wrapper.write_text(WRAPPER)
    env = dict(ENV, AIOS_TEST_FSYNC_AT=str(fsync_at))
    proc = subprocess.Popen([sys.executable, str(wrapper), module, *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    temp = None
    for line in proc.stderr:  # type: ignore[union-attr]
        if line.startswith("AIOS-TEST-FSYNC "):
            temp = line.split(" ", 1)[1].strip()
            break
    assert temp is not None, f"never reached a temp-file fsync: {proc.communicate()}"
    assert Path(temp).exists(), "the conversion was interrupted mid-way, with its temp file present"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    return proc.returncode, out, err, temp


def _names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def _assert_clean_interrupt(rc, out, err, temp):
    assert rc == 130, (rc, out, err)
    assert "Traceback" not in err and "interrupted" in err
    assert not Path(temp).exists()


def test_sigint_during_gguf_export(models, tmp_path):
    folder, _, _ = models
    outdir = tmp_path / "out"
    outdir.mkdir()
    res = _interrupt(tmp_path, "convert.cli", ["gguf", str(folder), "-o", str(outdir / "m.gguf"), "--outtype", "f32"])
    _assert_clean_interrupt(*res)
    assert _names(outdir) == []


@pytest.mark.slow  # 25-45 s (a measured calibration run first); gguf covers the same finalize path
def test_sigint_during_layout(models, tmp_path):
    _, gguf, calib = models
    outdir = tmp_path / "out"
    outdir.mkdir()
    res = _interrupt(tmp_path, "convert.cli", ["layout", str(gguf), "-o", str(outdir / "l.gguf"),
                                               "--calibration", str(calib), "--max-tokens", "16"])
    _assert_clean_interrupt(*res)
    assert _names(outdir) == []


@pytest.mark.slow  # about 3 minutes on a loaded 2-core machine (a full measured search)
def test_sigint_during_sparsity_map_sidecar_removes_the_map_too(models, tmp_path):
    folder, _, calib = models
    outdir = tmp_path / "out"
    outdir.mkdir()
    # the second temp file is the MAP.json header: the .npz is already in place by then
    res = _interrupt(tmp_path, "convert.cli", ["sparsity-map", str(folder), "--calibration", str(calib),
                                               "--mode", "aggressive", "--budget", "5",
                                               "-o", str(outdir / "m.npz")], fsync_at=2)
    _assert_clean_interrupt(*res)
    assert _names(outdir) == []


@pytest.mark.slow  # about 2.5 minutes: before/after measurements of two relufy runs
def test_sigint_during_relufy_output_then_resume(models, tmp_path):
    from aios.models import resolve_model

    from aios.models.aliases import FIXTURES_DIR

    folder = FIXTURES_DIR / "tiny-falcon"
    out = tmp_path / "relu"
    args = ["relufy", str(folder), "-o", str(out), "--steps", "2", "--batch", "2", "--seq-len", "16", "--l1", "0"]
    res = _interrupt(tmp_path, "convert.cli", args)
    _assert_clean_interrupt(*res)
    assert _names(tmp_path) == ["relu.partial", "wrapper.py"]  # the checkpoint to resume from
    r = subprocess.run(cli("convert.cli", *args, "--resume"), cwd=ROOT, capture_output=True, text=True, env=ENV)
    assert r.returncode == 0, r.stderr
    assert _names(tmp_path) == ["relu", "wrapper.py"]
    assert resolve_model(str(out)).facts.activation == "relu"


# --- a full disk -------------------------------------------------------------------------------


def test_write_atomic_on_a_full_disk_is_one_sentence_and_leaves_nothing(monkeypatch, tmp_path):
    real = os.fsync

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    (tmp_path / "keep.json").write_text("old")
    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(DiskFullError, match="no space is left.*nothing was written") as e:
        write_atomic(tmp_path / "keep.json", "new")
    assert e.value.exit_code == 3
    monkeypatch.setattr(os, "fsync", real)
    assert _names(tmp_path) == ["keep.json"] and (tmp_path / "keep.json").read_text() == "old"


def test_cli_on_a_full_disk_is_one_error_line(monkeypatch, models, tmp_path):
    """gguf-py's writer (not write_atomic) hits ENOSPC: the CLI says so in one line, exit 3."""
    import gguf

    from convert.cli import main

    folder, _, _ = models

    def full(self, *a, **k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(gguf.GGUFWriter, "write_tensors_to_file", full)
    monkeypatch.setattr(gguf.GGUFWriter, "write_tensor_data", full)
    r = CliRunner().invoke(main, ["gguf", str(folder), "-o", str(tmp_path / "m.gguf")])
    assert r.exit_code == 3, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and "no space is left" in lines[0]
    assert _names(tmp_path) == []


@pytest.mark.skipif(subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode != 0,
                    reason="unprivileged user+mount namespaces (for a small tmpfs) are not available")
def test_real_full_tmpfs(models, tmp_path):
    """A real 256 KiB tmpfs (mounted in a user namespace, no root); the F32 export needs ~5 MiB."""
    folder, _, _ = models
    cmd = " ".join(f"'{a}'" for a in cli("convert.cli", "gguf", str(folder), "-o", f"{tmp_path}/m.gguf",
                                           "--outtype", "f32"))
    script = f"mount -t tmpfs -o size=256k tmpfs {tmp_path} && {cmd}; echo rc=$?; ls -A {tmp_path}"
    r = subprocess.run(["unshare", "-rm", "sh", "-c", script], cwd=ROOT, capture_output=True, text=True, env=ENV)
    assert "rc=3" in r.stdout, (r.stdout, r.stderr)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and "no space" in lines[0], r.stderr
    assert r.stdout.strip().endswith("rc=3"), "the tmpfs must be empty afterwards: " + r.stdout


# --- concurrency -------------------------------------------------------------------------------


def test_two_threads_writing_one_file_never_mix(tmp_path):
    target = tmp_path / "report.json"
    payloads = [json.dumps({"writer": w, "pad": str(w) * 200_000}) for w in (0, 1)]
    seen, stop = set(), threading.Event()

    def writer(w):
        for _ in range(40):
            write_atomic(target, payloads[w])

    def reader():
        while not stop.is_set():
            if target.exists():
                seen.add(json.loads(target.read_text())["writer"])  # always one whole payload

    threads = [threading.Thread(target=writer, args=(w,)) for w in (0, 1)]
    rt = threading.Thread(target=reader)
    rt.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    rt.join()
    assert target.read_text() in payloads and seen <= {0, 1}
    assert _names(tmp_path) == ["report.json"]


def test_two_checks_and_two_exports_into_one_folder(models, tmp_path):
    """Concurrent processes: each output is one writer's complete file; no temp file is left."""
    import gguf

    from reports.load import load_check_report

    folder, _, _ = models
    out = tmp_path / "out"
    # built-in aliases without weights: static checks only, so the two runs take seconds
    cmds = [cli("contract.cli", "check", m, "-o", str(out)) for m in ("falcon-7b", "llama-3.1-8b")]
    cmds += [cli("convert.cli", "gguf", str(folder), "-o", str(out / "same.gguf"), "--outtype", t)
             for t in ("f32", "f16")]
    procs = [subprocess.Popen(c, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for c in cmds]
    results = [p.communicate(timeout=300) + (p.returncode,) for p in procs]
    for o, e, rc in results:
        assert rc == 0, e
    assert _names(out) == ["aios-report.json", "aios-report.junit.xml", "aios-report.md", "same.gguf"]
    report = load_check_report(out / "aios-report.json")
    assert report.model["spec"] in ("falcon-7b", "llama-3.1-8b")
    r = gguf.GGUFReader(str(out / "same.gguf"))
    assert {t.tensor_type.name for t in r.tensors if len(t.shape) == 2} in ({"F32"}, {"F16"})
