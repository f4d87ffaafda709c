"""The arithmetic is a value passed down to the kernels, never process-wide state.

Two models with two arithmetics run in one process, interleaved, and each gives the logits it
gives alone in a fresh process; and no module of the runtime holds mutable state that picks an
arithmetic or a route (checked on the source with ``ast``, as tests/test_layering.py checks the
layering)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
IDS = list(range(3, 60, 4))  # 15 tokens: the prompt step, then decode steps

_ALONE = """
import json, sys
import numpy as np
from runtime.model import Model
path, arith, ids = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
m = Model(path, arithmetic=arith)
out = [m.forward(ids[:-3], all_logits=True)] + [m.forward([t]) for t in ids[-3:]]
np.save(sys.argv[4], np.concatenate(out))
"""


def _interleaved(a, b) -> tuple[np.ndarray, np.ndarray]:
    """Both models' logits, their forward passes taken in turns."""
    out: dict = {id(a): [], id(b): []}
    for m in (a, b):
        out[id(m)].append(m.forward(IDS[:-3], all_logits=True))
    for t in IDS[-3:]:
        for m in (b, a):
            out[id(m)].append(m.forward([t]))
    return np.concatenate(out[id(a)]), np.concatenate(out[id(b)])


def test_two_arithmetics_in_one_process_each_equal_their_own_process(exported, tmp_path):
    from runtime.model import Model

    path, _ = exported("tiny-llama", "q8_0")
    got = dict(zip(("int8", "float"), _interleaved(Model(path, arithmetic="int8"), Model(path, arithmetic="float"))))
    assert not np.array_equal(got["int8"], got["float"])  # two arithmetics really ran
    for arith, logits in got.items():
        out = tmp_path / f"{arith}.npy"
        subprocess.run([sys.executable, "-c", _ALONE, str(path), arith, json.dumps(IDS), str(out)],
                       check=True, cwd=ROOT, capture_output=True)
        np.testing.assert_array_equal(logits, np.load(out), err_msg=arith)


def test_a_forward_pass_takes_its_own_arithmetic(exported):
    """``forward(..., arith=...)`` runs that pass in it and leaves the model's own as it was."""
    from runtime.kernels import Arithmetic
    from runtime.model import Model

    path, _ = exported("tiny-llama", "q8_0")
    m, flt = Model(path, arithmetic="int8"), Model(path, arithmetic="float")
    a = m.forward(IDS, all_logits=True, arith=Arithmetic("float"))
    assert m.arith.name == "int8"
    np.testing.assert_array_equal(a, flt.forward(IDS, all_logits=True))


# --- no module-level state decides the arithmetic or a route --------------------------------
# Module-level containers the runtime mutates, each with why it decides neither an arithmetic
# nor a route: a new entry here is a design decision, not a way to quiet the test.
ALLOWED_STATE = {
    ("runtime/kernels/threads.py", "_THREADS"): "mirrors numba's own process-wide thread count",
    ("runtime/kernels/amx.py", "_STATE"): "the kernel's one-time grant of the AMX registers (a fact of the process)",
    ("runtime/kernels/kq_tiles.py", "_BUFS"): "scratch memory reused between calls (no decision)",
    ("runtime/kernels/gemm.py", "_SCRATCH"): "scratch memory reused between calls (no decision)",
    ("runtime/ops.py", "_GELU_TABLE"): "ggml's GELU table, built once (a cache of numbers)",
    ("runtime/hw_counters.py", "_VALGRIND_CPU"): "the CPU valgrind emulates, asked once (a fact of the machine)",
    ("runtime/kernels/float_rows.py", "_READS"): "compiled read intrinsics by row shape (a cache of code)",
    ("runtime/ggml_ops.py", "_POWF"): "libm's powf, looked up once (a fact of the machine)",
}
MUTATORS = {"update", "append", "extend", "clear", "pop", "setdefault", "add", "remove", "discard", "__setitem__"}


def _module_containers(tree: ast.Module) -> set[str]:
    """Names bound at module level to a dict, list or set (literal or constructor call)."""
    out = set()
    for node in tree.body:
        targets, value = [], None
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        mutable = isinstance(value, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)) or (
            isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in ("dict", "list", "set"))
        out.update(t.id for t in targets if mutable and isinstance(t, ast.Name))
    return out


def _mutated_in_functions(tree: ast.Module, names: set[str]) -> set[str]:
    """Which of ``names`` a function body changes: item assignment, a mutating method, ``global``."""
    hit = set()
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.Global):
                hit.update(node.names)
            elif isinstance(node, (ast.Assign, ast.AugAssign)):
                for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name) and t.value.id in names:
                        hit.add(t.value.id)
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS
                  and isinstance(node.func.value, ast.Name) and node.func.value.id in names):
                hit.add(node.func.value.id)
    return hit


def _state(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return _mutated_in_functions(tree, _module_containers(tree)) | {
        n for node in ast.walk(tree) if isinstance(node, ast.Global) for n in node.names}


def test_no_module_level_mutable_state_decides_arithmetic_or_routing():
    files = sorted((ROOT / "runtime").rglob("*.py"))
    assert len(files) > 20
    found = {(str(p.relative_to(ROOT)), name) for p in files for name in _state(p)}
    unexplained = sorted(found - set(ALLOWED_STATE))
    assert not unexplained, f"module-level state mutated at run time: {unexplained}"
    assert not set(ALLOWED_STATE) - found, "an allowed entry no longer exists: drop it"


def test_the_scan_finds_what_it_looks_for(tmp_path):
    """The scan sees the shapes the arithmetic used to take (a module dict set by a setter, a
    ``global``), and not a constant table."""
    src = tmp_path / "m.py"
    src.write_text("_A = {'name': 'int8'}\nTABLE = {'q4_k': 1}\nN = 0\n\n"
                   "def set_a(x):\n    _A['name'] = x\n\ndef bump():\n    global N\n    N += 1\n\n"
                   "def read():\n    return TABLE['q4_k']\n")
    assert _state(src) == {"_A", "N"}
