"""aios/models/handle.py: loading a model for a measurement never runs random weights."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from aios.errors import ExitCode
from aios.models import resolve_model
from aios.models.handle import IncompleteWeightsError


def test_missing_weight_is_an_error_not_a_model(hf_model):
    """Issue 19.3: transformers would random-initialize a missing tensor; that is an error."""
    from safetensors.torch import load_file, save_file

    folder = hf_model("llama")
    weights = load_file(folder / "model.safetensors")
    dropped = "model.layers.1.mlp.down_proj.weight"
    del weights[dropped]
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    handle = resolve_model(str(folder))
    with pytest.raises(IncompleteWeightsError) as e:
        handle.load_torch()
    assert e.value.exit_code == ExitCode.NOT_EVALUATED
    assert dropped in e.value.keys and dropped in e.value.message


def test_complete_model_loads(hf_model):
    model = resolve_model(str(hf_model("llama"))).load_torch()
    assert not model.training


def test_aliased_gguf_r1_is_measured_on_its_real_weights(tmp_path):
    """The issue's repro: transformers would run an aliased GGUF's members as random weights
    (R1 "measured" 50 % on noise vs 91.7 % on the folder); R1 of a GGUF now runs the file in
    aios-run, which applies canonical + delta, so it is measured on the real weights and passes
    like the folder does."""
    import json

    from contract.cli import main as contract_main
    from convert.cli import main as convert_main

    gguf = tmp_path / "relu-alias.gguf"
    res = CliRunner().invoke(convert_main, [
        "alias", "tiny-falcon-relu", "-o", str(tmp_path / "relu-alias"), "--zones", "all",
        "--min-cosine", "0", "--delta", "q8_0", "--gguf", str(gguf)])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(contract_main, ["check", str(gguf), "--samples", "4", "--max-tokens", "16",
                                             "--require", "R1", "--format", "json", "-o", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output
    r1 = json.loads((tmp_path / "r" / "aios-report.json").read_text())["requirements"][0]
    assert r1["status"] == "pass" and r1["evidence"] == "measured"
    assert r1["details"]["engine"].startswith("aios-run")
    frac = next(m["value"] for m in r1["metrics"] if m["name"] == "mean_exact_zero_fraction")
    assert frac > 0.8
