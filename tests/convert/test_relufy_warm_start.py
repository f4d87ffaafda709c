"""relufy --init-thresholds: the fine-tune starts from sparsify's calibrated down-projection cuts,
keeps them in place, and writes them into the output (config.json → GGUF → aios-run).

Tiny fixtures, a few steps; the real-model comparison is benchmarks/relufy_warm_start.py."""

from __future__ import annotations

import json

import gguf
import numpy as np
import pytest
import torch
from click.testing import CliRunner

from aios.errors import InvalidModelError, ModelNotFoundError
from aios.models import ffn_cut, resolve_model
from aios.models.aliases import FIXTURES_DIR
from convert.cli import main
from convert.relufy import PROVENANCE_FILE, RelufyConfig, relufy

pytestmark = pytest.mark.usefixtures("one_thread")
STEPS = RelufyConfig(steps=2, batch=2, seq_len=16, lr=1e-3, l1=0.0)
CAL = 24
SRC = FIXTURES_DIR / "tiny-llama"


@pytest.fixture(scope="module")
def cuts(tmp_path_factory):
    """A sparsified GGUF of the bundled tiny-llama (50 %, down_in), and a gate-site one."""
    from convert.gguf import GGUFExportConfig, export_gguf
    from convert.sparsify import SparsifyConfig, sparsify

    root = tmp_path_factory.mktemp("warm")
    src = export_gguf(str(SRC), root / "src.gguf", GGUFExportConfig(outtype="f32")).output
    small = {"tokens": 192, "sensitivity_tokens": 64, "window": 64, "heldout_tokens": 0}
    down = sparsify(src, root / "down.gguf", SparsifyConfig(target=0.5, **small))
    gate = sparsify(src, root / "gate.gguf", SparsifyConfig(target=0.5, site="gate", **small))
    return down, gate


@pytest.fixture(scope="module")
def warm(cuts, tmp_path_factory):
    out = tmp_path_factory.mktemp("warm-out") / "relu-warm"
    return relufy(str(SRC), out, STEPS, calibration_samples=CAL, checkpoint_every=0,
                  init_thresholds=cuts[0].output)


def _file_values(path) -> list[float]:
    return [float(v) for v in gguf.GGUFReader(str(path)).get_field(ffn_cut.GGUF_VALUES).contents()]


def test_the_cut_is_trained_with_and_written_into_the_output(cuts, warm):
    values = _file_values(cuts[0].output)
    cfg = json.loads((warm.out / "config.json").read_text())
    entry = cfg[ffn_cut.CONFIG_KEY]
    assert entry["site"] == "down_in" and entry["values"] == pytest.approx(values)
    assert cfg["hidden_act"] == "relu"
    prov = json.loads((warm.out / PROVENANCE_FILE).read_text())
    rec = prov["result"]["ffn_threshold"]
    assert rec["from"] == "down.gguf" and len(rec["sha256"]) == 64 and rec["values"] == pytest.approx(values)
    m = prov["metrics"]
    # the warm start is the sparsified model (SiLU with the cut): about the file's calibrated 50 %
    # (calibrated on other text); ReLU then adds the gate's negative half on top of the cut
    assert 0.4 <= m["after_swap"]["mean_exact_zero_fraction"] <= 0.6
    assert m["after"]["mean_exact_zero_fraction"] > m["after_swap"]["mean_exact_zero_fraction"] + 0.05


def test_the_warm_start_begins_at_the_sparsified_model_and_ends_as_stock_relu(cuts, warm, tmp_path):
    from transformers import AutoModelForCausalLM
    from transformers.activations import ACT2FN

    prov = json.loads((warm.out / PROVENANCE_FILE).read_text())
    rec = prov["result"]["ffn_threshold"]
    assert rec["anneal_steps"] == 1 and rec["start"].startswith("silu with the cut")
    plain = relufy(str(SRC), tmp_path / "plain", STEPS, calibration_samples=CAL, checkpoint_every=0)
    p0 = plain.provenance["metrics"]["after_swap"]["heldout_perplexity"]
    w0 = prov["metrics"]["after_swap"]["heldout_perplexity"]
    # the warm run starts from SiLU with the cut (sparsify's model), not from the swapped one
    assert w0 < p0
    model = AutoModelForCausalLM.from_pretrained(warm.out)
    assert type(model.get_submodule("model.layers.0.mlp.act_fn")) is type(ACT2FN["relu"])


def test_anneal_schedule():
    from convert import training as tr

    assert [tr.anneal_at(s, 10, 0.5) for s in range(6)] == [0.2, 0.4, 0.6, 0.8, 1.0, 1.0]
    assert tr.anneal_at(0, 10, 0.0) == 1.0
    m = tr.ActivationAnneal(torch.nn.SiLU(), torch.nn.ReLU())
    x = torch.linspace(-2, 2, 9)
    torch.testing.assert_close(m(x), torch.nn.functional.silu(x))
    m.alpha = 0.25
    torch.testing.assert_close(m(x), 0.75 * torch.nn.functional.silu(x) + 0.25 * torch.relu(x))
    m.alpha = 1.0
    assert torch.equal(m(x), torch.relu(x))


def test_our_loader_applies_the_cut_and_stock_transformers_does_not(warm):
    from transformers import AutoModelForCausalLM

    handle = resolve_model(str(warm.out))
    assert handle.facts.ffn_threshold_site == "down_in"
    ours = handle.load_torch(dtype="float32")
    stock = AutoModelForCausalLM.from_pretrained(warm.out).eval()
    seen: dict[str, torch.Tensor] = {}
    for name, model in (("ours", ours), ("stock", stock)):
        # block 0: nothing before it is cut, so both models feed it the same input
        down = model.get_submodule(handle.arch.block(0, handle.arch.ffn_down))
        h = down.register_forward_pre_hook(lambda _m, a, n=name: seen.__setitem__(n, a[0].detach()))
        with torch.inference_mode():
            model(input_ids=torch.arange(3, 40)[None])
        h.remove()
    t = handle.config[ffn_cut.CONFIG_KEY]["values"][0]
    assert t > 0
    small = (seen["stock"].abs() < t) & (seen["stock"] != 0)
    assert small.any()  # stock transformers keeps the entries under the cut ...
    assert (seen["ours"][small] == 0).all()  # ... ours zeroes them
    kept = seen["stock"].abs() >= t
    torch.testing.assert_close(seen["ours"][kept], seen["stock"][kept])


def test_gguf_export_carries_the_cut_and_aios_run_matches_our_torch_model(warm, tmp_path):
    from convert.gguf import GGUFExportConfig, export_gguf
    from runtime.model import Model

    res = export_gguf(str(warm.out), tmp_path / "w.gguf", GGUFExportConfig(outtype="f32"))
    assert any("llama.cpp ignores aios.ffn_threshold" in w for w in res.warnings)
    r = gguf.GGUFReader(str(res.output))
    assert r.get_field(ffn_cut.GGUF_SITE).contents() == "down_in"
    assert _file_values(res.output) == pytest.approx(
        json.loads((warm.out / "config.json").read_text())[ffn_cut.CONFIG_KEY]["values"])
    ids = list(range(3, 30))
    model = Model(res.output, mode="dense", arithmetic="float")
    assert model.thresholds is not None and model.thresholds.site == "down_in"
    got = model.forward(ids, all_logits=True)
    torch_model = resolve_model(str(warm.out)).load_torch(dtype="float32")
    with torch.inference_mode():
        want = torch_model(input_ids=torch.tensor([ids])).logits[0].numpy()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-3 * np.abs(want).max())


def test_check_names_the_thresholds_as_the_source_of_the_zeros(warm):
    from contract.check import check_model

    r1 = next(r for r in check_model(str(warm.out), samples=8, max_tokens=64).requirements
              if r.id == "R1")
    assert "calibrated thresholds" in r1.details["zeros_from"]
    assert r1.details["engine"] == "transformers"  # an HF folder: our loader installed the cut


def test_bad_threshold_files_are_one_sentence(cuts, tmp_path):
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        relufy(str(SRC), tmp_path / "o", STEPS, init_thresholds=tmp_path / "missing.gguf")
    with pytest.raises(InvalidModelError, match="site 'gate'"):
        relufy(str(SRC), tmp_path / "o", STEPS, init_thresholds=cuts[1].output)
    other = tmp_path / "other.gguf"  # calibrated on a model with another layer count
    w = gguf.GGUFWriter(str(other), "llama")
    w.add_string(ffn_cut.GGUF_SITE, "down_in")
    w.add_array(ffn_cut.GGUF_VALUES, [0.1, 0.2, 0.3])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(InvalidModelError, match="holds 3 threshold values; this model has"):
        relufy(str(SRC), tmp_path / "o", STEPS, init_thresholds=other)
    assert not any(p.name.startswith(("o", ".o")) for p in tmp_path.iterdir() if p.is_dir())
    r = CliRunner().invoke(main, ["relufy", str(SRC), "-o", str(tmp_path / "o"), "--steps", "1",
                                  "--init-thresholds", str(tmp_path / "missing.gguf")])
    assert r.exit_code == 4 and "does not exist" in r.output and "Traceback" not in r.output
