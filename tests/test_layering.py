"""The package layering of docs/design.md ("Layering"), checked on the source with ``ast``.

- no import cycles among the project's modules (function-level imports included);
- no private name (``_x``) imported from another module;
- library modules import only their own package, ``aios`` and the allowed exceptions; each
  package's ``cli`` (and ``*_cli``) modules are the top layer and may import anything;
- no module outside the architecture table compares an architecture name;
- no file of the packages is over FILE_LINES lines (split by concept, not to fit the cap).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("aios", "contract", "convert", "runtime", "reports")
# (importing module prefix, imported module prefix): documented exceptions
ALLOWED = {
    ("convert.", "contract.spec"),  # the contract's published data: thresholds, R5 manifest format
    ("contract.checks.r1_sparsity", "runtime.measure"),  # R1 of a GGUF: executed by the runtime
    ("contract.checks.r3_aliasing", "runtime.measure"),  # R3 of a GGUF: blocks decoded by the runtime's kernels
    ("contract.quality", "runtime."),  # the quality gate's perplexity of a GGUF: executed by the runtime
    ("convert.layout", "runtime.measure"),  # layout's access frequencies: the GGUF executed as stored
    ("convert.sparsify", "runtime."),  # thresholds calibrated on the GGUF as aios-run executes it, in its format
    # the tier ladder builds each rung with the converters and measures it in the runtime
    ("contract.ladder", "convert."),
    ("contract.ladder", "runtime."),
}


def _modules() -> dict[str, Path]:
    mods = {}
    for pkg in PACKAGES:
        for p in (ROOT / pkg).rglob("*.py"):
            rel = p.relative_to(ROOT).with_suffix("")
            name = ".".join(rel.parts)
            mods[name.removesuffix(".__init__")] = p
    return mods


MODULES = _modules()


def _imports(path: Path) -> list[tuple[str, str]]:
    """(imported module, imported name or '') for every absolute import in the file."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                full = f"{node.module}.{a.name}"
                out.append((full, "") if full in MODULES else (node.module, a.name))
        elif isinstance(node, ast.Import):
            out.extend((a.name, "") for a in node.names)
    return [(m, n) for m, n in out if m.split(".")[0] in PACKAGES]


def _is_top(mod: str) -> bool:
    leaf = mod.rsplit(".", 1)[-1]
    return leaf == "cli" or leaf.endswith("_cli")


def test_no_import_cycles():
    graph = {m: {t for t, _ in _imports(p) if t in MODULES} for m, p in MODULES.items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(t):] + [t]))
            if t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)


def test_no_private_names_across_modules():
    bad = [(m, t, n) for m, p in MODULES.items() for t, n in _imports(p)
           if n.startswith("_") and not n.startswith("__") and t != m]
    assert not bad, bad


@pytest.mark.parametrize("pkg", PACKAGES)
def test_library_modules_import_only_down(pkg):
    bad = []
    for m, p in MODULES.items():
        if not m.startswith(pkg) or _is_top(m):
            continue
        for t, _ in _imports(p):
            other = t.split(".")[0]
            if other in (pkg, "aios"):
                continue
            if pkg == "reports" and other in ("contract", "convert", "runtime"):
                continue  # reports sit above the three packages they render
            if any(m.startswith(a) and t.startswith(b) for a, b in ALLOWED):
                continue
            bad.append(f"{m} imports {t}")
    assert not bad, bad


def test_no_architecture_name_comparisons_outside_the_table():
    names = "falcon|llama|gpt2|phi3|gemma2|gemma3|gemma3_text|mistral|qwen2|qwen3"
    pattern = re.compile(rf"(==|!=|\bin)\s*\(?[^#\n]*[\"']({names})[\"']|[\"']({names})[\"']\s*(==|!=)")
    skip = {"aios.models.architectures", "aios.models.aliases", "aios.fixtures.train"}
    bad = [f"{m}: {line.strip()}" for m, p in MODULES.items() if m not in skip
           for line in p.read_text().splitlines() if pattern.search(line)]
    assert not bad, bad


FILE_LINES = 500  # a module a reader takes in whole; past that it holds more than one concept


@pytest.mark.parametrize("pkg", PACKAGES)
def test_files_stay_short(pkg):
    files = sorted((ROOT / pkg).rglob("*.py"))
    assert len(files) > 5, f"{pkg}/ has too few Python files: wrong folder?"
    long = {str(p.relative_to(ROOT)): n for p in files if (n := len(p.read_text().splitlines())) > FILE_LINES}
    assert not long, long
