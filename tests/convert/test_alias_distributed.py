"""alias --train on two CPU processes (torchrun, gloo) reaches the one-process weights.

The projection step after each update runs identically on every rank, so DDP replicas stay
equal; with the same micro-batches the two runs agree exactly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from safetensors.torch import load_file

from convert.alias.train import AliasTrainConfig, train_alias

# the in-process run must sum in the same order as the one-thread launched processes
pytestmark = pytest.mark.usefixtures("one_thread")

ARGS = ["--train", "--zones", "1-4", "--delta", "lowrank:2", "--types", "dense", "--steps", "3",
        "--device", "cpu"]


def test_two_processes_match_one(tmp_path):
    two = tmp_path / "two"
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc_per_node", "2", "-m", "convert.cli", "alias", "tiny-falcon", "-o",
                        str(two), *ARGS], capture_output=True, text=True, timeout=600,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.count("wrote ") == 1  # rank 0 alone reports and writes
    cfg = AliasTrainConfig(zones="1-4", delta="lowrank:2", types=("dense",), steps=3)
    one = train_alias("tiny-falcon", tmp_path / "one", cfg, device="cpu", micro_batch=cfg.batch // 2)
    assert one.report["training"]["gradient_accumulation"] == 2
    a, b = load_file(two / "model.safetensors"), load_file(tmp_path / "one" / "model.safetensors")
    assert a.keys() == b.keys() and max(float((a[k] - b[k]).abs().max()) for k in a) <= 1e-6
    rep = json.loads((two / "aios_alias.json").read_text())
    assert rep["training"]["world_size"] == 2
    assert [x["loss"] for x in rep["training_log"]] == [x["loss"] for x in one.report["training_log"]]


def test_killed_rank_then_resume_reaches_the_same_weights(tmp_path):
    """Two processes, rank 0 killed before step 3 of 4 with a checkpoint at step 2: nothing under
    OUT; --resume on two processes gives the uninterrupted run's weights."""
    def launch(out, *extra, env=None):
        return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                               "--nproc_per_node", "2", "-m", "convert.cli", "alias", "tiny-falcon",
                               "-o", str(out), *ARGS[:-4], "--steps", "4", "--device", "cpu",
                               "--checkpoint-every", "2", *extra], capture_output=True, text=True,
                              timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})

    straight, out = tmp_path / "straight", tmp_path / "killed"
    assert launch(straight).returncode == 0
    r = launch(out, env={"AIOS_FAULT_KILL": "0:3"})
    assert r.returncode != 0 and not out.exists()
    assert (tmp_path / "killed.partial" / "latest").read_text().strip() == "checkpoint-2"
    r = launch(out, "--resume")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resuming from step 2" in r.stderr and not (tmp_path / "killed.partial").exists()
    a, b = load_file(out / "model.safetensors"), load_file(straight / "model.safetensors")
    assert all((a[k] == b[k]).all() for k in a)
