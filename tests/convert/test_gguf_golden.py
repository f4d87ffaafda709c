"""Byte-identical GGUF output: every fixture x every outtype, and the alias exports.

``data/golden_gguf.json`` holds the sha256 of each file as the exporters wrote it before the
GGUF spine (``convert/gguf/``) replaced the per-exporter code paths; identical input must keep
giving identical bytes (docs/design.md, "Determinism"). The de-aliased export's digest is the
one exception: it used to carry its random temp folder's name as ``general.name``, so it was
never reproducible; it is now named after the source folder. These paths use no BLAS and no
randomness (layouts are permutations, quantizers are element-wise or compiled without
fast-math), so the digests do not depend on the CPU.

A change that alters output on purpose (a new key, a new tool version, a different quantizer)
updates the digests — regenerate with ``python tests/convert/test_gguf_golden.py`` and say
why in the commit.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest

GOLDEN = Path(__file__).with_name("data") / "golden_gguf.json"
FIXTURES = ("tiny-falcon", "tiny-llama", "tiny-falcon-relu")
OUTTYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_k", "q6_k", "q2_k")
ALIAS_OUTTYPES = ("f32", "q8_0", "q4_0", "bf16")


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _export(key: str, out: Path) -> Path:
    from aios.models.aliases import FIXTURES_DIR
    from convert.alias.export import export_alias_gguf
    from convert.gguf import GGUFExportConfig, export_gguf

    kind, name, outtype = key.split("/")
    if kind == "gguf":
        export_gguf(str((FIXTURES_DIR / name)), out, GGUFExportConfig(outtype))
    else:
        export_alias_gguf((FIXTURES_DIR / name), out, outtype=outtype, dealias=kind == "dealias")
    return out


KEYS = ([f"gguf/{f}/{t}" for f in FIXTURES for t in OUTTYPES]
        + [f"alias/tiny-falcon-alias/{t}" for t in ALIAS_OUTTYPES] + ["dealias/tiny-falcon-alias/f32"])


@pytest.mark.parametrize("key", KEYS)
def test_export_is_byte_identical(key, tmp_path):
    want = json.loads(GOLDEN.read_text())[key]
    assert _sha(_export(key, tmp_path / "out.gguf")) == want, f"{key}: output bytes changed"


if __name__ == "__main__":  # regenerate the digests
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        digests = {k: _sha(_export(k, Path(d) / "out.gguf")) for k in KEYS}
    GOLDEN.write_text(json.dumps(digests, indent=1, sort_keys=True) + "\n")
    print(f"wrote {len(digests)} digests to {GOLDEN}", file=sys.stderr)
