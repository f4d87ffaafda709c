"""Held-out perplexity measured in the runtime reproduces the fixtures' cards (a number transformers produced)."""

from __future__ import annotations

import json

import pytest

from aios.models.aliases import FIXTURES_DIR
from runtime.generate import load_tokenizer
from runtime.model import Model
from runtime.perplexity import heldout_ids, perplexity


@pytest.mark.parametrize("fixture", ["tiny-falcon-relu", "tiny-llama"])
def test_runtime_perplexity_equals_the_card(exported, fixture):
    path, _ = exported(fixture, "f32")
    card = json.loads((FIXTURES_DIR / fixture / "aios_fixture.json").read_text())["heldout_perplexity"]
    ids = heldout_ids(load_tokenizer(path))
    res = perplexity(Model(path), ids)
    assert res["perplexity"] == pytest.approx(card, rel=1e-3)


def test_per_token_equals_chunked_in_exact_modes(exported):
    path, _ = exported("tiny-falcon-relu", "f32")
    ids = heldout_ids(load_tokenizer(path), 200)
    m = Model(path, mode="sparse")
    a = perplexity(m, ids, window=64)
    b = perplexity(m, ids, window=64, per_token=True)
    assert a["tokens_scored"] == b["tokens_scored"] == 196
    assert a["perplexity"] == pytest.approx(b["perplexity"], rel=1e-5)
    assert m.counter.snapshot()["weights"] == 0  # evaluation is not part of any byte figure
