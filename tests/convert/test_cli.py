"""convert/cli.py: options and usage (issue 19.9)."""

from __future__ import annotations

import re

from click.testing import CliRunner

from convert.cli import ALIAS_TRAIN_DEFAULTS, main


def test_outtype_is_case_insensitive(tmp_path):
    """llama.cpp spells types Q8_0; ours are lower case: both are accepted."""
    res = CliRunner().invoke(main, ["gguf", "tiny-falcon", "-o", str(tmp_path / "x.gguf"), "--outtype", "Q8_0",
                                    "--dry-run"])
    assert res.exit_code == 0, res.output
    assert "q8_0" in res.output.lower() and not (tmp_path / "x.gguf").exists()


def test_sparsity_map_refuses_a_smooth_activation(tmp_path):
    """GELU never yields exact zeros: a map of it would be meaningless (exit 4, one sentence)."""
    res = CliRunner().invoke(main, ["sparsity-map", "tiny-falcon", "-o", str(tmp_path / "m.npz")])
    assert res.exit_code == 4, res.output
    assert "relufy" in res.output and "Traceback" not in res.output
    assert not (tmp_path / "m.npz").exists()


def test_help_texts_describe_options_and_defaults():
    from convert.alias.train import AliasTrainConfig

    cfg = AliasTrainConfig()
    assert ALIAS_TRAIN_DEFAULTS == {"steps": cfg.steps, "lam": cfg.lam, "lr": cfg.lr}
    for cmd, names in (("relufy", ("--steps", "--seq-len", "--seed")), ("alias", ("--steps", "--lam", "--lr"))):
        params = {o: p for p in main.commands[cmd].params for o in p.opts}
        for name in names:
            p = params[name]
            assert p.help, (cmd, name)
            assert p.show_default or "default" in p.help, (cmd, name)


def test_alias_warns_when_perplexity_gets_much_worse():
    """`alias --train` that made perplexity 5× worse exited 0 without a word (issue 19.9)."""
    from convert.alias.cli import quality_warning

    assert quality_warning(48.9, 48.6) is None and quality_warning(48.9, 52.0) is None
    w = quality_warning(48.9, 250.0)
    assert w is not None and "5.11×" in w and "--baseline" in w


def test_layout_shows_progress(tmp_path):
    """layout on a big model ran silently for minutes (issue 19.10): it prints a line per tenth."""
    from convert.gguf import GGUFExportConfig, export_gguf

    src = tmp_path / "m.gguf"
    export_gguf("tiny-falcon-relu", src, GGUFExportConfig("f32"))
    res = CliRunner().invoke(main, ["layout", str(src), "--samples", "20", "--max-tokens", "8",
                                    "-o", str(tmp_path / "o.gguf")])
    assert res.exit_code == 0, res.output
    lines = [x for x in res.stderr.splitlines() if x.startswith("layout: measuring")]
    assert 2 <= len(lines) <= 11 and lines[-1].endswith("20/20 texts")
    res = CliRunner().invoke(main, ["layout", str(src), "--samples", "20", "--max-tokens", "8", "-q",
                                    "-o", str(tmp_path / "p.gguf")])
    assert res.exit_code == 0 and "layout: measuring" not in res.stderr


def _all_help() -> dict[str, str]:
    """`--help` of every command of the three CLIs, and of each group, as click renders it."""
    from contract.cli import main as contract_main
    from runtime.cli import main as run_main

    out = {}
    for tool, group in (("aios-contract", contract_main), ("aios-convert", main), ("aios-run", run_main)):
        for args in ([], *([name] for name in group.commands)):
            res = CliRunner().invoke(group, [*args, "--help"], prog_name=tool)
            assert res.exit_code == 0, (tool, args, res.output)
            out[" ".join([tool, *args])] = res.stdout
    return out


def test_no_help_text_shows_a_doubled_percent_sign():
    """relufy --help said "~30 %% more compute": click does not %-format help, so "%%" is shown as is."""
    helps = _all_help()
    assert len(helps) >= 15
    assert [name for name, text in helps.items() if "%%" in text] == []


def test_gguf_help_names_every_family_of_the_architecture_table():
    """`gguf --help` said "falcon, llama family, gpt2" while the table had nine rows: the help texts
    are generated from the table (aios/models/architectures.py), so a new row shows up by itself."""
    from aios.models.architectures import ARCHITECTURES

    helps = _all_help()
    words = {k: set(re.findall(r"[\w-]+", v)) for k, v in helps.items()}
    for arch in ARCHITECTURES:
        types = [t for t in arch.hf_model_types if t.islower()]
        assert types and set(types) <= words["aios-convert"], (arch.name, helps["aios-convert"])
        exported = [t for t in arch.export_model_types if t.islower()]
        assert set(exported) <= words["aios-convert gguf"], (arch.name, helps["aios-convert gguf"])


def test_gguf_warnings_go_to_stderr(tmp_path):
    """The "llama.cpp hard-codes 'gelu' for falcon" warning and the fallback lines were printed on
    stdout; they go to stderr (stdout: the plan and the "would write"/"wrote" line), under -q too."""
    for extra in ([], ["-q"]):
        out = tmp_path / f"x{len(extra)}.gguf"
        res = CliRunner().invoke(main, ["gguf", "tiny-falcon-relu", "-o", str(out), "--outtype", "q4_k", *extra])
        assert res.exit_code == 0, res.output
        assert "warning: the model's FFN activation is 'relu' but llama.cpp hard-codes 'gelu'" in res.stderr
        assert "fallback: token_embd.weight: row length 128" in res.stderr
        assert res.stdout.splitlines() == [f"wrote {out}: 39 tensors, 0.70 MiB of tensor data, q4_k, 19 fallback(s); "
                                           "llama.cpp loads it but runs a different FFN activation"]
