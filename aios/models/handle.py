"""The model handle every command works with: facts, lazy tensors, and a torch module on demand."""

from __future__ import annotations

import functools
import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from aios.errors import AiosError, ExitCode, InvalidModelError, WeightsUnavailableError
from aios.models.architectures import Architecture
from aios.models.facts import ArchFacts
from aios.models.hub import fetch_command
from aios.models.tensors import GGUFStore, SafetensorsStore, TensorInfo


def mem_available() -> int:
    """MemAvailable from /proc/meminfo in bytes (fallback: 8 GiB).

    Public because load plans here and the runtime's KV-cache check both size against it.
    """
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 << 30


class IncompleteWeightsError(AiosError):
    """transformers loaded the model but random-initialized (or could not size) some weights.

    A measurement on such a model would be a measurement of noise (docs/design.md, "Pitfalls"):
    it is never a result. Exit 3: the measurement could not be made on this file.
    """

    exit_code = ExitCode.NOT_EVALUATED

    def __init__(self, message: str, keys: list[str]) -> None:
        super().__init__(message)
        self.keys = keys


def _loading_problems(model, info: dict[str, Any]) -> list[str]:
    """Parameters transformers did not load from the file (``output_loading_info``), minus
    tied ones that share storage with a loaded parameter (e.g. an output head tied to the
    embedding), plus any shape mismatches."""
    missing = sorted(str(k) for k in info.get("missing_keys") or ())
    mismatched = sorted(str(k[0] if isinstance(k, (tuple, list)) else k) for k in info.get("mismatched_keys") or ())
    if missing:
        params = dict(model.named_parameters(remove_duplicate=False))
        loaded = {p.data_ptr() for n, p in params.items() if n not in set(missing)}
        missing = [k for k in missing if k not in params or params[k].data_ptr() not in loaded]
    return missing + mismatched


@contextmanager
def _quiet_loading():
    """transformers' GGUF dequantization bar (a bare tqdm) and its load report belong to the
    --verbose log (``AIOS_VERBOSE``), not to our output; the problems it reports are checked
    by :func:`_loading_problems` and raised as one sentence."""
    if os.environ.get("AIOS_VERBOSE"):
        yield
        return
    import functools
    import logging

    from transformers import modeling_gguf_pytorch_utils as gguf_utils
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    bar = getattr(gguf_utils, "tqdm", None)
    hf_logging.set_verbosity(max(level, logging.ERROR))
    if bar is not None:
        gguf_utils.tqdm = functools.partial(bar, disable=True)
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bar is not None:
            gguf_utils.tqdm = bar


def _summarize_keys(keys: list[str], shown: int = 3) -> str:
    more = f" and {len(keys) - shown} more" if len(keys) > shown else ""
    return ", ".join(keys[:shown]) + more


SourceKind = Literal["hf-folder", "gguf", "hub-cache", "alias"]


@dataclass
class ModelHandle:
    spec: str  # what the user typed
    kind: SourceKind
    arch: Architecture
    facts: ArchFacts
    config: dict[str, Any]  # HF config.json (or the alias's config, or GGUF-derived values)
    path: Path | None = None  # folder or .gguf file; None for an alias without weights
    hub_id: str | None = None
    store: SafetensorsStore | GGUFStore | None = None
    notes: list[str] = field(default_factory=list)

    # --- weights -----------------------------------------------------------------------
    @property
    def has_weights(self) -> bool:
        return self.store is not None

    @property
    def name(self) -> str:
        return self.hub_id or (self.path.name if self.path else self.spec)

    def fetch_hint(self) -> str:
        """How to get weights for a handle that has none."""
        if self.hub_id:
            return fetch_command(self.hub_id)
        return "pass a local model folder or .gguf file"

    def require_weights(self, purpose: str) -> None:
        if not self.has_weights:
            raise WeightsUnavailableError(
                f"{purpose} needs the weights of '{self.spec}', which are not on this machine; "
                f"run `{self.fetch_hint()}` first."
            )

    def tensor_inventory(self) -> list[TensorInfo]:
        """Every stored tensor with shape, dtype and bytes, read from headers only."""
        self.require_weights("The tensor inventory")
        assert self.store is not None
        return list(self.store.inventory.values())

    def tensor(self, name: str):
        """One tensor by its stored name (HF name for folders, GGUF name for .gguf)."""
        self.require_weights(f"Reading tensor '{name}'")
        assert self.store is not None
        return self.store.get(name)

    def stored_name(self, hf_name: str) -> str | None:
        """The name under which this handle stores the HF tensor ``hf_name`` (None if absent).

        GGUF files use llama.cpp names; the mapping comes from gguf-py's TensorNameMap.
        """
        if self.kind != "gguf":
            return hf_name if self.store and hf_name in self.store.inventory else None
        name = _tensor_name_map(self.arch.gguf_arch, self.facts.n_layers).get_name(
            hf_name, try_suffixes=(".weight", ".bias"))
        return name if name and self.store and name in self.store.inventory else None

    def tensor_rows(self, name: str, start: int, stop: int):
        """Rows ``start:stop`` of a stored 2-D tensor as float32 numpy (streaming reads)."""
        self.require_weights(f"Reading tensor '{name}'")
        assert self.store is not None
        return self.store.get_rows(name, start, stop)

    @property
    def weight_bytes(self) -> int | None:
        if not self.has_weights:
            return None
        return sum(t.nbytes for t in self.tensor_inventory())

    # --- activation as declared vs as executed ----------------------------------------
    @property
    def llama_cpp_activation(self) -> str | None:
        """What llama.cpp would execute for this architecture's FFN (hard-coded there)."""
        return self.arch.llama_cpp_ffn_activation

    # --- torch -------------------------------------------------------------------------
    def load_plan(self, available: int | None = None) -> dict[str, Any]:
        """How to fit the model in memory: float32, else bfloat16, else disk offload.

        ``available`` defaults to MemAvailable; a plan keeps 40 % of it free for activations
        and the rest of the process.
        """
        params = sum(t.n_elements for t in self.tensor_inventory())
        avail = available if available is not None else mem_available()
        budget = int(0.6 * avail)
        if params * 4 <= budget:
            return {"dtype": "float32", "offload": False, "params": params, "budget": budget}
        if params * 2 <= budget:
            return {"dtype": "bfloat16", "offload": False, "params": params, "budget": budget}
        return {"dtype": "bfloat16", "offload": True, "params": params, "budget": budget}

    def load_torch(self, dtype: str | None = None, available: int | None = None):
        """The HF ``nn.Module`` in eval mode, for calibration and perplexity.

        Only safetensors (or GGUF, dequantized by transformers) are loaded; remote code is
        never trusted. Without ``dtype`` the plan of :meth:`load_plan` is used: models
        larger than RAM run layer by layer with weights offloaded to disk (accelerate).
        """
        self.require_weights("Running the model")
        import tempfile

        import torch
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # our own progress display owns the terminal
        plan = self.load_plan(available) if dtype is None else {"dtype": dtype, "offload": False}
        kwargs: dict[str, Any] = {"dtype": getattr(torch, plan["dtype"])}
        if plan["offload"]:
            self._offload_dir = tempfile.TemporaryDirectory(prefix="aios-offload-")
            kwargs.update(device_map="auto", offload_folder=self._offload_dir.name,
                          max_memory={"cpu": plan["budget"]})
            self.notes.append(f"Model larger than memory: running with disk offload ({plan['params']:,} params).")
        try:
            with _quiet_loading():
                model, info = self._from_pretrained(kwargs)
        except (OSError, ValueError, KeyError, RuntimeError) as e:
            raise InvalidModelError(
                f"transformers could not load '{self.spec}': {str(e).splitlines()[0][:200]}"
            ) from e
        problems = _loading_problems(model, info)
        if problems:  # random-initialized weights: any measurement would be of noise
            hint = (" (canonical + delta tensors; run the file with aios-run, or export a de-aliased "
                    "GGUF with `aios-convert alias --dealias`)"
                    if self.kind == "gguf" and any(n.endswith(".canonical") or ".delta" in n
                                                   for n in (self.store.inventory if self.store else ()))
                    else "")
            raise IncompleteWeightsError(
                f"transformers did not load {len(problems)} weight(s) of '{self.spec}' "
                f"({_summarize_keys(problems)}) and would random-initialize them{hint}; "
                "nothing was measured on this model.", problems)
        if self.kind != "gguf":  # an HF folder's calibrated cut (GGUFs run theirs in aios-run)
            from aios.models import ffn_cut

            values = ffn_cut.from_config(self.config, self.facts.n_layers)
            if values is not None:
                ffn_cut.install(model, [self.arch.block(i, self.arch.ffn_down)
                                        for i in range(self.facts.n_layers)], values)
        model.eval()
        return model

    def _from_pretrained(self, kwargs: dict[str, Any]):
        """(model, loading info) from transformers, by file kind; see :meth:`load_torch`."""
        from transformers import AutoModelForCausalLM

        if self.kind == "gguf":
            assert self.path is not None
            from transformers import AutoConfig

            # transformers' GGUF loader, like llama.cpp, assumes the architecture's stock
            # activation; run the one the file declares (aios.ffn_activation) instead.
            cfg = AutoConfig.from_pretrained(str(self.path.parent), gguf_file=self.path.name)
            key = self.arch.activation_keys[0]
            if getattr(cfg, key, None) != self.facts.activation:
                setattr(cfg, key, self.facts.activation)
            model, info = AutoModelForCausalLM.from_pretrained(
                str(self.path.parent), gguf_file=self.path.name, config=cfg, output_loading_info=True,
                **kwargs
            )
        elif self.path is not None and (self.path / "aios_alias.json").is_file():
            from aios.models.alias_format import load_aliased_torch  # canonical + delta folder

            model, info = load_aliased_torch(self, kwargs["dtype"]), {}
        else:
            # pickles only with --allow-pickle (PickleStore); transformers then reads them
            # with torch.load(weights_only=True) as well
            pickled = type(self.store).__name__ == "PickleStore"
            model, info = AutoModelForCausalLM.from_pretrained(
                str(self.path), trust_remote_code=False, use_safetensors=not pickled, weights_only=True,
                output_loading_info=True, **kwargs
            )
        return model, info

    def load_tokenizer(self):
        if self.path is None:
            self.require_weights("Tokenizing")
        assert self.path is not None
        try:
            if self.kind == "gguf":
                from aios.models.gguf_tokenizer import load_gguf_tokenizer

                return load_gguf_tokenizer(self.path)
            from transformers import AutoTokenizer  # (imports torch: not on the GGUF path)

            return AutoTokenizer.from_pretrained(str(self.path))
        except (OSError, ValueError, KeyError) as e:
            raise InvalidModelError(
                f"No usable tokenizer for '{self.spec}': {str(e).splitlines()[0][:200]}"
            ) from e

    def describe(self) -> dict[str, Any]:
        return {
            "spec": self.spec,
            "kind": self.kind,
            "path": str(self.path) if self.path else None,
            "hub_id": self.hub_id,
            "architecture": self.arch.name,
            "has_weights": self.has_weights,
            "facts": self.facts.to_dict(),
            "notes": list(self.notes),
        }


@functools.lru_cache(maxsize=8)
def _tensor_name_map(gguf_arch: str, n_layers: int):
    """gguf-py's TensorNameMap for an architecture and depth, built once: building it takes
    ~10 ms (every name of every block), and R3 asks for a name per matrix (215 builds, 2.3 s,
    on the real Gemma 3 270M)."""
    import gguf

    return gguf.get_tensor_name_map(gguf.MODEL_ARCH[gguf_arch], n_layers)
