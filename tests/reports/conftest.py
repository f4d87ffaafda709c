"""Real check reports of the bundled fixture (computed once per session) and run results.

``sparse_falcon`` is the trained tiny-falcon with its config switched to ReLU and 85 % of its
FFN neurons made dead: every LayerNorm bias gets +1 and those neurons' up-projection rows get
−(50/d)·1ᵀ, a −50 shift of their pre-activation (the LayerNorm output has zero mean over
features, so only the bias moves). R1 then passes *by measurement* (exact zeros ≥ 70 %). It
is a synthetic stand-in for a relufied model, used only to produce a real R1 pass.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict
from pathlib import Path

import pytest

from contract.check import check_model

FAST = dict(samples=4, max_tokens=16)
REPO = Path(__file__).resolve().parents[2]
SARIF_SCHEMA_DEFAULT = REPO / ".cache" / "sarif" / "sarif-2.1.0-rtm.5.json"


@pytest.fixture(scope="session")
def falcon_report():
    return check_model("tiny-falcon", **FAST)


def make_sparse_falcon(folder: Path, dead: float = 0.85) -> Path:
    import torch
    from safetensors.torch import load_file, save_file

    from aios.models.aliases import FIXTURES_DIR

    shutil.copytree(FIXTURES_DIR / "tiny-falcon", folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["activation"] = "relu"
    (folder / "config.json").write_text(json.dumps(cfg))
    sd = load_file(folder / "model.safetensors")
    d = cfg["hidden_size"]
    for i in range(cfg["num_hidden_layers"]):
        sd[f"transformer.h.{i}.input_layernorm.bias"] += 1.0
        up = sd[f"transformer.h.{i}.mlp.dense_h_to_4h.weight"]  # (d_ffn, d)
        rows = torch.arange(int(dead * up.shape[0]))
        up[rows] -= 50.0 / d
    save_file(sd, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


@pytest.fixture(scope="session")
def sparse_falcon(tmp_path_factory) -> Path:
    return make_sparse_falcon(tmp_path_factory.mktemp("sparse") / "tiny-falcon-sparse")


@pytest.fixture(scope="session")
def sparse_falcon_report(sparse_falcon):
    return check_model(str(sparse_falcon), **FAST)


@pytest.fixture(scope="session")
def bench_result() -> dict:
    """A result in ``aios-run bench``'s exact shape (rows built from its own BenchRow)."""
    from runtime.bench import BENCH_SCHEMA_VERSION, BenchRow

    def row(file, mode, w, kv, act, density, red=None, proj=None):
        return BenchRow(file=file, mode=mode, lossy=False, activation="relu", arithmetic="float",
                        weight_bytes=5_000_000, prompt_tokens=64, decode_forwards=32, prefill_tokens_per_s=900.0,
                        decode_tokens_per_s=120.0,
                        decode_mb_per_token={"weights": w, "kv_cache": kv, "activations": act},
                        decode_mb_per_token_total=round(w + kv + act, 6), ffn_density=density,
                        reduction_vs_baseline=red, projected_reduction=proj,
                        measured_over_projected=round(red / proj, 4) if red and proj else None)

    return {
        "schema_version": BENCH_SCHEMA_VERSION, "tool": "aios-run bench", "tool_version": "0.1.0",
        "evidence": "measured (software byte counter: bytes the runtime's kernels read)",
        "settings": {"prompt_tokens": 64, "new_tokens": 32, "chunk": 64, "modes": ["dense", "sparse"]},
        "baseline": {"file": "tiny-falcon.gguf", "mode": "dense"},
        "rows": [asdict(row("tiny-falcon.gguf", "dense", 5.1, 0.06, 0.004, 1.0)),
                 asdict(row("tiny-falcon-relu.gguf", "sparse", 3.2, 0.06, 0.004, 0.08, 0.365, 0.41))],
        "skipped": [],
    }


@pytest.fixture(scope="session")
def relufy_provenance() -> dict:
    """Shaped like the ``aios_relufy.json`` that convert/relufication/run.py writes (numbers made up)."""
    def m(zero, ppl):
        return {"heldout_perplexity": ppl, "mean_exact_zero_fraction": zero,
                "per_layer_exact_zero_fraction": [zero] * 6}

    return {
        "format_version": 1, "tool": "aios-convert relufy", "tool_version": "0.1.0",
        "source": {"model": "tiny-falcon", "name": "tiny-falcon", "architecture": "falcon", "activation": "gelu"},
        "config": {"activation": "relu", "steps": 200, "lr": 0.002, "l1": 2.0}, "steps": 200,
        "metrics": {"before": m(0.0, 48.9), "after_swap": m(0.45, 120.0), "after": m(0.91, 52.3),
                    "perplexity_ratio": 1.0695},
        "curve": [{"step": s, **m(z, p)} for s, z, p in [(50, 0.62, 61.0), (100, 0.78, 55.1)]],
    }


@pytest.fixture(scope="session")
def sarif_validator():
    """Draft-04 validator of the official SARIF 2.1.0 schema, fetched by scripts/test.sh."""
    import jsonschema

    path = Path(os.environ.get("AIOS_SARIF_SCHEMA") or SARIF_SCHEMA_DEFAULT)
    if not path.is_file():
        pytest.fail(f"The SARIF 2.1.0 schema is missing at {path}: run `bash scripts/test.sh` (it fetches "
                    "the schema from npm at install time) or set AIOS_SARIF_SCHEMA.", pytrace=False)
    schema = json.loads(path.read_text(encoding="utf-8"))
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)
