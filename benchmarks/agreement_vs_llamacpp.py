"""Benchmark: top-1 agreement of aios-run's int8 logits with llama.cpp's on the same GGUF, over
held-out text (issue 39's measure: ≥ 0.99 over ≥ 2048 positions on the real Gemma 3 270M).

The held-out split (``runtime.perplexity.heldout_ids``: pydoc topics never trained on) is cut
into ``--windows`` windows of ``--window`` tokens; each side scores every position of each
window from a fresh context (llama.cpp with ``logits_all`` and n_batch = the window, so its
batch kernels run: on its plain CPU buffers by default, ``--default-buffers`` for its default
ones, which repack Q4_0/Q4_K/Q8_0 and sum those otherwise). Reported: top-1 agreement, the
same with near-ties counted (llama.cpp's own logit of our pick within 0.5 % of its largest
|logit| of its top-1), positions whose logits are bit-identical, and where the first
difference of each window lies. Name the CPU beside any figure: the kernels' float order
follows its features.

    python benchmarks/agreement_vs_llamacpp.py [--model real|FILE.gguf] [--windows 16] [--window 128]
        [--arithmetic int8] [--default-buffers] [--kv f32|f16] [--json OUT]
        [--candidate llamacpp --candidate-kv f16 --candidate-default-buffers]

``--candidate llamacpp`` scores llama.cpp itself in another configuration in our place (its
KV type and buffers from the ``--candidate-*`` options): how far its own configurations agree,
the scale against which a top-1 figure reads.

llama.cpp's KV cache is float32 by default here (``--kv``), as aios-run keeps it; llama.cpp's own
default, f16, rounds every key and value to fp16 first.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

TIE = 0.005  # as tests/runtime/test_llamacpp_presets.py


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="real")
    ap.add_argument("--windows", type=int, default=16)
    ap.add_argument("--window", type=int, default=128)
    ap.add_argument("--arithmetic", choices=("int8", "float", "int16", "llamacpp"), default="int8")
    ap.add_argument("--default-buffers", action="store_true", help="llama.cpp on its default (repacking) buffers")
    ap.add_argument("--kv", choices=("f32", "f16"), default="f32",
                    help="llama.cpp's KV cache type: f32 (what aios-run keeps and rounds as) or f16 (its default)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--candidate", choices=("aios", "llamacpp"), default="aios",
                    help="who is scored against the reference: aios-run, or llama.cpp in another configuration")
    ap.add_argument("--candidate-kv", choices=("f32", "f16"), default="f16")
    ap.add_argument("--candidate-default-buffers", action="store_true")
    args = ap.parse_args()

    import numpy as np

    from aios.reference import llamacpp
    from runtime import kernels
    from runtime.generate import load_tokenizer
    from runtime.model import Model
    from runtime.perplexity import heldout_ids

    if args.model == "real":
        from aios.models import real

        path = real.fetch(real.GEMMA3_270M_Q4_K_M)
    else:
        path = Path(args.model)
    kernels.set_threads(args.threads)
    tok = load_tokenizer(path)
    n = args.windows * args.window
    ids = heldout_ids(tok, n)[:n]
    kv = 0 if args.kv == "f32" else 1  # ggml type ids: GGML_TYPE_F32, GGML_TYPE_F16
    res = llamacpp.logits(path, ids, window=args.window, plain_only=not args.default_buffers, n_ctx=args.window,
                          n_batch=args.window, n_threads=args.threads, type_k=kv, type_v=kv)
    theirs = res.value
    if args.candidate == "llamacpp":
        ckv = 0 if args.candidate_kv == "f32" else 1
        cand = llamacpp.logits(path, ids, window=args.window, plain_only=not args.candidate_default_buffers,
                               n_ctx=args.window, n_batch=args.window, n_threads=args.threads, type_k=ckv, type_v=ckv)
        ours, label = cand.value, f"llama.cpp itself ({cand.config}, KV cache {args.candidate_kv})"
    else:
        m = Model(path, n_ctx=args.window, arithmetic=args.arithmetic)
        ours = []
        for w0 in range(0, len(ids), args.window):
            m.reset()
            ours.append(m.forward(ids[w0:w0 + args.window], all_logits=True))
        ours, label = np.concatenate(ours), kernels.arithmetic_label(m.arith)
    pick, best = ours.argmax(1), theirs.argmax(1)
    rows = np.arange(len(ids))
    tie = theirs[rows, best] - theirs[rows, pick] <= TIE * np.abs(theirs).max(1)
    same_rows = (ours == theirs).all(1)
    first = []
    for w0 in range(0, len(ids), args.window):
        d = np.flatnonzero(~same_rows[w0:w0 + args.window])
        first.append(int(d[0]) if len(d) else args.window)
    out = {"file": path.name, "positions": len(ids), "window": args.window, "candidate": label,
           "llama_cpp_config": res.config, "kv_cache": args.kv, "top1": round(float((pick == best).mean()), 4),
           "top1_ties_counted": round(float(((pick == best) | tie).mean()), 4),
           "bit_identical_positions": round(float(same_rows.mean()), 4), "first_difference_per_window": first}
    print(json.dumps(out), flush=True)
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
