"""aios-convert relufy: mechanics on tiny random models (few steps), errors, resume, atomicity.

The 10-minute acceptance run on the bundled tiny-falcon is ``test_acceptance_tiny_falcon``
(marked slow) and ``benchmarks/relufy_curve.py``.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from aios.errors import InvalidModelError, ModelNotFoundError, UnsupportedArchitectureError, UsageError
from convert import training as tr
from convert.cli import main
from convert.relufication.run import partial_dir
from convert.relufy import PROVENANCE_FILE, RelufyConfig, parse_activation, relufy

FAST = RelufyConfig(steps=6, batch=2, seq_len=16, lr=1e-3, l1=0.5)
CAL = 24  # calibration prompts for the sparsity numbers in these tests (the CLI uses all 241)


def _load(folder: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder).eval()


def _deterministic(out: Path) -> dict:
    """The provenance without its measured wall-time block (the one part that varies)."""
    prov = json.loads((out / PROVENANCE_FILE).read_text())
    assert prov["throughput"]["tokens_per_second"] > 0
    return {k: v for k, v in prov.items() if k != "throughput"}


def _siblings(out: Path) -> list[str]:
    return sorted(p.name for p in out.parent.iterdir() if p.name.startswith(out.name) or
                  p.name.startswith("." + out.name))


# --- pure pieces --------------------------------------------------------------------------


def test_schedules():
    lrs = [tr.lr_at(s, 100, 1e-3, 5, 0.1) for s in range(100)]
    assert lrs[0] == pytest.approx(2e-4) and lrs[4] == pytest.approx(1e-3)
    assert all(a >= b for a, b in zip(lrs[4:], lrs[5:])) and lrs[-1] >= 1e-4
    l1 = [tr.l1_at(s, 100, 2.0, 0.1, 0.6) for s in range(100)]
    assert l1[:10] == [0.0] * 10 and l1[60:] == [2.0] * 40
    assert all(a <= b for a, b in zip(l1, l1[1:]))
    assert tr.l1_at(50, 100, 0.0, 0.1, 0.6) == 0.0


def test_l1_penalty_is_scale_free():
    lin = torch.nn.Linear(4, 4)
    tap = tr.ActivationTap([lin])
    a = torch.relu(torch.randn(2, 3, 4))
    lin(a)
    p1 = tap.l1_penalty()
    lin(10 * a)
    assert tap.l1_penalty() == pytest.approx(float(p1))
    assert tap.zero_fraction() == pytest.approx(float((a == 0).float().mean()))
    tap.remove()


def test_config_roundtrip_and_validation():
    cfg = RelufyConfig(steps=7, l1=0.3)
    assert RelufyConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    with pytest.raises(UsageError, match="version"):
        RelufyConfig.from_dict({**cfg.to_dict(), "version": 99})
    for bad in (dict(steps=0), dict(lr=-1.0), dict(l1=-0.1), dict(activation="gelu")):
        with pytest.raises(UsageError):
            RelufyConfig(**bad).validate()
    assert parse_activation("ReLU2") == "relu2"
    with pytest.raises(UsageError, match="stock transformers"):
        parse_activation("fatrelu:0.01")


# --- runs on tiny random models -------------------------------------------------------------


def test_relufy_falcon_output_loads_with_stock_transformers(lm, tmp_path):
    from aios.measure.ffn import measure_ffn_activity
    from aios.data import load_texts
    from aios.models import resolve_model

    src = lm("falcon")
    out = tmp_path / "out"
    res = relufy(str(src), out, FAST, checkpoint_every=2, calibration_samples=CAL)
    assert out.is_dir() and _siblings(out) == ["out"]  # no .partial, no temp folder left
    assert json.loads((out / "config.json").read_text())["activation"] == "relu"
    model = _load(out)
    assert type(model.transformer.h[0].mlp.act).__name__ == "ReLU"
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (out / name).read_bytes() == (src / name).read_bytes()
    prov = json.loads((out / PROVENANCE_FILE).read_text())
    assert prov == res.provenance
    assert prov["config"] == FAST.to_dict() and prov["steps"] == 6
    assert prov["source"]["activation"] == "gelu" and prov["result"]["config_key"] == "activation"
    assert len(prov["data"]["train"]["texts_sha256"]) == 64
    assert prov["data"]["calibration"]["samples"] == CAL
    m = prov["metrics"]
    assert m["before"]["mean_exact_zero_fraction"] == 0.0
    assert all(math.isfinite(m[k]["heldout_perplexity"]) for k in ("before", "after_swap", "after"))
    assert m["perplexity_ratio"] == pytest.approx(m["after"]["heldout_perplexity"]
                                                  / m["before"]["heldout_perplexity"], rel=1e-3)
    # the reported sparsity is exactly what the checker's code measures on the written folder
    stats = measure_ffn_activity(resolve_model(str(out)), load_texts(limit=CAL), max_tokens=128)
    assert m["after"]["mean_exact_zero_fraction"] == pytest.approx(stats.mean_zero_fraction, abs=1e-6)
    assert stats.mean_zero_fraction > 0.2
    assert [r["step"] for r in prov["training_log"]] == [1, 6]


def test_relufy_gated_llama_puts_relu_on_the_gate(lm, tmp_path):
    src = lm("llama")
    res = relufy(str(src), tmp_path / "out", RelufyConfig(steps=2, batch=2, seq_len=16, l1=0.0),
                 checkpoint_every=0, calibration_samples=CAL)
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg["hidden_act"] == "relu"
    assert "gate" in res.provenance["result"]["applied_to"]
    assert res.provenance["metrics"]["after"]["mean_exact_zero_fraction"] > 0.2
    assert type(_load(tmp_path / "out").model.layers[0].mlp.act_fn).__name__ == "ReLU"


def test_interrupt_leaves_no_output_and_resume_matches_uninterrupted(lm, tmp_path):
    src = lm("falcon")
    relufy(str(src), tmp_path / "straight", FAST, checkpoint_every=3, calibration_samples=CAL)

    out = tmp_path / "resumed"

    def interrupt_at_step_4(event, **info):
        if event == "step" and info["stats"].step == 4:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        relufy(str(src), out, FAST, checkpoint_every=3, calibration_samples=CAL,
               progress=interrupt_at_step_4)
    assert not out.exists() and _siblings(out) == ["resumed.partial"]
    with pytest.raises(UsageError, match="--resume"):
        relufy(str(src), out, FAST, checkpoint_every=3)
    with pytest.raises(UsageError, match="different config"):
        relufy(str(src), out, RelufyConfig(**{**FAST.to_dict(), "steps": 7}), resume=True)
    res = relufy(str(src), out, FAST, checkpoint_every=3, resume=True, calibration_samples=CAL)
    assert res.resumed_from == 3 and _siblings(out) == ["resumed"]
    for name in ("model.safetensors", "config.json"):
        assert (out / name).read_bytes() == (tmp_path / "straight" / name).read_bytes(), name
    assert _deterministic(out) == _deterministic(tmp_path / "straight")


def test_torn_checkpoint_is_one_sentence(lm, tmp_path):
    src = lm("falcon")
    out = tmp_path / "o"

    def stop_at_3(event, **info):
        if event == "step" and info["stats"].step == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        relufy(str(src), out, FAST, checkpoint_every=2, calibration_samples=CAL, progress=stop_at_3)
    state = partial_dir(out) / "checkpoint-2" / "aios_state.pt"
    state.write_bytes(state.read_bytes()[:100])
    with pytest.raises(InvalidModelError, match="cannot be read.*start over"):
        relufy(str(src), out, FAST, checkpoint_every=2, resume=True)
    with pytest.raises(UsageError, match="Unknown device 'tpu'"):
        relufy(str(src), tmp_path / "o2", FAST, device="tpu")


def test_resume_without_checkpoint_starts_fresh(lm, tmp_path):
    notes = []
    res = relufy(str(lm("falcon")), tmp_path / "o", RelufyConfig(steps=1, batch=2, seq_len=16),
                 resume=True, calibration_samples=CAL,
                 progress=lambda e, **i: notes.append(i.get("message", "")))
    assert res.resumed_from is None and any("no checkpoint" in n for n in notes)


# --- errors: one line, an exit code, nothing under the final name ----------------------------


def test_unreadable_or_short_training_data(lm, tmp_path):
    src = lm("falcon")
    out = tmp_path / "out"
    with pytest.raises(ModelNotFoundError, match="not found"):
        relufy(str(src), out, FAST, train_data=tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\nnot json\n')
    with pytest.raises(InvalidModelError, match="bad.jsonl cannot be read"):
        relufy(str(src), out, FAST, train_data=bad)
    short = tmp_path / "short.txt"
    short.write_text("only a few words")
    with pytest.raises(InvalidModelError, match="at least 16"):
        relufy(str(src), out, FAST, train_data=short)
    with pytest.raises(UsageError, match="divide evenly|--micro-batch 3"):
        relufy(str(src), out, FAST, micro_batch=3)
    assert not (tmp_path / "out").exists()
    txt = tmp_path / "train.txt"
    txt.write_text("\n\n".join(f"sample {i} with some words to learn from" for i in range(50)))
    res = relufy(str(src), out, RelufyConfig(steps=1, batch=2, seq_len=16), train_data=txt,
                 calibration_samples=CAL)
    assert res.provenance["data"]["train"]["source"] == str(txt)
    assert res.provenance["data"]["train"]["format"] == "text"


def test_gradient_checkpointing_changes_memory_not_weights(lm, tmp_path):
    """Recomputed activations (the L1 penalty's hooks fire again in the backward pass) give the
    same update as stored ones."""
    src = lm("falcon")
    cfg = RelufyConfig(steps=3, batch=2, seq_len=16, l1=0.5, l1_start=0.0)
    for name, gc in (("plain", False), ("gc", True)):
        relufy(str(src), tmp_path / name, cfg, checkpoint_every=0, calibration_samples=CAL,
               gradient_checkpointing=gc)
    assert (tmp_path / "gc" / "model.safetensors").read_bytes() == \
        (tmp_path / "plain" / "model.safetensors").read_bytes()
    assert json.loads((tmp_path / "gc" / PROVENANCE_FILE).read_text())["training"][
        "gradient_checkpointing"] is True


def test_streamed_parquet_folder_token_budget_and_heldout_file(lm, tmp_path):
    """--train-data as a folder of Parquet files, a token budget instead of steps, gradient
    accumulation and a held-out file: the provenance records each."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for k in range(2):
        pq.write_table(pa.table({"text": [f"sample {k} {i} with some words to learn from"
                                          for i in range(40)]}), corpus / f"part-{k}.parquet")
    held = tmp_path / "held.txt"
    held.write_text("\n\n".join(f"held out text number {i} for perplexity" for i in range(30)))
    res = relufy(str(lm("falcon")), tmp_path / "out", RelufyConfig(batch=4, seq_len=16, l1=0.5),
                 train_data=corpus, tokens="300", micro_batch=2, heldout_data=held,
                 checkpoint_every=0, calibration_samples=CAL)
    p = res.provenance
    assert p["steps"] == 5 and p["training"]["tokens_seen"] == 5 * 64
    assert p["training"]["token_budget"] == 300 and p["training"]["gradient_accumulation"] == 2
    assert p["data"]["train"]["format"] == "parquet" and p["data"]["train"]["files"] == 2
    assert p["data"]["heldout"]["source"] == str(held)
    assert p["training"]["world_size"] == 1 and p["training"]["precision"] == "fp32"


def test_unsupported_inputs(hf_model, gguf_file, tmp_path):
    # a GGUF starts from its dequantized twin (aios.models.from_gguf): this one's tensors do not
    # match its config, so transformers refuses it, in one sentence
    with pytest.raises(InvalidModelError, match="transformers could not load"):
        relufy(str(gguf_file()), tmp_path / "o1", FAST)
    folder = hf_model("falcon")
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "model_type": "mamba"}))
    with pytest.raises(UnsupportedArchitectureError, match="mamba"):
        relufy(str(folder), tmp_path / "o2", FAST)
    assert not any(p.name.startswith(("o1", "o2", ".o1", ".o2")) for p in tmp_path.iterdir())


def test_cli_exit_codes(lm, tmp_path):
    src = lm("falcon")
    runner = CliRunner()
    r = runner.invoke(main, ["relufy", str(src), "-o", str(tmp_path / "o"), "--activation", "fatrelu:0.1"])
    assert r.exit_code == 2 and "stock transformers" in r.output
    r = runner.invoke(main, ["relufy", str(src), "-o", str(tmp_path / "o"), "--train-data",
                             str(tmp_path / "nope.txt")])
    assert r.exit_code == 4 and "not found" in r.output and "Traceback" not in r.output
    (tmp_path / "exists").mkdir()
    r = runner.invoke(main, ["relufy", str(src), "-o", str(tmp_path / "exists"), "--steps", "1"])
    assert r.exit_code == 2 and "already exists" in r.output
    r = runner.invoke(main, ["relufy", str(src), "-o", str(tmp_path / "o"), "--batch-tokens", "100",
                             "--seq-len", "16"])
    assert r.exit_code == 2 and "not a multiple of --seq-len 16" in r.output
    r = runner.invoke(main, ["relufy", str(src), "-o", str(tmp_path / "o"), "--tokens", "2X"])
    assert r.exit_code == 2 and "not a token count" in r.output
    r = runner.invoke(main, ["relufy", str(src), "-o", str(tmp_path / "ok"), "--steps", "2",
                             "--batch", "2", "--seq-len", "16", "--l1", "0"])
    assert r.exit_code == 0, r.output
    assert "after fine-tune" in r.output and (tmp_path / "ok" / PROVENANCE_FILE).is_file()


def test_cli_progress_off_a_terminal_is_in_order(lm, tmp_path):
    """Off a terminal (a CI log; CliRunner's stderr is not one) rich draws the fine-tune bar only
    when it stops, and it stopped when relufy returned: "measuring the fine-tuned model" came
    before the bar's final line. The bar stops when the last step is done."""
    r = CliRunner().invoke(main, ["relufy", str(lm("falcon")), "-o", str(tmp_path / "o"), "--steps", "2",
                                  "--batch", "2", "--seq-len", "16", "--l1", "0"])
    assert r.exit_code == 0, r.output
    lines = [x.strip() for x in r.stderr.splitlines()]
    bar = [i for i, x in enumerate(lines) if x.startswith("fine-tune ") and " 2/2 " in x]
    assert len(bar) == 1, r.stderr
    assert bar[0] < lines.index("measuring the fine-tuned model"), r.stderr


# --- the acceptance run (slow: about 5-10 CPU minutes) --------------------------------------


@pytest.mark.slow
def test_acceptance_tiny_falcon(tmp_path):
    """Default settings on the bundled GELU falcon: ≥ 0.85 exact zeros, ≤ 1.10 × perplexity,
    then the checker passes R1 and reaches tier Optimized."""
    from contract.check import check_model

    res = relufy("tiny-falcon", tmp_path / "falcon-relu", device="cpu")
    m = res.provenance["metrics"]
    assert m["after"]["mean_exact_zero_fraction"] >= 0.85
    assert m["perplexity_ratio"] <= 1.10
    assert res.seconds <= 600
    rep = check_model(str(tmp_path / "falcon-relu"))
    r1 = next(r for r in rep.requirements if r.id == "R1")
    assert r1.status.value == "pass" and rep.tier == "optimized"
    assert r1.metric("mean_exact_zero_fraction").value == pytest.approx(
        m["after"]["mean_exact_zero_fraction"], abs=1e-6)
    shutil.rmtree(tmp_path / "falcon-relu")
