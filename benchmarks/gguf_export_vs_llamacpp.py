"""Benchmark: ``aios-convert gguf`` against llama.cpp's ``convert_hf_to_gguf.py``, same model, one run.

Builds a random-init Llama-architecture model (bf16 safetensors, ~1 GB; the bundled byte-level
BPE tokenizer) in a temporary folder, converts it with both tools to each ``--outtype`` in fresh
processes, and reports wall time, the time ratio (ours / llama.cpp) and both peak RSS figures
(``ru_maxrss`` of each child via ``os.wait4``). The folder is deleted afterwards.

llama.cpp's converter ships inside the llama-cpp-python source distribution; pass its folder
or sdist with ``--llama-cpp-src``, or let the script fetch the sdist of the installed version
with ``pip download`` (it is never copied into this repository). Its tokenizer check only
accepts pre-tokenizers it has hashed, and our fixture tokenizer is not among them, so its
``get_vocab_base_pre`` is patched to answer "gpt-2" (what our exporter writes), and its
SentencePiece attempt raises FileNotFoundError as it does when ``sentencepiece`` is installed
and there is no ``tokenizer.model`` (so that package is not needed); nothing else is changed.

Peak RSS: the model is built in a separate process so that this driver stays small (a forked
child's ``ru_maxrss`` starts from its parent's RSS).

    python benchmarks/gguf_export_vs_llamacpp.py [--layers 11] [--outtype f16 --outtype q8_0]

Goal: ours at least as fast (ratio ≤ 1) with no more peak memory. Both sides are whole processes
timed from start to exit (the figure is the converter a user runs, imports included);
``llama_cpp_config`` beside the ratios says that llama.cpp's side is its Python converter, which
loads no llama.cpp library (no buffer types, nothing that crashes on AMX Xeons).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# What "llama.cpp" is here, named beside every ratio as the other benchmarks name llama.cpp's
# buffers: its Python converter, which never loads llama.cpp's library, so no CPU buffer type
# (default, AMX, repacked or plain) is involved and nothing here can take the AMX crash.
CONFIG = "convert_hf_to_gguf.py (Python; llama.cpp's library and CPU buffers not involved)"

# same random-init Llama builder as the check benchmark, run in its own process
BUILD_RUNNER = (
    "import sys; sys.path.insert(0, 'benchmarks'); from check_time_memory import build; "
    "from pathlib import Path; print(build(Path(sys.argv[1]), int(sys.argv[2])))"
)
OUR_RUNNER = "from convert.cli import main; main(prog_name='aios-convert')"
PATCHED_RUNNER = r"""
import runpy, sys
from pathlib import Path
script = sys.argv[1]
sys.path.insert(0, str(Path(script).parent))
sys.path.insert(1, str(Path(script).parent / "gguf-py"))  # as the script does: its own gguf-py
sys.argv = sys.argv[1:]
import conversion.base as base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
def no_spm(self):  # what it raises with sentencepiece installed and no tokenizer.model
    raise FileNotFoundError("tokenizer.model")
base.TextModel._set_vocab_sentencepiece = no_spm
runpy.run_path(script, run_name="__main__")
"""


def find_convert_script(src: Path | None, work: Path) -> Path:
    """convert_hf_to_gguf.py from a llama.cpp folder, an sdist, or a fresh ``pip download``."""
    if src is None:
        from importlib.metadata import version

        ver = version("llama_cpp_python")
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                        f"llama-cpp-python=={ver}", "-d", str(work)], check=True, capture_output=True)
        src = next(work.glob("llama_cpp_python-*.tar.gz"))
    if src.is_file():
        with tarfile.open(src) as tar:
            tar.extractall(work / "sdist", filter="data")
        src = work / "sdist"
    script = next(src.rglob("convert_hf_to_gguf.py"), None)
    if script is None:
        sys.exit(f"no convert_hf_to_gguf.py under {src}")
    return script


# tensors of both outputs compared by name, in a child so this driver stays small
COMPARE_RUNNER = r"""
import json, sys
import numpy as np, gguf
a = {t.name: t for t in gguf.GGUFReader(sys.argv[1]).tensors}
b = {t.name: t for t in gguf.GGUFReader(sys.argv[2]).tensors}
same = [n for n in a if n in b and a[n].tensor_type == b[n].tensor_type
        and np.array_equal(np.asarray(a[n].data), np.asarray(b[n].data))]
print(json.dumps({"tensors": len(a), "same_names": len(a.keys() & b.keys()), "bit_identical": len(same)}))
"""


def largest_tensor_bytes(folder: Path) -> int:
    """From the safetensors headers only."""
    out = 0
    for st in folder.glob("*.safetensors"):
        with open(st, "rb") as fh:
            header = json.loads(fh.read(int.from_bytes(fh.read(8), "little")))
        out = max([out] + [m["data_offsets"][1] - m["data_offsets"][0] for k, m in header.items() if k != "__metadata__"])
    return out


def timed(cmd: list[str]) -> dict:
    """Wall time and peak RSS of one child process (its own rusage, not the sum of children)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    err = proc.stderr.read() if proc.stderr else ""
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        print(err[-3000:], file=sys.stderr)
    return {"seconds": round(wall, 2), "peak_rss_bytes": usage.ru_maxrss * 1024, "exit_code": code}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=11, help="11 layers of d=2048 ≈ 0.5B params ≈ 1 GB bf16")
    ap.add_argument("--outtype", action="append", choices=["f32", "f16", "bf16", "q8_0"], default=None)
    ap.add_argument("--llama-cpp-src", type=Path, default=None, help="llama.cpp folder or llama-cpp-python sdist")
    args = ap.parse_args()
    outtypes = args.outtype or ["f16", "q8_0"]
    with tempfile.TemporaryDirectory(prefix="aios-gguf-bench-") as tmp_s:
        tmp = Path(tmp_s)
        script = find_convert_script(args.llama_cpp_src, tmp)
        folder = tmp / "model"
        built = subprocess.run([sys.executable, "-c", BUILD_RUNNER, str(folder), str(args.layers)], cwd=ROOT,
                               check=True, capture_output=True, text=True)
        params = int(built.stdout.strip().splitlines()[-1])
        model_bytes = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
        largest = largest_tensor_bytes(folder)
        # what the interpreter and the libraries the export imports cost before any tensor
        imports = timed([sys.executable, "-c", "import torch, safetensors, gguf, tokenizers, convert.gguf"])
        results = {"params": params, "model_bytes": model_bytes, "largest_tensor_bytes": largest,
                   "import_only_peak_rss_bytes": imports["peak_rss_bytes"],
                   "llama_cpp_convert": str(script.relative_to(tmp)), "llama_cpp_config": CONFIG, "runs": {}}
        for outtype in outtypes:
            ours_out, theirs_out = tmp / f"ours-{outtype}.gguf", tmp / f"llamacpp-{outtype}.gguf"
            ours = timed([sys.executable, "-c", OUR_RUNNER, "gguf", str(folder), "-o", str(ours_out),
                          "--outtype", outtype])
            theirs = timed([sys.executable, "-c", PATCHED_RUNNER, str(script), str(folder),
                            "--outfile", str(theirs_out), "--outtype", outtype])
            run = {"ours": ours, "llama_cpp": theirs}
            if ours["exit_code"] == 0 and theirs["exit_code"] == 0:
                run["llama_cpp_config"] = CONFIG
                run["time_ratio_ours_over_llama_cpp"] = round(ours["seconds"] / theirs["seconds"], 3)
                run["peak_rss_ratio_ours_over_llama_cpp"] = round(ours["peak_rss_bytes"] / theirs["peak_rss_bytes"], 3)
                run["output_bytes"] = {"ours": ours_out.stat().st_size, "llama_cpp": theirs_out.stat().st_size}
                cmp = subprocess.run([sys.executable, "-c", COMPARE_RUNNER, str(ours_out), str(theirs_out)],
                                     capture_output=True, text=True, check=True)
                run["tensor_data"] = json.loads(cmp.stdout)
            results["runs"][outtype] = run
            for p in (ours_out, theirs_out):
                p.unlink(missing_ok=True)
        print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
