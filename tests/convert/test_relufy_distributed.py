"""relufy on two CPU processes (torchrun, gloo), as `accelerate launch` / torchrun run it.

* Two processes and one process with the same global batch reach the same weights: exactly
  (≤ 1e-6) when the one process splits the batch into the same micro-batches, and within the
  documented tolerance (docs/commands.md: weights ≤ 1e-3, perplexity ≤ 0.5 %) with its whole
  batch in one forward pass, where only the per-micro-batch L1 ratio and float summation
  differ.
* One rank SIGKILLed mid-run (``AIOS_FAULT_KILL``) leaves nothing under OUT and a checkpoint
  in OUT.partial; ``--resume`` on two processes reaches the same weights as the uninterrupted
  two-process run; resuming on one process is refused.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from convert.relufy import PROVENANCE_FILE, RelufyConfig, relufy
from convert.relufication.run import partial_dir

STEPS, BATCH, SEQ, L1 = 8, 4, 16, 0.5
# the in-process run must sum in the same order as the one-thread launched processes
pytestmark = pytest.mark.usefixtures("one_thread")

ARGS = ["--steps", str(STEPS), "--batch", str(BATCH), "--seq-len", str(SEQ), "--l1", str(L1),
        "--checkpoint-every", "3", "--device", "cpu"]


def _torchrun(src: Path, out: Path, *extra: str, env: dict | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "convert.cli", "relufy", str(src), "-o", str(out), *ARGS, *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})


def _lib(src: Path, out: Path, **kw):
    # the CLI's l1 schedule fractions are the config defaults; the library call names them
    cfg = RelufyConfig(steps=STEPS, batch=BATCH, seq_len=SEQ, l1=L1)
    return relufy(str(src), out, cfg, device="cpu", checkpoint_every=3, **kw)


def _max_diff(a: Path, b: Path) -> float:
    wa, wb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert wa.keys() == wb.keys()
    return max(float((wa[k].float() - wb[k].float()).abs().max()) for k in wa)


def _prov(out: Path) -> dict:
    return json.loads((out / PROVENANCE_FILE).read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The uninterrupted two-process run every test compares with."""
    from tests.conftest import TINY_CONFIGS, build_hf_model, write_word_tokenizer

    root = tmp_path_factory.mktemp("dist")
    src = write_word_tokenizer(build_hf_model("falcon", root / "falcon"),
                               TINY_CONFIGS["falcon"].get("vocab_size", 128))
    two = root / "two"
    r = _torchrun(src, two)
    assert r.returncode == 0, r.stderr[-3000:]
    return src, root, two


def test_two_processes_match_one_with_the_same_global_batch(runs):
    src, root, two = runs
    p2 = _prov(two)
    assert p2["training"]["world_size"] == 2 and p2["training"]["backend"] == "gloo"
    assert len(p2["throughput"]["per_rank_tokens_per_second"]) == 2
    same_split = _lib(src, root / "one-micro", micro_batch=BATCH // 2)
    assert same_split.provenance["training"]["gradient_accumulation"] == 2
    assert _max_diff(two, root / "one-micro") <= 1e-6
    assert [r["loss"] for r in p2["training_log"]] == \
        [r["loss"] for r in same_split.provenance["training_log"]]
    whole = _lib(src, root / "one-whole")
    assert whole.provenance["training"]["gradient_accumulation"] == 1
    assert _max_diff(two, root / "one-whole") <= 1e-3
    for a, b in zip(p2["training_log"], whole.provenance["training_log"]):
        assert a["loss"] == pytest.approx(b["loss"], rel=5e-3)
    ppl2 = p2["metrics"]["after"]["heldout_perplexity"]
    assert whole.provenance["metrics"]["after"]["heldout_perplexity"] == pytest.approx(ppl2, rel=5e-3)


def test_killed_rank_then_resume_reaches_the_same_weights(runs):
    src, root, two = runs
    out = root / "killed"
    r = _torchrun(src, out, env={"AIOS_FAULT_KILL": "1:5"})
    assert r.returncode != 0 and "SIGKILL" in r.stderr
    assert not out.exists()
    work = partial_dir(out)
    assert (work / "latest").read_text().strip() == "checkpoint-3"
    assert sorted(p.name for p in (work / "checkpoint-3").glob("data_state_*.pt")) == \
        ["data_state_0.pt", "data_state_1.pt"]
    with pytest.raises(Exception, match="ran on 2 processes"):
        _lib(src, out, resume=True)
    r = _torchrun(src, out, "--resume")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resuming from step 3" in r.stderr
    assert not work.exists()
    wa, wb = load_file(out / "model.safetensors"), load_file(two / "model.safetensors")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    keep = lambda p: {k: v for k, v in p.items() if k != "throughput"}  # noqa: E731
    assert keep(_prov(out)) == keep(_prov(two))
