"""Model files never run code: pickles are refused by default and, opted in, read weights-only;
``trust_remote_code`` stays off, so ``auto_map`` custom code in a folder is never imported."""

from __future__ import annotations

import json
import pickle

import pytest
import torch
from click.testing import CliRunner

from aios.errors import InvalidModelError, UnsupportedArchitectureError
from aios.models import resolve_model
from aios.models.tensors import PickleStore
from contract.cli import main as contract_cli
from tests.conftest import build_hf_model, write_word_tokenizer


class Payload:
    """Unpickling this runs ``exec``: it writes ``marker`` (what an attacker's file would do)."""

    def __init__(self, marker) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('pwned')",))


@pytest.fixture(scope="module")
def st_model(tmp_path_factory):
    return build_hf_model("llama", tmp_path_factory.mktemp("st") / "m")


def _pickle_folder(src, dst, state) -> None:
    dst.mkdir()
    (dst / "config.json").write_bytes((src / "config.json").read_bytes())
    torch.save(state, dst / "pytorch_model.bin")


def _one_error_line(result, code: int = 4) -> str:
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), result.output
    return lines[0]


def test_pickle_refused_by_default_and_read_weights_only_when_allowed(st_model, tmp_path):
    from safetensors.torch import load_file

    state = load_file(st_model / "model.safetensors")
    folder = tmp_path / "pickled"
    _pickle_folder(st_model, folder, state)
    with pytest.raises(InvalidModelError, match="pickled PyTorch weights.*--allow-pickle"):
        resolve_model(str(folder))
    with pytest.raises(InvalidModelError, match="pickled"):
        resolve_model(str(folder / "pytorch_model.bin"))

    h = resolve_model(str(folder), allow_pickle=True)
    assert isinstance(h.store, PickleStore)
    ref = resolve_model(str(st_model))
    assert {t.name: (t.shape, t.dtype, t.nbytes) for t in h.tensor_inventory()} == \
        {t.name: (t.shape, t.dtype, t.nbytes) for t in ref.tensor_inventory()}
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        got, want = h.load_torch(dtype="float32")(ids).logits, ref.load_torch(dtype="float32")(ids).logits
    assert torch.equal(got, want)

    r = CliRunner().invoke(contract_cli, ["inspect", str(folder)])
    assert "--allow-pickle" in _one_error_line(r)
    r = CliRunner().invoke(contract_cli, ["inspect", str(folder), "--allow-pickle", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["model"]["kind"] == "hf-folder"


def test_malicious_pickle_is_not_executed_even_with_the_opt_in(st_model, tmp_path):
    live = tmp_path / "live-marker"
    pickle.loads(pickle.dumps(Payload(live)))  # the payload is real: a plain unpickler runs it
    assert live.read_text() == "pwned"

    marker = tmp_path / "marker"
    folder = tmp_path / "evil"
    _pickle_folder(st_model, folder, {"model.embed_tokens.weight": torch.zeros(2, 2), "x": Payload(marker)})
    with pytest.raises(InvalidModelError, match="weights-only loader.*Nothing from it was run"):
        resolve_model(str(folder), allow_pickle=True)
    for args in (["inspect", str(folder), "--allow-pickle"], ["check", str(folder), "--allow-pickle"],
                 ["inspect", str(folder)]):
        line = _one_error_line(CliRunner().invoke(contract_cli, args))
        assert "pickle" in line
    assert not marker.exists()


def test_sharded_pickle_index_cannot_point_outside_the_folder(st_model, tmp_path):
    folder = tmp_path / "sharded"
    _pickle_folder(st_model, folder, {"w": torch.zeros(2)})
    (folder / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": {"w": "../../etc/passwd.bin"}}))
    with pytest.raises(InvalidModelError, match="invalid shard"):
        resolve_model(str(folder), allow_pickle=True)


def _remote_code_folder(src, dst, marker, model_type: str | None = None):
    """A model folder whose config and tokenizer config name custom code that writes ``marker``."""
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    code = f"open({str(marker)!r}, 'w').write('pwned')\n"
    for mod in ("evil_model", "evil_config", "evil_tok"):
        (dst / f"{mod}.py").write_text(code)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["auto_map"] = {"AutoConfig": "evil_config.EvilConfig", "AutoModelForCausalLM": "evil_model.EvilModel"}
    if model_type:
        cfg["model_type"] = model_type
    (dst / "config.json").write_text(json.dumps(cfg))
    tok_cfg = json.loads((dst / "tokenizer_config.json").read_text())
    tok_cfg["auto_map"] = {"AutoTokenizer": ["evil_tok.EvilTokenizer", None]}
    (dst / "tokenizer_config.json").write_text(json.dumps(tok_cfg))
    return dst


def test_remote_code_in_a_model_folder_is_never_imported(st_model, tmp_path):
    src = write_word_tokenizer(build_hf_model("llama", tmp_path / "src"))
    marker = tmp_path / "marker"
    folder = _remote_code_folder(src, tmp_path / "remote", marker)
    h = resolve_model(str(folder))
    model = h.load_torch(dtype="float32")
    assert type(model).__module__.startswith("transformers.")
    try:
        h.load_tokenizer()
    except InvalidModelError:
        pass  # refusing the custom tokenizer is fine; running it is not
    custom = _remote_code_folder(src, tmp_path / "custom", marker, model_type="evil-arch")
    with pytest.raises(UnsupportedArchitectureError):
        resolve_model(str(custom))
    r = CliRunner().invoke(contract_cli, ["inspect", str(custom)])
    _one_error_line(r)
    assert not marker.exists()
