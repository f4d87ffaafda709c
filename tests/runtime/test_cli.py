"""``aios-run generate`` / ``bench`` end to end, and the static sparsity-map mode."""

from __future__ import annotations

import json

import numpy as np
from click.testing import CliRunner

from runtime.cli import main
from runtime.model import Model


def test_generate_uses_the_gguf_tokenizer(exported):
    path, _ = exported("tiny-falcon", "f32")
    res = CliRunner().invoke(main, ["generate", str(path), "-p", "The list type", "-n", "8"])
    assert res.exit_code == 0, res.output
    assert res.stdout.startswith("The list type") and "MB/token" in res.stdout


def test_generate_errors(exported, tmp_path):
    path, _ = exported("tiny-falcon", "f32")
    res = CliRunner().invoke(main, ["generate", str(path), "-p", "x", "--mode", "sparse"])
    assert res.exit_code == 2 and "ReLU-family" in res.stderr
    res = CliRunner().invoke(main, ["generate", str(tmp_path / "none.gguf"), "-p", "x"])
    assert res.exit_code == 4


def test_bench_dense_vs_sparse_with_projection(exported, tmp_path):
    dense, _ = exported("tiny-falcon", "f32")
    relu, _ = exported("tiny-falcon", "f32", relu=True)
    out = tmp_path / "bench"
    res = CliRunner().invoke(main, ["bench", str(dense), str(relu), "--modes", "dense,sparse",
                                    "--prompt-tokens", "16", "-n", "6", "-o", str(out)])
    assert res.exit_code == 0, res.output
    data = json.loads((out / "aios-bench.json").read_text())
    rows = {(r["file"].split("/")[-1], r["mode"]): r for r in data["rows"]}
    assert len(rows) == 3 and any("sparse" in s for s in data["skipped"])  # GELU file has no sparse run
    sp = rows[(relu.name, "sparse")]
    assert 0 < sp["reduction_vs_baseline"] < 1 and sp["ffn_density"] < 0.9
    assert sp["projected_reduction"] is not None and sp["measured_over_projected"] is not None
    assert "Measured reduction" in (out / "aios-bench.md").read_text()


def test_map_mode_skips_masked_neurons(exported, tmp_path):
    from convert.gguf import GGUFExportConfig, export_gguf

    _, src = exported("tiny-falcon", "f32", relu=True)
    rng = np.random.default_rng(0)
    masks = {f"layer_{i}": rng.random(512) < 0.5 for i in range(6)}
    np.savez(tmp_path / "map.npz", **masks)
    out = tmp_path / "mapped.gguf"
    export_gguf(str(src), out, GGUFExportConfig(outtype="f32", sparsity_map=str(tmp_path / "map.npz")))
    ids = np.arange(1, 20)
    mp = Model(out, mode="map", arithmetic="float")
    logits = mp.forward(ids, all_logits=True)
    kept = int(sum(m.sum() for m in masks.values()))
    # up projection reads only kept rows; masked neurons never fire
    # one chunk: each kept row is read once whatever the number of tokens
    assert mp.counter.per_tensor["blk.0.ffn_up.weight"] == masks["layer_0"].sum() * 128 * 4
    assert mp.ffn_nnz <= len(ids) * kept
    dense = Model(out, arithmetic="float").forward(ids, all_logits=True)
    assert np.abs(logits - dense).max() > 0  # lossy by construction


def test_bench_cachegrind_columns_and_options(exported, tmp_path, monkeypatch):
    """--cachegrind plumbing: simulated MB/token per row, reductions and their ratio (valgrind stubbed)."""
    import runtime.hw_counters as hw

    relu, _ = exported("tiny-falcon", "f32", relu=True)
    calls = []

    def fake(model, mode, n1, n2, ll, work, prompt_tokens=16, predictor=None, arithmetic=None):
        calls.append((mode, n1, n2, ll))
        return {"mb_per_token": {"dense": 4.0, "sparse": 3.0}[mode], "kernel_mb_per_token": {"dense": 2.0, "sparse": 1.2}[mode]}

    monkeypatch.setattr(hw, "cachegrind_mb_per_token", fake)
    monkeypatch.setattr("shutil.which", lambda name: "/usr/bin/" + name)
    out = tmp_path / "b"
    res = CliRunner().invoke(main, ["bench", str(relu), "--modes", "dense,sparse", "--prompt-tokens", "8", "-n", "3",
                                    "--no-project", "--cachegrind", "--ll-size", "1MiB", "--cachegrind-tokens", "3,7",
                                    "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert calls == [("dense", 3, 7, 1 << 20), ("sparse", 3, 7, 1 << 20)]
    assert "cachegrind" in res.stderr and "(2/2)" in res.stderr  # long runs show progress (issue 19.10)
    data = json.loads((out / "aios-bench.json").read_text())
    sp = data["rows"][1]
    assert sp["cachegrind_reduction_vs_baseline"] == 0.25
    assert sp["cachegrind_over_software"] == round(0.25 / sp["reduction_vs_baseline"], 4)
    assert sp["cachegrind_kernel_reduction_vs_baseline"] == 0.4
    assert sp["cachegrind_kernel_over_software_weights"] == round(0.4 / sp["software_weight_reduction_vs_baseline"], 4)
    assert data["cachegrind"]["ll_bytes"] == 1 << 20 and "simulated" in data["cachegrind"]["evidence"]
    assert "kernel vs weights" in (out / "aios-bench.md").read_text()
    for bad in (["--ll-size", "lots"], ["--cachegrind-tokens", "7,3"], ["--cachegrind-tokens", "x"]):
        res = CliRunner().invoke(main, ["bench", str(relu), "--no-project", "--cachegrind", *bad])
        assert res.exit_code == 2 and res.stderr.startswith("error:"), (bad, res.output)
    monkeypatch.setattr("shutil.which", lambda name: None)
    res = CliRunner().invoke(main, ["bench", str(relu), "--no-project", "--cachegrind", "-n", "2", "--prompt-tokens", "4"])
    assert res.exit_code == 2 and "valgrind" in res.stderr


def test_generate_one_token_says_nothing_was_measured(exported):
    """-n 1 has no decode step: no "measured MB/token 0.000" (issue 19.9)."""
    path, _ = exported("tiny-falcon", "f32")
    res = CliRunner().invoke(main, ["generate", str(path), "-p", "The list type", "-n", "1"])
    assert res.exit_code == 0, res.output
    assert "no MB/token" in res.stdout and "0.000" not in res.stdout


def test_bench_without_output_prints_the_table_not_json(exported):
    """bench without -o used to dump the whole JSON after the table; --json asks for it."""
    path, _ = exported("tiny-falcon", "f32")
    args = ["bench", str(path), "--no-project", "-n", "2", "--prompt-tokens", "4"]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    assert '"rows"' not in res.stdout and "aios-run bench" in res.stdout
    res = CliRunner().invoke(main, [*args, "--json"])
    assert res.exit_code == 0 and '"rows"' in res.stdout


def test_bench_json_stdout_is_json_only(exported, tmp_path):
    """`bench F.gguf --json | python -m json.tool` failed: the table came first on stdout. With -o
    as well, --json printed nothing; now the files are written and the JSON printed (their paths
    on stderr), as `aios-contract check --json -o` does."""
    relu, _ = exported("tiny-falcon", "f32", relu=True)
    q8, _ = exported("tiny-falcon", "q8_0", relu=True)  # its sparse run is skipped: a warning line
    args = ["bench", str(relu), str(q8), "--modes", "dense,sparse", "--no-project", "-n", "2",
            "--prompt-tokens", "4", "--json"]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)  # the whole of stdout
    assert len(data["rows"]) == 3 and f"skipped: {q8.name} [sparse]" in res.stderr
    out = tmp_path / "b"
    res = CliRunner().invoke(main, [*args, "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout) == json.loads((out / "aios-bench.json").read_text())
    assert f"wrote {out / 'aios-bench.json'}" in res.stderr and (out / "aios-bench.md").is_file()


def test_a_folder_or_model_name_gets_the_export_hint():
    """aios-run given an HF folder or an alias says to export first (issue 19.9)."""
    from aios.models.aliases import FIXTURES_DIR

    for model in ("tiny-falcon", str(FIXTURES_DIR / "tiny-falcon")):
        for args in (["generate", model, "-p", "x"], ["bench", model], ["fit-predictor", model]):
            res = CliRunner().invoke(main, args)
            assert res.exit_code == 2, (args, res.output)
            assert res.stderr.startswith("error:") and "aios-convert gguf" in res.stderr


def test_option_spellings_agree_across_commands():
    """--mode/--modes and --ctx/--context are accepted by both commands that take them."""
    from contract.cli import main as contract_main

    bench_opts = {o for p in main.commands["bench"].params for o in p.opts}
    gen_opts = {o for p in main.commands["generate"].params for o in p.opts}
    check_opts = {o for p in contract_main.commands["check"].params for o in p.opts}
    assert {"--mode", "--modes"} <= bench_opts and {"--ctx", "--context"} <= gen_opts
    assert {"--ctx", "--context"} <= check_opts


def test_truncated_gguf_is_named_as_truncated(exported, tmp_path):
    """bench on a truncated GGUF said "No usable tokenizer" (issue 19.9)."""
    path, _ = exported("tiny-falcon", "f32")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(path.read_bytes()[: path.stat().st_size * 2 // 3])
    for args in (["bench", str(cut), "--no-project"], ["generate", str(cut), "-p", "x"]):
        res = CliRunner().invoke(main, args)
        assert res.exit_code == 4 and "truncated" in res.stderr and "tokenizer" not in res.stderr, res.output


def test_bench_skips_an_unsupported_file_mode_pair(exported):
    """One file that cannot run a mode (exact-sparse on a Q8_0 ffn_down) is skipped with a line;
    the other runs still happen (issue 19.9)."""
    f32, _ = exported("tiny-falcon", "f32", relu=True)
    q8, _ = exported("tiny-falcon", "q8_0", relu=True)
    res = CliRunner().invoke(main, ["bench", str(f32), str(q8), "--modes", "dense,sparse", "--no-project",
                                    "-n", "2", "--prompt-tokens", "4"])
    assert res.exit_code == 0, res.output
    assert f"skipped: {q8.name} [sparse]" in res.stderr  # a warning: stdout stays the table


def test_bench_baseline_model_is_the_first_run(exported, tmp_path):
    """--baseline-model: the original model is the baseline, not the relufied one run dense."""
    original, _ = exported("tiny-falcon", "f32")
    relu, _ = exported("tiny-falcon", "f32", relu=True)
    out = tmp_path / "b"
    res = CliRunner().invoke(main, ["bench", str(relu), "--baseline-model", str(original), "--modes", "dense,sparse",
                                    "--no-project", "-n", "2", "--prompt-tokens", "4", "-o", str(out)])
    assert res.exit_code == 0, res.output
    data = json.loads((out / "aios-bench.json").read_text())
    assert data["rows"][0]["file"].endswith(original.name) and data["rows"][0]["reduction_vs_baseline"] in (None, 0.0)
    assert {r["file"].split("/")[-1] for r in data["rows"][1:]} == {relu.name}


def test_warm_loads_the_kernels_a_file_needs(exported):
    path, _ = exported("tiny-llama", "q8_0")
    res = CliRunner().invoke(main, ["warm", str(path)])
    assert res.exit_code == 0, res.output
    assert "kernels ready in" in res.output and "numba cache: " in res.output
    bad = CliRunner().invoke(main, ["warm", str(path.parent / "missing.gguf")])
    assert bad.exit_code != 0 and "Traceback" not in bad.output
