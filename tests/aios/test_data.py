"""Bundled text sets and user text files."""

from __future__ import annotations

import json

import pytest

from aios.data import BadTextFileError, load_heldout, load_texts, texts_sha256
from aios.errors import ExitCode, ModelNotFoundError


def test_bundled_calibration_is_varied():
    lines = [json.loads(x) for x in open(__import__("aios.data").data.CALIBRATION_FILE, encoding="utf-8")]
    assert len(lines) >= 200
    kinds = {x["kind"] for x in lines}
    assert {"prose", "code", "dialogue", "list", "numbers"} <= kinds
    assert len({x["lang"] for x in lines}) >= 8
    assert len({x["text"] for x in lines}) == len(lines)


def test_heldout_is_separate_from_calibration():
    cal, ho = set(load_texts()), load_heldout()
    assert len(ho) >= 50 and not cal.intersection(ho)


def test_jsonl_and_txt(tmp_path):
    j = tmp_path / "p.jsonl"
    j.write_text('{"text": "a b"}\n\n{"text": "c"}\n', encoding="utf-8")
    assert load_texts(j) == ["a b", "c"]
    t = tmp_path / "p.txt"
    t.write_text("first para\nstill first\n\nsecond\n", encoding="utf-8")
    assert load_texts(t) == ["first para\nstill first", "second"]
    assert load_texts(j, limit=1) == ["a b"]
    assert texts_sha256(["a"]) != texts_sha256(["b"])


@pytest.mark.parametrize("content, msg", [
    (b'{"text": 1}\n', "no string field"),
    (b"{oops\n", "not valid JSON"),
    (b"\xff\xfe\x00", "not UTF-8"),
    (b"\n\n", "no text samples"),
])
def test_bad_text_files(tmp_path, content, msg):
    p = tmp_path / "bad.jsonl"
    p.write_bytes(content)
    with pytest.raises(BadTextFileError, match=msg) as e:
        load_texts(p)
    assert e.value.exit_code == ExitCode.BAD_INPUT


def test_missing_text_file(tmp_path):
    with pytest.raises(ModelNotFoundError):
        load_texts(tmp_path / "nope.jsonl")


def test_empty_samples_are_skipped_and_an_all_empty_file_refused(tmp_path):
    """Issue 19.5: zero calibration tokens must never become "measured 0.0 %"."""
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text('{"text": ""}\n{"text": "real text"}\n{"text": "  "}\n', encoding="utf-8")
    assert load_texts(mixed) == ["real text"]
    empty = tmp_path / "empty.jsonl"
    empty.write_text('{"text": ""}\n{"text": "\\n"}\n', encoding="utf-8")
    with pytest.raises(BadTextFileError, match="every sample is empty") as e:
        load_texts(empty)
    assert e.value.exit_code == ExitCode.BAD_INPUT
