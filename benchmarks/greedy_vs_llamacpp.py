"""Benchmark: aios-run's greedy text against llama.cpp's on the same GGUF, over fixed prompts.

Each of ten short prompts (prose, code, facts) is continued by 16 greedy tokens in aios-run (the
given arithmetic) and in llama.cpp (a child process, aios.reference.llamacpp). Reported per
prompt: equal or not, the first differing position and the margin there (our logit of our
token minus our logit of llama.cpp's, as a fraction of the largest logit: a near-tie when
small). Default file: the real Gemma 3 270M Q4_K_M.

    python benchmarks/greedy_vs_llamacpp.py [--model real|FILE.gguf] [--arithmetic int8|float] [-n 16]
        [--default-buffers] [--kv f32|f16]

llama.cpp runs on its plain CPU buffers and with a float32 KV cache by default here, the
configuration whose kernels aios-run's int8 path mirrors (``--default-buffers``, ``--kv f16``
for its defaults).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Water boils at a temperature of",
           "Once upon a time, in a small village,", "The three primary colors are", "import numpy as np\n",
           "In 1969, the first humans", "The quick brown fox", "Photosynthesis is the process by which",
           "To make a cup of tea, first"]


def main() -> None:
    import numpy as np

    from aios.reference import llamacpp
    from runtime.generate import generate, load_tokenizer
    from runtime.model import Model

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="real")
    ap.add_argument("--arithmetic", choices=("int8", "float", "llamacpp"), default="int8")
    ap.add_argument("-n", type=int, default=16)
    ap.add_argument("--default-buffers", action="store_true",
                    help="llama.cpp on its default buffers (they repack Q4_0/Q4_K/Q8_0 and sum those otherwise)")
    ap.add_argument("--kv", choices=("f32", "f16"), default="f32",
                    help="llama.cpp's KV cache type: f32 (what aios-run keeps and rounds as) or f16 (its default)")
    ap.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = ap.parse_args()
    if args.model == "real":
        from aios.models import real

        path = real.fetch(real.GEMMA3_270M_Q4_K_M)
    else:
        path = Path(args.model)
    tok = load_tokenizer(path)
    rows = []
    for text in PROMPTS:
        ids = tok(text)["input_ids"]
        ours, _ = generate(Model(path, n_ctx=64, arithmetic=args.arithmetic), ids, args.n)
        kv = 0 if args.kv == "f32" else 1  # ggml type ids: GGML_TYPE_F32, GGML_TYPE_F16
        theirs = llamacpp.greedy(path, ids, args.n, n_ctx=64, n_batch=64, n_threads=2, type_k=kv, type_v=kv,
                                 plain_only=not args.default_buffers).value
        row = {"prompt": text, "equal": ours == theirs, "ours": tok.decode(ours)}
        if ours != theirs:
            k = next(i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b)
            logits = Model(path, n_ctx=64, arithmetic=args.arithmetic).forward(ids + ours[:k], all_logits=True)[-1]
            row.update(first_difference=k, theirs=tok.decode(theirs),
                       margin=float((logits[ours[k]] - logits[theirs[k]]) / np.abs(logits).max()))
        rows.append(row)
        extra = "" if row["equal"] else f"  (from token {row['first_difference']}, margin {row['margin']:.4f})"
        print(f"{'equal ' if row['equal'] else 'DIFFER'} {text!r}{extra}", flush=True)
    same = sum(r["equal"] for r in rows)
    print(f"{path.name}, {args.arithmetic} arithmetic: {same} of {len(rows)} greedy texts equal llama.cpp's "
          f"({args.n} tokens each; its KV cache {args.kv})")
    if args.json:
        args.json.write_text(json.dumps({"file": path.name, "arithmetic": args.arithmetic, "kv_cache": args.kv,
                                         "default_buffers": args.default_buffers, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
