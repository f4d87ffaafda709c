"""``aios.io``'s file digests: the one helper the converters' provenance uses."""

from __future__ import annotations

import hashlib

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
