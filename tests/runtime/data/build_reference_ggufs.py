"""Rebuild the reference GGUFs in this folder with llama.cpp's own converter.

Each file is a tiny random-init model (``tests.conftest.build_hf_model``, seed 0, the bundled
tiny-falcon byte-level BPE tokenizer, the family's own FFN activation) converted by
``convert_hf_to_gguf.py`` of llama.cpp — not by us — to f16. ``tests/runtime/test_reference_ggufs.py``
runs aios-run and ``aios-contract check`` on them and rebuilds the same HF models to compare.

llama.cpp's converter ships in the llama-cpp-python sdist; it is never copied into this
repository. Get it with

    pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d /tmp/lc && tar xzf /tmp/lc/*.tar.gz -C /tmp/lc

then run ``python tests/runtime/data/build_reference_ggufs.py /tmp/lc/llama_cpp_python-0.3.36/vendor/llama.cpp``.

Two changes to how it runs, both in the vocabulary step only: its pre-tokenizer check accepts only
tokenizers whose hash it knows, so ``get_vocab_base_pre`` answers "gpt-2" (what the tokenizer
is); and its SentencePiece attempt raises FileNotFoundError (as with ``sentencepiece`` installed
and no ``tokenizer.model``), so the byte-level BPE path is taken. Gemma 2 and Phi-3 are absent:
their converters take the vocabulary from a SentencePiece ``tokenizer.model`` only.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

HERE = Path(__file__).resolve().parent / "reference"
# name -> (tests.conftest TINY_CONFIGS kind, overrides)
# Each family keeps its own FFN activation: a llama.cpp file records none (llama.cpp runs SiLU
# for llama/qwen, GELU for falcon whatever config.json said), so a ReLU model converted by it
# would run as SiLU in llama.cpp and in aios-run alike.
MODELS = {
    "llama3": ("llama", {"llama3": True}),
    # llama.cpp's converter writes no sliding window for Mistral (llama.cpp attends in full):
    # Mistral's own 4096-token window, longer than any test prompt
    "mistral": ("mistral", {"sliding_window": 4096}),
    "qwen2": ("qwen2", {}),
    "qwen3": ("qwen3", {}),
    "gemma3": ("gemma3", {}),
    # transformers writes num_kv_heads = heads for a multi-query Falcon; llama.cpp's converter
    # reads that key, Falcon-7B's own config has 1 there. Its converter also writes
    # feed_forward_length = 4·d whatever the config says, as Falcon-7B/40B have.
    "falcon": ("falcon", {"num_kv_heads": 1, "ffn_hidden_size": 256}),
}
RUNNER = r"""
import runpy, sys
from pathlib import Path
script = sys.argv[1]
sys.path.insert(0, str(Path(script).parent))
sys.path.insert(1, str(Path(script).parent / "gguf-py"))
sys.argv = sys.argv[1:]
import conversion.base as base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
def no_spm(self):
    raise FileNotFoundError("tokenizer.model")
base.TextModel._set_vocab_sentencepiece = no_spm
runpy.run_path(script, run_name="__main__")
"""


def build_source(name: str, folder: Path) -> Path:
    """The HF folder of reference ``name`` (same bytes every time: seeded)."""
    from aios.models.aliases import FIXTURES_DIR
    from tests.conftest import LLAMA3_ROPE, build_hf_model

    kind, over = MODELS[name]
    over = dict(over)
    if over.pop("llama3", False):
        over.update(LLAMA3_ROPE)
    src = build_hf_model(kind, folder, vocab_size=2048, **over)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(FIXTURES_DIR / "tiny-falcon" / f, src / f)
    return src


def main() -> None:
    llama_cpp = Path(sys.argv[1])
    script = llama_cpp / "convert_hf_to_gguf.py"
    HERE.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name in MODELS:
            src = build_source(name, Path(tmp) / name)
            out = HERE / f"{name}.llamacpp.f16.gguf"
            subprocess.run([sys.executable, "-c", RUNNER, str(script), str(src), "--outfile", str(out),
                            "--outtype", "f16"], check=True, capture_output=True)
            print(out.name, out.stat().st_size)


if __name__ == "__main__":
    main()
