"""A minimal decode run for hardware-counter tools (cachegrind, perf): no tokenizer, no transformers.

    python -m runtime.trace [--arithmetic int8|float] MODEL.gguf MODE N_NEW [PROMPT_TOKENS [PREDICTOR.npz]]

Prefills token ids 1..PROMPT_TOKENS and decodes N_NEW tokens greedily. Tools run it at two
values of N_NEW and take the slope, so start-up, load and prefill cancel. ``--arithmetic``
picks the block kernels' arithmetic (``Model(..., arithmetic=...)``; default int8), as
``aios-run generate/bench --arithmetic`` does.
"""

from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    """Parse ``argv`` and run; a bad argument or file is one sentence on stderr and the
    documented exit code (argparse's 2 for usage, ``AiosError.exit_code`` otherwise)."""
    import argparse

    from aios.errors import AiosError
    from runtime.kernels import ARITHMETICS
    from runtime.modes import MODES

    ap = argparse.ArgumentParser(prog="python -m runtime.trace", description=__doc__.splitlines()[0])
    ap.add_argument("--arithmetic", choices=ARITHMETICS, default=None)
    ap.add_argument("model")
    ap.add_argument("mode", choices=MODES)
    ap.add_argument("n_new", type=int)
    ap.add_argument("prompt_tokens", type=int, nargs="?", default=16)
    ap.add_argument("predictor", nargs="?", default=None)
    args = ap.parse_args(argv)
    try:
        from runtime.generate import generate
        from runtime.model import Model

        model = Model(args.model, mode=args.mode, predictor=args.predictor, arithmetic=args.arithmetic)
        model.counter.enabled = False
        generate(model, list(range(1, args.prompt_tokens + 1)), args.n_new)
    except AiosError as e:
        print(f"error: {e}", file=sys.stderr)
        return int(e.exit_code)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
