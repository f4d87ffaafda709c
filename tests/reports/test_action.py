"""The composite GitHub Action and the example workflow: valid YAML, wiring, real commands only."""

from __future__ import annotations

import re
import shlex
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

from contract.cli import main as contract_cli

REPO = Path(__file__).resolve().parents[2]
ACTION = REPO / "action.yml"
WORKFLOW = REPO / ".github" / "workflows" / "model-release-gate.yml"
# Every program a run: step may start, besides our console scripts. Shell builtins and
# coreutils are listed one by one so a new dependency of the action is a deliberate change.
ALLOWED = {"python", "pip", "echo", "cat", "test", "[", "set", "exit", "printf"}
PYTHON_MODULES = {"pip"}
USES = {"actions/setup-python@v5", "actions/upload-artifact@v4", "github/codeql-action/upload-sarif@v3",
        "actions/checkout@v4", "./"}
KEYWORDS = {"if", "then", "else", "elif", "fi", "do", "done", "while", "until", "for", "!", "{", "}"}
SEPARATORS = {";", "&&", "||", "|", "&", "(", ")", ";;"}
ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\+?=")


def console_scripts() -> set[str]:
    return set(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"])


def _split_ops(tokens: list[str]) -> list[str]:
    """shlex groups adjacent punctuation (``);``): split such runs into bash operators."""
    out = []
    for t in tokens:
        if t and set(t) <= set(";&|()"):
            out += re.findall(r"&&|\|\||;;|[;&|()]", t)
        else:
            out.append(t)
    return out


def commands(script: str) -> list[list[str]]:
    """Simple commands of a bash script as token lists (no command substitution allowed)."""
    assert "$(" not in script and "`" not in script, "command substitution: the checker cannot see inside"
    out: list[list[str]] = []
    for line in script.replace("\\\n", " ").splitlines():
        lex = shlex.shlex(line, posix=True, punctuation_chars=";&|()")
        lex.whitespace_split, lex.commenters = True, "#"
        toks, cur, i = _split_ops(list(lex)), [], 0
        while i < len(toks):
            t = toks[i]
            if ASSIGN.match(t) and not cur and i + 1 < len(toks) and toks[i + 1] == "(" and t.endswith("="):
                j = toks.index(")", i)  # array assignment: name=( ... ) runs nothing
                i = j + 1
                continue
            if t in SEPARATORS or (not cur and t in KEYWORDS):
                if cur:
                    out.append(cur)
                cur = []
            elif cur or not ASSIGN.match(t) and t not in KEYWORDS:
                cur.append(t)
            i += 1
        if cur:
            out.append(cur)
    return out


def run_steps(steps: list[dict]) -> list[dict]:
    return [s for s in steps if "run" in s]


@pytest.fixture(scope="module")
def action() -> dict:
    return yaml.safe_load(ACTION.read_text())


@pytest.fixture(scope="module")
def workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


def test_commands_parser():
    assert commands('args=(check "$M" --x)\nif [ -n "$A" ]; then args+=(--y "$A"); fi\nset +e\naios-contract "${args[@]}"') \
        == [["[", "-n", "$A", "]"], ["set", "+e"], ["aios-contract", "${args[@]}"]]
    assert commands('code=$?\necho "x=$code" >> "$F"') == [["echo", "x=$code", ">>", "$F"]]


def test_action_is_a_valid_composite_action(action):
    assert action["runs"]["using"] == "composite" and action["name"] and action["description"]
    inputs = set(action["inputs"])
    assert {"model", "require-tier", "require", "calibration", "output-dir", "python-version", "formats"} <= inputs
    text = ACTION.read_text()
    assert set(re.findall(r"inputs\.([A-Za-z0-9_-]+)", text)) <= inputs
    ids = {s.get("id") for s in action["runs"]["steps"]}
    assert set(re.findall(r"steps\.([A-Za-z0-9_-]+)\.", text)) <= ids
    for step in action["runs"]["steps"]:
        assert ("run" in step) != ("uses" in step), step
        if "uses" in step:
            assert step["uses"] in USES
        else:
            assert step["shell"] == "bash"
            assert "${{" not in step["run"], "pass inputs through env:, never into the script text"
            subprocess.run(["bash", "-n"], input=step["run"], text=True, check=True)


def test_action_steps_call_only_existing_commands(action):
    allowed = ALLOWED | console_scripts()
    seen = set()
    for step in run_steps(action["runs"]["steps"]):
        for cmd in commands(step["run"]):
            assert cmd[0] in allowed, f"{step['name']}: unknown command {cmd[0]!r}"
            seen.add(cmd[0])
            if cmd[0] == "python" and "-m" in cmd:
                assert cmd[cmd.index("-m") + 1] in PYTHON_MODULES
    assert {"python", "aios-contract"} <= seen


def test_action_calls_aios_contract_check_with_real_options(action):
    step = next(s for s in run_steps(action["runs"]["steps"]) if "aios-contract" in s["run"])
    script = step["run"]
    assert re.search(r"args=\(check ", script) and "check" in contract_cli.commands
    options = {o for p in contract_cli.commands["check"].params for o in p.opts}
    used = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*|-o)(?=[\s\"])", script))
    assert used and used <= options, used - options
    fmts = action["inputs"]["formats"]["default"].split(",")
    from reports.check_reports import FORMATS

    assert set(fmts) <= set(FORMATS) and {"md", "sarif", "html"} <= set(fmts)
    summary = next(s for s in action["runs"]["steps"] if "GITHUB_STEP_SUMMARY" in s.get("run", ""))
    assert summary["if"] == "always()" and "aios-report.md" in summary["run"]
    last = action["runs"]["steps"][-1]
    assert "steps.check.outputs.exit-code" in str(last["env"]) and "exit" in last["run"]


def test_example_workflow_uses_the_action(workflow, action):
    on = workflow.get("on", workflow.get(True))  # YAML 1.1 reads a bare `on` key as True
    assert "workflow_dispatch" in on and "push" in on
    steps = workflow["jobs"]["contract-gate"]["steps"]
    gate = next(s for s in steps if s.get("uses") == "./")
    assert set(gate["with"]) <= set(action["inputs"])
    assert all(k in gate["with"] for k, v in action["inputs"].items() if v.get("required"))
    assert "require-tier" in gate["with"]
    for s in steps:
        if "uses" in s:
            assert s["uses"] in USES
    assert workflow["permissions"]["security-events"] == "write"  # the SARIF upload needs it
