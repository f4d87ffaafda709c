"""``runtime.bench``'s per-token arithmetic, shared by ``aios-run generate`` and ``bench``."""

from __future__ import annotations

import pytest

from runtime.bench import decode_mb_per_token, shares_weights
from runtime.generate import Timing


def test_decode_mb_per_token_divides_by_decode_steps():
    tm = Timing(generated=4,
                decode_bytes={"weights": 8_000_000, "kv_cache": 400_000, "activations": 0})
    assert decode_mb_per_token(tm) == pytest.approx(
        {"weights": 2.0, "kv_cache": 0.1, "activations": 0.0})


def test_decode_mb_per_token_without_decode_steps_does_not_divide_by_zero():
    tm = Timing(generated=0, decode_bytes={"weights": 3_000_000})
    assert decode_mb_per_token(tm) == {"weights": 3.0}


def _row(mode: str, weights: float, distinct: float | None) -> dict:
    return {"mode": mode, "decode_mb_per_token": {"weights": weights},
            "distinct_weight_mb_per_token": distinct}


def test_shares_weights_only_for_a_dense_run_reading_clearly_fewer_distinct_bytes():
    assert shares_weights([_row("dense", 10.0, 9.0)])
    assert not shares_weights([_row("dense", 10.0, 9.6)])  # within 5 %: no sharing
    assert not shares_weights([_row("sparse", 10.0, 1.0)])  # sparse modes undercount
    assert not shares_weights([_row("dense", 10.0, None), {"mode": "dense",
                                                          "decode_mb_per_token": {"weights": 1.0}}])
