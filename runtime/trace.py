"""A minimal decode run for hardware-counter tools (cachegrind, perf): no tokenizer, no transformers.

    python -m runtime.trace [--arithmetic int8|float] MODEL.gguf MODE N_NEW [PROMPT_TOKENS [PREDICTOR.npz]]

Prefills token ids 1..PROMPT_TOKENS and decodes N_NEW tokens greedily. Tools run it at two
values of N_NEW and take the slope, so start-up, load and prefill cancel. ``--arithmetic``
picks the block kernels' arithmetic (runtime.kernels.set_arithmetic; default: the process
default, int8), as ``aios-run generate/bench --arithmetic`` does.
"""

from __future__ import annotations

import sys


def main(argv: list[str]) -> None:
    from runtime.generate import generate
    from runtime.kernels import set_arithmetic
    from runtime.model import Model

    argv = list(argv)
    if argv and argv[0].startswith("--arithmetic"):
        if "=" in argv[0]:
            set_arithmetic(argv.pop(0).split("=", 1)[1])
        else:
            argv.pop(0)
            set_arithmetic(argv.pop(0))
    path, mode, n = argv[0], argv[1], int(argv[2])
    prompt = int(argv[3]) if len(argv) > 3 else 16
    predictor = argv[4] if len(argv) > 4 else None
    model = Model(path, mode=mode, predictor=predictor)
    model.counter.enabled = False
    generate(model, list(range(1, prompt + 1)), n)


if __name__ == "__main__":
    main(sys.argv[1:])
