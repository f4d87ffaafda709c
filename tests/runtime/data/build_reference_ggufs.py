"""Rebuild the reference GGUFs in this folder with llama.cpp's own converter.

Each file is a tiny random-init model (``tests.conftest.build_hf_model``, seed 0, the family's own
FFN activation) converted by ``convert_hf_to_gguf.py`` of llama.cpp — not by us — to f16. Most use
the bundled tiny-falcon byte-level BPE tokenizer; Gemma 2 and Phi-3 a SentencePiece one trained
here (``SPM_FAMILIES``). ``tests/runtime/test_reference_ggufs.py`` runs aios-run and
``aios-contract check`` on them and rebuilds the same HF models to compare.

llama.cpp's converter ships in the llama-cpp-python sdist; it is never copied into this
repository. Get it with

    pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d /tmp/lc && tar xzf /tmp/lc/*.tar.gz -C /tmp/lc

then run ``python tests/runtime/data/build_reference_ggufs.py /tmp/lc/llama_cpp_python-0.3.36/vendor/llama.cpp``
(followed by family names, e.g. ``gemma2 phi3``, to rebuild only those).

Two changes to how it runs, both in the vocabulary step only: its pre-tokenizer check accepts only
tokenizers whose hash it knows, so ``get_vocab_base_pre`` answers "gpt-2" (what the tokenizer
is); and its SentencePiece attempt raises FileNotFoundError (as with ``sentencepiece`` installed
and no ``tokenizer.model``), so the byte-level BPE path is taken. Gemma 2 and Phi-3 run unpatched.

Gemma 2's and Phi-3's converters take the vocabulary from a SentencePiece ``tokenizer.model``
only. Ours is trained offline in a fraction of a second by sentencepiece's own trainer (BPE with
byte fallback, as Gemma's and Llama 2's/Phi-3's are; one thread, so the same bytes every time) on
the text of ``pydoc_data.topics``, with each family's special tokens; transformers'
``GemmaTokenizer`` / ``LlamaTokenizer`` built from its pieces and merges give the
``tokenizer.json`` next to it (what transformers and our exporter read). Building these two
sources (here and in the test) needs the ``sentencepiece`` package (the test extra has it);
reading the GGUFs does not (the vocabulary is stored in them). One change to the HF folder, not to
the converter: transformers 5 writes no ``added_tokens_decoder`` in ``tokenizer_config.json``,
where the released Gemma 2 / Phi-3 repos have it and where llama.cpp's Gemma 2 converter finds
which tokens are special, so ``spm_tokenizer`` adds it back.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

HERE = Path(__file__).resolve().parent / "reference"
# name -> (tests.conftest TINY_CONFIGS kind, overrides)
# Each family keeps its own FFN activation: a llama.cpp file records none (llama.cpp runs SiLU
# for llama/qwen, GELU for falcon whatever config.json said), so a ReLU model converted by it
# would run as SiLU in llama.cpp and in aios-run alike.
MODELS = {
    "llama3": ("llama", {"llama3": True}),
    # llama.cpp's converter writes no sliding window for Mistral (llama.cpp attends in full):
    # Mistral's own 4096-token window, longer than any test prompt
    "mistral": ("mistral", {"sliding_window": 4096}),
    "qwen2": ("qwen2", {}),
    "qwen3": ("qwen3", {}),
    "gemma3": ("gemma3", {}),
    # transformers writes num_kv_heads = heads for a multi-query Falcon; llama.cpp's converter
    # reads that key, Falcon-7B's own config has 1 there. Its converter also writes
    # feed_forward_length = 4·d whatever the config says, as Falcon-7B/40B have.
    "falcon": ("falcon", {"num_kv_heads": 1, "ffn_hidden_size": 256}),
    # tests.conftest's Gemma 2: two layers, the first attending through an 8-token window (shorter
    # than the test prompts), the second globally; attention and final logits soft-capped;
    # head_dim 32 != hidden/heads 16. query_pre_attn_scalar = head_dim, as in Gemma 2 2B/9B:
    # llama.cpp's converter does not write it and llama.cpp scales q·k by 1/sqrt(head_dim) for every
    # size but 27B (recognised by its 46 layers: 1/sqrt(hidden/heads)), so another value would be
    # a model llama.cpp runs differently from transformers. Vocabulary 1024 = the SentencePiece one.
    "gemma2": ("gemma2", {"vocab_size": 1024}),
    # Phi-3: fused qkv and gate_up projections; no sliding window (the converter writes 0, as for
    # Phi-4). SentencePiece vocabulary of 1000 + 5 chat tokens, padded to 1024 (Phi-3-mini: 32011
    # in 32064). Its BOS/EOS/PAD as Phi-3-mini's: <s>, <|endoftext|>, <|endoftext|>.
    "phi3": ("phi3", {"vocab_size": 1024, "bos_token_id": 1, "eos_token_id": 1000, "pad_token_id": 1000}),
}
# Families whose converter reads only a SentencePiece tokenizer.model -> its style (spm_tokenizer)
SPM_FAMILIES = {"gemma2": "gemma", "phi3": "phi3"}
# Special tokens, in id order. Gemma's SentencePiece model itself holds <pad> <eos> <bos> <unk> at
# 0-3, <mask> and the chat tokens among its pieces (Gemma 2: ids 4, 106, 107); Llama 2's (Phi-3's)
# holds <unk> <s> </s> at 0-2, and Phi-3 adds its chat tokens after the 32000 pieces.
GEMMA_CHAT = ["<start_of_turn>", "<end_of_turn>"]
PHI3_ADDED = ["<|endoftext|>", "<|assistant|>", "<|system|>", "<|end|>", "<|user|>"]
SPM_VOCAB = {"gemma": 1024, "phi3": 1000}
# argv: "bpe" (patch the vocabulary step, see above) or "spm" (run as is), the script, its arguments
RUNNER = r"""
import runpy, sys
from pathlib import Path
patch, script = sys.argv[1], sys.argv[2]
sys.path.insert(0, str(Path(script).parent))
sys.path.insert(1, str(Path(script).parent / "gguf-py"))
sys.argv = sys.argv[2:]
if patch == "bpe":
    import conversion.base as base
    base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
    def no_spm(self):
        raise FileNotFoundError("tokenizer.model")
    base.TextModel._set_vocab_sentencepiece = no_spm
runpy.run_path(script, run_name="__main__")
"""


def spm_tokenizer(style: str, folder: Path) -> None:
    """Train a SentencePiece BPE model of ``style`` ("gemma" | "phi3") into ``folder/tokenizer.model``
    and save the transformers tokenizer made from it next to it (same bytes every time)."""
    import io

    import sentencepiece as spm
    from pydoc_data.topics import topics
    from tokenizers import AddedToken, normalizers
    from transformers import GemmaTokenizer, LlamaTokenizer
    from transformers.tokenization_utils_base import generate_merges

    lines = [line for key in sorted(topics) for line in topics[key].splitlines() if line.strip()]
    model = io.BytesIO()
    # as Gemma's and Llama 2's models: BPE, byte fallback, digits split, no normalization
    options = dict(model_type="bpe", vocab_size=SPM_VOCAB[style], byte_fallback=True, split_digits=True,
                   character_coverage=1.0, normalization_rule_name="identity", remove_extra_whitespaces=False,
                   allow_whitespace_only_pieces=True, max_sentence_length=1 << 16, num_threads=1,
                   minloglevel=2)
    if style == "gemma":  # no dummy prefix (llama.cpp writes add_space_prefix = False for Gemma)
        options.update(pad_id=0, eos_id=1, bos_id=2, unk_id=3, pad_piece="<pad>", eos_piece="<eos>",
                       bos_piece="<bos>", unk_piece="<unk>", add_dummy_prefix=False,
                       user_defined_symbols=["<mask>", *GEMMA_CHAT])
    else:  # Llama 2's layout: <unk> <s> </s>, a dummy prefix space, no <pad>
        options.update(unk_id=0, bos_id=1, eos_id=2, pad_id=-1, add_dummy_prefix=True)
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=model, **options)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.model").write_bytes(model.getvalue())
    # its pieces in id order and the merges they imply, as transformers' own conversion of a
    # tokenizer.model reads them (that one also needs protobuf)
    sp = spm.SentencePieceProcessor(model_proto=model.getvalue())
    vocab = {sp.IdToPiece(i): i for i in range(sp.GetPieceSize())}
    merges = generate_merges(vocab)
    if style == "gemma":
        tok = GemmaTokenizer(vocab=vocab, merges=merges, add_bos_token=True)
        tok.add_special_tokens({"additional_special_tokens": GEMMA_CHAT})  # special, as in Gemma 2's
    else:
        tok = LlamaTokenizer(vocab=vocab, merges=merges, add_bos_token=True)
        # Phi-3's chat tokens after the SentencePiece pieces; as its tokenizer_config they and </s>
        # eat the whitespace after them, <|endoftext|> not (aios.models.gguf_tokenizer restores
        # this from a GGUF, as llama.cpp does)
        tok.add_special_tokens({"additional_special_tokens": [
            AddedToken(t, rstrip=t != PHI3_ADDED[0], normalized=False, special=True) for t in PHI3_ADDED]})
        tok.add_special_tokens({"eos_token": PHI3_ADDED[0], "pad_token": PHI3_ADDED[0],
                                "additional_special_tokens": [AddedToken("</s>", rstrip=True, normalized=False,
                                                                         special=True)]},
                               replace_extra_special_tokens=False)
        # Phi-3's tokenizer.json (Llama 2's legacy one): the prefix space from a normalizer, no pre-tokenizer
        tok.backend_tokenizer.normalizer = normalizers.Sequence(
            [normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
        tok.backend_tokenizer.pre_tokenizer = None
    tok.save_pretrained(str(folder))
    # The released repos' tokenizer_config.json (written by transformers 4) lists the added tokens
    # under added_tokens_decoder, and llama.cpp's Gemma 2 converter types the special ones CONTROL
    # from there only (a user-defined SentencePiece piece reads as NORMAL). transformers 5 no longer
    # writes the key: add it as those files have it.
    config = json.loads((folder / "tokenizer_config.json").read_text())
    added = json.loads((folder / "tokenizer.json").read_text())["added_tokens"]
    config["added_tokens_decoder"] = {str(t.pop("id")): t for t in added}
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2))


def build_source(name: str, folder: Path) -> Path:
    """The HF folder of reference ``name`` (same bytes every time: seeded)."""
    from aios.models.aliases import FIXTURES_DIR
    from tests.conftest import LLAMA3_ROPE, build_hf_model

    kind, over = MODELS[name]
    over = dict(over)
    if over.pop("llama3", False):
        over.update(LLAMA3_ROPE)
    src = build_hf_model(kind, folder, **{"vocab_size": 2048, **over})
    if name in SPM_FAMILIES:
        spm_tokenizer(SPM_FAMILIES[name], src)
        return src
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(FIXTURES_DIR / "tiny-falcon" / f, src / f)
    return src


def main() -> None:
    llama_cpp = Path(sys.argv[1])
    script = llama_cpp / "convert_hf_to_gguf.py"
    HERE.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name in sys.argv[2:] or MODELS:  # optionally only the families named after the folder
            src = build_source(name, Path(tmp) / name)
            out = HERE / f"{name}.llamacpp.f16.gguf"
            patch = "spm" if name in SPM_FAMILIES else "bpe"
            subprocess.run([sys.executable, "-c", RUNNER, patch, str(script), str(src), "--outfile", str(out),
                            "--outtype", "f16"], check=True, capture_output=True)
            print(out.name, out.stat().st_size)


if __name__ == "__main__":
    main()
