"""``aios.io``'s file digests: the one helper the converters' provenance uses."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from aios import io


def test_sha256_file_matches_hashlib_across_chunk_boundaries(tmp_path, monkeypatch):
    data = bytes(range(256)) * 37  # not a multiple of the chunk size
    p = tmp_path / "blob.bin"
    p.write_bytes(data)
    want = hashlib.sha256(data).hexdigest()
    assert io.sha256_file(p) == want
    monkeypatch.setattr(io, "HASH_CHUNK", 1000)
    assert io.sha256_file(str(p)) == want


def test_sha256_file_of_an_empty_file(tmp_path):
    p = tmp_path / "empty"
    p.write_bytes(b"")
    assert io.sha256_file(p) == hashlib.sha256(b"").hexdigest()


def test_hash_file_continues_a_running_digest(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(b"alpha")
    b.write_bytes(b"beta")
    h = hashlib.sha256(b"a\0")
    assert io.hash_file(h, a) is h
    io.hash_file(h, b)
    assert h.hexdigest() == hashlib.sha256(b"a\0alphabeta").hexdigest()


def _rss_anon_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssAnon"))


def test_sparse_zeros_is_zeroed_writable_and_shaped():
    import numpy as np

    a = io.sparse_zeros((3, 5, 7))
    assert a.shape == (3, 5, 7) and a.dtype == np.float32 and a.flags.c_contiguous and a.flags.writeable
    assert not a.any()
    a[2, 4, 6] = 1.5
    assert a.sum() == 1.5
    assert io.sparse_zeros((0, 4)).shape == (0, 4)
    assert io.sparse_zeros((2,), "int32").dtype == np.int32


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads RssAnon from /proc (Linux)")
def test_sparse_zeros_makes_only_written_pages_resident():
    """One value written in each of 32 stretches 8 MiB apart costs 32 small pages, where
    np.zeros' advised huge pages (transparent huge pages on ``madvise`` or ``always``) would
    cost 32 × 2 MiB: the KV cache's first token (runtime.model)."""
    a = io.sparse_zeros((32, 2 << 20))  # 256 MiB, untouched
    before = _rss_anon_kib()
    a[:, 12345] = 1.0
    assert _rss_anon_kib() - before < 8 * 1024, "more than 8 MiB resident after 32 writes"
    assert a.sum() == 32
