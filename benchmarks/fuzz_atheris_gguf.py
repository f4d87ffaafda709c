"""Coverage-guided fuzzing (atheris / libFuzzer) of GGUF bytes through model resolution and the runtime.

    pip install atheris   # optional; not a project dependency
    python benchmarks/fuzz_atheris_gguf.py -max_total_time=300 -rss_limit_mb=4096

Seed: a small valid GGUF from tests/hostile/test_hostile_fuzz.py. Any exception other than an
AiosError (our documented clean error) is a finding: libFuzzer stops and writes the input.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import atheris  # noqa: E402

with atheris.instrument_imports():
    from aios.errors import AiosError
    from aios.models import resolve_model
    from aios.models import gguf_bounds, tensors  # noqa: F401
    from runtime import gguf_checks  # noqa: F401
from runtime.model import Model  # noqa: E402

WORK = Path(tempfile.mkdtemp(prefix="aios-atheris-"))
TARGET = WORK / "input.gguf"


def one_input(data: bytes) -> None:
    TARGET.write_bytes(data)
    try:
        h = resolve_model(str(TARGET))
        h.store.metadata()  # type: ignore[union-attr]
        for t in h.tensor_inventory()[:2]:
            h.tensor(t.name)
    except AiosError:
        pass
    try:
        Model(TARGET, n_ctx=8).forward([1])
    except AiosError:
        pass


def main() -> None:
    from tests.hostile.test_hostile_fuzz import write_seed_gguf

    corpus = WORK / "corpus"
    corpus.mkdir()
    write_seed_gguf(corpus / "seed.gguf")
    argv = [sys.argv[0], *sys.argv[1:], str(corpus)]
    atheris.Setup(argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    main()
