"""Built-in model aliases: a hub id plus the architecture's published config values as data.

With these, static checks (R2, R4, declared activation) work with no weights on disk.
The config dicts hold only the keys our architecture rows read, with the values of the
models' published ``config.json`` files.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FIXTURES_DIR = Path(__file__).resolve().parent.parent / "fixtures"


@dataclass(frozen=True)
class Alias:
    name: str
    hub_id: str | None  # None for bundled fixtures
    config: dict[str, Any] = field(default_factory=dict)
    local_path: Path | None = None  # bundled fixtures live inside the package
    note: str = ""


_LLAMA2_7B = dict(
    model_type="llama",
    num_hidden_layers=32,
    hidden_size=4096,
    num_attention_heads=32,
    num_key_value_heads=32,
    intermediate_size=11008,
    hidden_act="silu",
    vocab_size=32000,
    max_position_embeddings=4096,
    tie_word_embeddings=False,
)

ALIASES: tuple[Alias, ...] = (
    Alias(
        "falcon-7b",
        "tiiuae/falcon-7b",
        dict(
            model_type="falcon",
            num_hidden_layers=32,
            hidden_size=4544,
            num_attention_heads=71,
            multi_query=True,
            parallel_attn=True,
            new_decoder_architecture=False,
            ffn_hidden_size=18176,
            activation="gelu",
            vocab_size=65024,
            max_position_embeddings=2048,
            tie_word_embeddings=True,
            bias=False,
        ),
    ),
    Alias(
        "falcon-40b",
        "tiiuae/falcon-40b",
        dict(
            model_type="falcon",
            num_hidden_layers=60,
            hidden_size=8192,
            num_attention_heads=128,
            num_kv_heads=8,
            new_decoder_architecture=True,
            parallel_attn=True,
            ffn_hidden_size=32768,
            activation="gelu",
            vocab_size=65024,
            max_position_embeddings=2048,
            tie_word_embeddings=True,
            bias=False,
        ),
    ),
    Alias("llama-2-7b", "meta-llama/Llama-2-7b-hf", dict(_LLAMA2_7B)),
    Alias(
        "llama-3.1-8b",
        "meta-llama/Llama-3.1-8B",
        dict(
            model_type="llama",
            num_hidden_layers=32,
            hidden_size=4096,
            num_attention_heads=32,
            num_key_value_heads=8,
            intermediate_size=14336,
            hidden_act="silu",
            vocab_size=128256,
            max_position_embeddings=131072,
            tie_word_embeddings=False,
        ),
    ),
    Alias(
        "mistral-7b",
        "mistralai/Mistral-7B-v0.1",
        dict(
            model_type="mistral",
            num_hidden_layers=32,
            hidden_size=4096,
            num_attention_heads=32,
            num_key_value_heads=8,
            intermediate_size=14336,
            hidden_act="silu",
            vocab_size=32000,
            max_position_embeddings=32768,
            tie_word_embeddings=False,
        ),
    ),
    Alias(
        "qwen2.5-7b",
        "Qwen/Qwen2.5-7B",
        dict(
            model_type="qwen2",
            num_hidden_layers=28,
            hidden_size=3584,
            num_attention_heads=28,
            num_key_value_heads=4,
            intermediate_size=18944,
            hidden_act="silu",
            vocab_size=152064,
            max_position_embeddings=131072,
            tie_word_embeddings=False,
        ),
    ),
    Alias(
        "gemma-2-9b",
        "google/gemma-2-9b",
        dict(
            model_type="gemma2",
            num_hidden_layers=42,
            hidden_size=3584,
            num_attention_heads=16,
            num_key_value_heads=8,
            head_dim=256,
            intermediate_size=14336,
            hidden_activation="gelu_pytorch_tanh",
            vocab_size=256000,
            max_position_embeddings=8192,
            tie_word_embeddings=True,
        ),
    ),
    Alias(
        "phi-3-mini",
        "microsoft/Phi-3-mini-4k-instruct",
        dict(
            model_type="phi3",
            num_hidden_layers=32,
            hidden_size=3072,
            num_attention_heads=32,
            num_key_value_heads=32,
            intermediate_size=8192,
            hidden_act="silu",
            vocab_size=32064,
            max_position_embeddings=4096,
            tie_word_embeddings=False,
        ),
    ),
    Alias(
        "relullama-7b",
        "SparseLLM/ReluLLaMA-7B",
        dict(_LLAMA2_7B, hidden_act="relu"),
        note="Llama-2-7B relufied (ReLU on the gate of the SwiGLU FFN).",
    ),
    Alias(
        "prosparse-llama-2-7b",
        "SparseLLM/prosparse-llama-2-7b",
        dict(_LLAMA2_7B, hidden_act="fatrelu", hidden_act_param=0.01),
        note="ProSparse: progressive L1 + threshold shift; FATReLU with threshold 0.01.",
    ),
    Alias(
        "tiny-falcon",
        None,
        local_path=FIXTURES_DIR / "tiny-falcon",
        note="Bundled fixture: 6-layer Falcon (GELU, MQA, parallel attention) trained offline.",
    ),
    Alias(
        "tiny-llama",
        None,
        local_path=FIXTURES_DIR / "tiny-llama",
        note="Bundled fixture: 6-layer Llama (gated SiLU, GQA with 2 KV heads) trained offline.",
    ),
    Alias(
        "tiny-falcon-relu",
        None,
        local_path=FIXTURES_DIR / "tiny-falcon-relu",
        note="Bundled fixture: tiny-falcon relufied by aios-convert relufy (ReLU, ~92 % exact zeros).",
    ),
    Alias(
        "tiny-falcon-alias",
        None,
        local_path=FIXTURES_DIR / "tiny-falcon-alias",
        note="Bundled fixture: tiny-falcon with trained canonical + delta weights (aios-convert alias --train; R3 pass).",
    ),
)

DEFAULT_MODEL = "tiny-falcon"


def find_alias(name: str) -> Alias | None:
    """Case-insensitive lookup by alias name or by the alias's hub id."""
    key = name.lower()
    for a in ALIASES:
        if a.name == key or (a.hub_id is not None and a.hub_id.lower() == key):
            return a
    return None
