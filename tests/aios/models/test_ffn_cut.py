"""aios/models/ffn_cut.py: an HF folder's calibrated down-projection cut, read and applied."""

from __future__ import annotations

import pytest
import torch

from aios.errors import InvalidModelError
from aios.models import ffn_cut


def test_from_config_reads_and_refuses_in_one_sentence():
    assert ffn_cut.from_config({}, 2) is None
    entry = ffn_cut.config_entry([0.5, 0], "x.gguf")
    assert ffn_cut.from_config({ffn_cut.CONFIG_KEY: entry}, 2) == [0.5, 0.0]
    for bad, match in (({"site": "gate", "values": [1, 1]}, "site 'down_in'"),
                       ([1, 2], "must be an object"),
                       ({"site": "down_in", "values": [1]}, "2 finite numbers ≥ 0, one per layer; it has 1 values"),
                       ({"site": "down_in", "values": [1, -1]}, "finite numbers ≥ 0"),
                       ({"site": "down_in", "values": [1, float("nan")]}, "finite numbers ≥ 0"),
                       ({"site": "down_in", "values": "0.1"}, "'0.1'")):
        with pytest.raises(InvalidModelError, match=match):
            ffn_cut.from_config({ffn_cut.CONFIG_KEY: bad}, 2, "cfg")


def test_install_zeroes_small_inputs_and_keeps_the_gradient_of_the_rest():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4, bias=False), torch.nn.Linear(4, 2, bias=False))
    seen = []
    handles = ffn_cut.install(model, ["1"], [0.5])
    model[1].register_forward_pre_hook(lambda _m, a: seen.append(a[0]))  # sees the cut input
    x = torch.tensor([[0.1, -0.7, 0.49, 2.0]], requires_grad=True)
    model[0].weight.data = torch.eye(4)
    model(x).sum().backward()
    assert seen[0].tolist() == [[0.0, pytest.approx(-0.7), 0.0, 2.0]]
    assert (x.grad[0, [0, 2]] == 0).all() and (x.grad[0, [1, 3]] != 0).all()
    for h in handles:
        h.remove()
    seen.clear()
    model(x)
    assert float(seen[0][0, 0].detach()) == pytest.approx(0.1)
    assert ffn_cut.install(model, ["1"], [0.0]) == []  # a zero threshold cuts nothing: no hook
