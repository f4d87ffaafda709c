"""``convert.alias.run``: the alias command's one library call, and the torch-free vocabularies."""

from __future__ import annotations

import subprocess
import sys

import pytest

from aios.errors import UsageError
from aios.models import resolve_model
from aios.models import alias_format as af
from aios.models.aliases import FIXTURES_DIR
from convert.alias.run import export_aliased, run_alias


@pytest.mark.parametrize("kwargs, text", [
    (dict(steps=5), "need --train"),
    (dict(delta_norm="fro"), "need --train"),
    (dict(train=True, canonical="medoid"), "post-hoc"),
    (dict(train=True, min_cosine=0.5), "post-hoc"),
])
def test_option_combinations_each_mode_refuses(tmp_path, kwargs, text):
    with pytest.raises(UsageError, match=text):
        run_alias("tiny-falcon", tmp_path / "out", **kwargs)
    assert not (tmp_path / "out").exists()


def test_export_only_needs_an_output(tmp_path):
    with pytest.raises(UsageError, match="Pass -o OUT"):
        run_alias("tiny-falcon", None)


def test_export_only_reports_each_file_as_it_is_written(tmp_path):
    heard = []
    results = export_aliased(str(FIXTURES_DIR / "tiny-falcon-alias"), gguf=tmp_path / "a.gguf",
                             dealias=tmp_path / "d.gguf", outtype="f32",
                             exported=lambda res, flat: heard.append((res.output.name, flat)))
    assert heard == [("a.gguf", False), ("d.gguf", True)]
    assert [r.output.name for r in results] == ["a.gguf", "d.gguf"]
    assert af.groups_of(resolve_model(str(tmp_path / "a.gguf")))
    assert not af.groups_of(resolve_model(str(tmp_path / "d.gguf")))


def test_the_convert_cli_builds_its_choices_without_torch():
    code = "import sys, convert.cli; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
