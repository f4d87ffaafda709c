"""``aios-convert layout`` (R5): frequency order, manifest offsets that match the file, the
checker's R5 on the output (pass, and a named failure when one offset is changed)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest
from click.testing import CliRunner

from aios.data import load_texts
from aios.models import resolve_model
from aios.models.aliases import find_alias
from contract.checks import r5_layout
from contract.checks.base import CheckContext
from contract.spec.manifest import FREQ_RANK, Manifest, real_layout, verify
from contract.result import Status
from convert.cli import main
from convert.gguf import GGUFExportConfig, export_gguf
from convert.layout import (Block, LayoutConfig, block_frequency, classify, ffn_read_fraction,
                            layout_gguf, order_blocks, tier)

TEXTS = load_texts(limit=12)


def r5(path: Path):
    return r5_layout.check(resolve_model(str(path)), CheckContext(calibration_texts=TEXTS[:1]))


@pytest.fixture(scope="module")
def relu_llama_gguf(tmp_path_factory) -> Path:
    """tiny-llama with a ReLU gate declared: FFN rows fire about half the time (medium)."""
    d = tmp_path_factory.mktemp("relu")
    folder = d / "relu-llama"
    shutil.copytree(find_alias("tiny-llama").local_path, folder)  # type: ignore[union-attr]
    cfg = json.loads((folder / "config.json").read_text())
    cfg["hidden_act"] = "relu"
    (folder / "config.json").write_text(json.dumps(cfg))
    out = d / "relu-llama.gguf"
    export_gguf(str(folder), out, GGUFExportConfig("q8_0"))
    return out


@pytest.fixture(scope="module")
def ordered(relu_llama_gguf, tmp_path_factory):
    out = tmp_path_factory.mktemp("ordered") / "ordered.gguf"
    result = layout_gguf(str(relu_llama_gguf), out, LayoutConfig(max_tokens=64), calibration_texts=TEXTS)
    return result


# --- pure functions --------------------------------------------------------------------------


def test_block_frequency_rules():
    read = np.array([0.4, 0.1])
    assert block_frequency("token_embd.weight", read, gated=True) == 1.0
    assert block_frequency("blk.1.attn_q.weight", read, gated=True) == 1.0
    assert block_frequency("blk.1.ffn_gate.weight", read, gated=True) == 1.0  # decides who fires
    assert block_frequency("blk.1.ffn_up.weight", read, gated=True) == 0.1
    assert block_frequency("blk.1.ffn_up.weight", read, gated=False) == 1.0  # its output is the activation
    assert block_frequency("blk.0.ffn_down.weight", read, gated=False) == 0.4
    assert [classify(f, 0.9, 0.2) for f in (1.0, 0.9, 0.5, 0.19)] == ["high", "high", "medium", "low"]
    assert tier("output.weight", "high", 8) == "HOT" and tier("blk.7.attn_q.weight", "high", 8) == "HOT"
    assert tier("blk.4.attn_q.weight", "high", 8) == "WARM" and tier("blk.0.ffn_down.weight", "low", 8) == "STREAM"
    blocks = [Block("a", 0.5, "medium", "WARM", 1), Block("b", 1.0, "high", "WARM", 1),
              Block("c", 0.1, "low", "STREAM", 1), Block("d", 1.0, "high", "HOT", 1)]
    assert [b.name for b in order_blocks(blocks)] == ["d", "b", "a", "c"]
    freq = np.array([[1.0, 0.5, 0.0, 0.5]])
    assert ffn_read_fraction(freq, {}) == pytest.approx([0.5])
    assert ffn_read_fraction(freq, {0: np.array([1, 0, 1, 0], bool)}) == pytest.approx([0.25])


# --- the rewritten file ----------------------------------------------------------------------


def test_layout_orders_blocks_and_manifest_matches_file(ordered, relu_llama_gguf):
    out = ordered.output
    assert all(0.3 < f < 0.8 for f in ordered.ffn_read_fraction)  # ReLU gate: about half fire
    r = gguf.GGUFReader(str(out))
    embedded = Manifest.model_validate_json(r.get_field("aios.manifest").contents())
    sidecar = Manifest.model_validate_json(ordered.sidecar.read_text())
    assert ordered.sidecar.name == "ordered.aios.json" and embedded == sidecar
    assert verify(embedded, real_layout(out, resolve_model(str(out)))) == []
    # file order is the manifest order, and it descends high -> medium
    assert [t.name for t in r.tensors] == [b.block_id for b in embedded.layout]
    ranks = [FREQ_RANK[b.access_frequency] for b in embedded.layout]
    assert ranks == sorted(ranks) and set(ranks) == {0, 1}
    medium = {b.block_id for b in embedded.layout if b.access_frequency == "medium"}
    assert medium == {f"blk.{i}.ffn_{k}.weight" for i in range(6) for k in ("up", "down")}
    assert embedded.layout[0].rws_tier == "HOT"
    # same tensors, same bytes, same keys (plus the layout's own)
    src = {t.name: t for t in gguf.GGUFReader(str(relu_llama_gguf)).tensors}
    for t in r.tensors:
        assert t.tensor_type == src[t.name].tensor_type
        assert np.array_equal(np.asarray(t.data), np.asarray(src[t.name].data))
    assert r.get_field("aios.ffn_activation").contents() == "relu"
    assert len(r.get_field("aios.layout.ffn_read_fraction").contents()) == 6


def test_checker_r5_passes_and_names_a_changed_offset(ordered, tmp_path):
    res = r5(ordered.output)
    assert res.status == Status.passed, res.summary
    # one offset changed in the embedded manifest (same length, patched in place)
    broken = tmp_path / "broken.gguf"
    raw = ordered.output.read_bytes()
    target = json.loads(ordered.sidecar.read_text())["layout"][7]
    old = f'"block_id":"{target["block_id"]}","access_frequency":"{target["access_frequency"]}",' \
          f'"rws_tier":"{target["rws_tier"]}","offset_bytes":{target["offset_bytes"]}'
    new = old[:-1] + str((int(old[-1]) + 1) % 10)
    assert raw.count(old.encode()) == 1
    broken.write_bytes(raw.replace(old.encode(), new.encode()))
    res = r5(broken)
    assert res.status == Status.failed and target["block_id"] in res.summary and "offset" in res.summary
    # the same change in the sidecar, checked on its own
    side = json.loads(ordered.sidecar.read_text())
    side["layout"][7]["offset_bytes"] += 32
    problems = verify(Manifest.model_validate(side), real_layout(ordered.output, resolve_model(str(ordered.output))))
    assert len(problems) >= 1 and target["block_id"] in problems[0]


def test_layout_output_runs_in_llama_cpp_like_its_input(ordered, relu_llama_gguf):
    """The reordered file computes exactly what the input does (here ReLU declared, so
    llama.cpp runs SiLU on both: the point is identical bytes in, identical logits out)."""
    from aios.reference import llamacpp

    ids = list(range(5, 45))
    a, b = (llamacpp.logits(path, ids, n_ctx=64, n_threads=2) for path in (relu_llama_gguf, ordered.output))
    assert a.config == b.config  # the same llama.cpp configuration computed both
    assert np.array_equal(a.value, b.value)


def test_layout_is_deterministic_and_cli(relu_llama_gguf, ordered, tmp_path):
    calib = tmp_path / "calib.jsonl"
    calib.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    out = tmp_path / "cli.gguf"
    res = CliRunner().invoke(main, ["layout", str(relu_llama_gguf), "--calibration", str(calib),
                                    "--max-tokens", "64", "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert re.search(r"\d+ high, 12 medium, 0 low", res.output)
    assert (tmp_path / "cli.aios.json").is_file()
    assert json.loads(gguf.GGUFReader(str(out)).get_field("aios.layout.config").contents())[
        "calibration"] == "calib.jsonl"  # a file name, not a machine-specific path
    # same input, same calibration, same config -> same bytes
    again = tmp_path / "again.gguf"
    layout_gguf(str(relu_llama_gguf), again, LayoutConfig(max_tokens=64), calibration_texts=TEXTS)
    assert again.read_bytes() == ordered.output.read_bytes()


def test_layout_user_errors(tmp_path, relu_llama_gguf):
    run = lambda *a: CliRunner().invoke(main, ["layout", *a])  # noqa: E731
    out = tmp_path / "o.gguf"
    assert run(str(tmp_path / "missing.gguf"), "-o", str(out)).exit_code == 4
    res = run("tiny-llama", "-o", str(out))
    assert res.exit_code == 4 and "not a .gguf file" in res.output
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x03" * 40)
    assert run(str(bad), "-o", str(out)).exit_code == 4
    assert run(str(relu_llama_gguf), "-o", str(out), "--calibration", str(tmp_path / "none.jsonl")).exit_code == 4
    assert run(str(relu_llama_gguf), "-o", str(out), "--samples", "0").exit_code == 2
    assert not out.exists()


def test_interrupted_layout_leaves_nothing(monkeypatch, relu_llama_gguf, tmp_path):
    from convert.gguf.writer import FileSlice

    def boom(*_a, **_k):
        raise KeyboardInterrupt

    monkeypatch.setattr(FileSlice, "tofile", boom)
    out = tmp_path / "o" / "x.gguf"
    with pytest.raises(KeyboardInterrupt):
        layout_gguf(str(relu_llama_gguf), out, LayoutConfig(max_tokens=16), calibration_texts=TEXTS[:2])
    assert list(out.parent.iterdir()) == []


def test_layout_counts_only_neurons_a_sparsity_map_keeps(relu_llama_gguf, tmp_path):
    """A GGUF carrying blk.N.ffn_active masks: pruned neurons are never read, so the measured
    read fraction drops by the kept share (transformers' loader skips the extra tensors)."""
    folder = relu_llama_gguf.parent / "relu-llama"
    keep = np.zeros(352, bool)
    keep[::2] = True
    np.savez(tmp_path / "map.npz", **{f"layer_{i}": keep for i in range(6)})
    sparse = tmp_path / "sparse.gguf"
    export_gguf(str(folder), sparse, GGUFExportConfig("q8_0", str(tmp_path / "map.npz")))
    dense = layout_gguf(str(relu_llama_gguf), tmp_path / "d.gguf", LayoutConfig(max_tokens=32),
                        calibration_texts=TEXTS[:4])
    masked = layout_gguf(str(sparse), tmp_path / "s.gguf", LayoutConfig(max_tokens=32), calibration_texts=TEXTS[:4])
    assert all(0 < m < d for m, d in zip(masked.ffn_read_fraction, dense.ffn_read_fraction))
    assert r5(masked.output).status == Status.passed
    assert any(b.name == "blk.0.ffn_active" and b.access == "high" for b in masked.blocks)
