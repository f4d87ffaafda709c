"""Hugging Face hub ids: find them in the local cache, or download them (explicitly).

Environment variables are read at call time (not at import, as huggingface_hub's
constants are) so that ``HF_HOME`` / ``HF_HUB_CACHE`` / ``HF_HUB_OFFLINE`` set by a caller
or a test take effect.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from aios.errors import AiosError, ExitCode, ModelNotFoundError

# Files we need from a repository: configs, tokenizer, safetensors weights (never pickles).
DOWNLOAD_PATTERNS = ["*.json", "*.safetensors", "tokenizer.model", "*.txt"]

_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")


def looks_like_hub_id(spec: str) -> bool:
    return bool(_HUB_ID.match(spec)) and not spec.endswith(".gguf")


def hub_cache_dir() -> Path:
    """The hub cache folder, honouring HF_HUB_CACHE, then HF_HOME, like huggingface_hub."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return Path(os.environ[var]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "huggingface" / "hub"


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}


def find_in_cache(hub_id: str, revision: str = "main") -> Path | None:
    """The snapshot folder of ``hub_id`` in the local cache, or None.

    Delegates the cache layout (``models--org--name/refs/<rev>`` -> ``snapshots/<sha>``)
    to huggingface_hub with ``local_files_only=True``: no network is touched.
    """
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    cache = hub_cache_dir()
    if not (cache / ("models--" + hub_id.replace("/", "--"))).is_dir():
        return None
    try:
        path = snapshot_download(
            hub_id, revision=revision, cache_dir=str(cache), local_files_only=True
        )
    except (LocalEntryNotFoundError, FileNotFoundError, OSError, ValueError):
        return None
    path = Path(path)
    return path if (path / "config.json").is_file() or any(path.glob("*.gguf")) else None


def find_dataset_in_cache(dataset_id: str, revision: str = "main") -> Path | None:
    """The snapshot folder of the hub *dataset* ``dataset_id`` in the local cache, or None
    (``datasets--org--name``; huggingface_hub resolves it with ``local_files_only=True``)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    cache = hub_cache_dir()
    if not (cache / ("datasets--" + dataset_id.replace("/", "--"))).is_dir():
        return None
    try:
        path = snapshot_download(dataset_id, repo_type="dataset", revision=revision,
                                 cache_dir=str(cache), local_files_only=True)
    except (LocalEntryNotFoundError, FileNotFoundError, OSError, ValueError):
        return None
    return Path(path)


class DownloadError(AiosError):
    exit_code = ExitCode.NOT_EVALUATED


def download(hub_id: str, revision: str = "main", token: str | None = None) -> Path:
    """Download config, tokenizer and safetensors weights of ``hub_id`` into the cache.

    Never called implicitly by model resolution: commands that need weights tell the user
    to run ``aios-contract fetch`` instead.
    """
    if hub_offline():
        raise DownloadError(
            f"HF_HUB_OFFLINE is set, so '{hub_id}' cannot be downloaded; unset it or copy "
            "the model into the cache."
        )
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError

    try:
        path = snapshot_download(
            hub_id,
            revision=revision,
            cache_dir=str(hub_cache_dir()),
            allow_patterns=DOWNLOAD_PATTERNS,
            token=token,
        )
    except RepositoryNotFoundError as e:
        raise ModelNotFoundError(f"The hub has no repository '{hub_id}' (or it is gated).") from e
    except (HfHubHTTPError, OSError) as e:
        raise DownloadError(f"Downloading '{hub_id}' failed: {e.__class__.__name__}: {e}") from e
    return Path(path)


def fetch_command(hub_id: str) -> str:
    """The exact command that brings ``hub_id``'s weights into the local cache."""
    return f"aios-contract fetch {hub_id}"
