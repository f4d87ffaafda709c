"""``aios-contract inspect`` / ``fetch`` and the shared error handling of the console scripts."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from contract.cli import main
from convert.cli import main as convert_main
from runtime.cli import main as run_main


def run(*args: str):
    return CliRunner().invoke(main, list(args))


def test_inspect_folder_tables(hf_model):
    res = run("inspect", str(hf_model("llama")))
    assert res.exit_code == 0, res.output
    assert "GQA" in res.stdout and "model.layers.0.mlp.down_proj.weight" in res.stdout
    assert "Total:" in res.stdout


def test_inspect_json(hf_model):
    res = run("inspect", "--json", str(hf_model("falcon")))
    assert res.exit_code == 0
    rep = json.loads(res.stdout)
    assert rep["model"]["facts"]["attention_kind"] == "MQA"
    assert rep["totals"]["bytes"] == sum(t["bytes"] for t in rep["tensors"])


def test_inspect_alias_without_weights():
    res = run("inspect", "falcon-7b")
    assert res.exit_code == 0
    assert "4544" in res.stdout and "MQA" in res.stdout and "unavailable" in res.stdout


@pytest.mark.parametrize(
    "make_bad, needle",
    [
        (lambda p: p / "missing", "No such file"),
        (lambda p: (p / "empty").mkdir() or p / "empty", "not a model folder"),
        (lambda p: [(p / "x.gguf").write_bytes(b"GGUF\x03\0\0\0"), p / "x.gguf"][1], "corrupt GGUF"),
        (lambda p: [(p / "cfg").mkdir(), (p / "cfg" / "config.json").write_text('{"model_type":"rwkv"}'), p / "cfg"][2],
         "not supported"),
    ],
)
def test_bad_input_exit_4_one_line(tmp_path, make_bad, needle):
    res = run("inspect", str(make_bad(tmp_path)))
    assert res.exit_code == 4
    assert needle in res.stderr
    assert "Traceback" not in res.output
    assert res.stderr.strip().startswith("error:")


def test_usage_error_exit_2():
    res = run("inspect", "--max-tensors", "lots")
    assert res.exit_code == 2


def test_fetch_offline_exit_3(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    res = run("fetch", "falcon-7b")
    assert res.exit_code == 3 and "HF_HUB_OFFLINE" in res.stderr


@pytest.mark.parametrize("group", [main, convert_main, run_main])
def test_groups_have_help_and_version(group):
    assert CliRunner().invoke(group, ["--help"]).exit_code == 0
    res = CliRunner().invoke(group, ["--version"])
    assert res.exit_code == 0 and "0.1.0" in res.stdout and "Contract v1.0" in res.stdout


def test_console_script_truncated_safetensors_no_traceback(hf_model):
    folder = hf_model("gpt2")
    st = folder / "model.safetensors"
    st.write_bytes(st.read_bytes()[:1000])
    proc = subprocess.run(
        [sys.executable, "-m", "contract.cli", "inspect", str(folder)], capture_output=True, text=True
    )
    assert proc.returncode == 4
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) <= 2  # one sentence (rich may wrap once)
