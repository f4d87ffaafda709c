"""A minimal decode run for hardware-counter tools (cachegrind, perf): no tokenizer, no transformers.

    python -m runtime.trace MODEL.gguf MODE N_NEW [PROMPT_TOKENS [PREDICTOR.npz]]

Prefills token ids 1..PROMPT_TOKENS and decodes N_NEW tokens greedily. Tools run it at two
values of N_NEW and take the slope, so start-up, load and prefill cancel.
"""

from __future__ import annotations

import sys


def main(argv: list[str]) -> None:
    from runtime.generate import generate
    from runtime.model import Model

    path, mode, n = argv[0], argv[1], int(argv[2])
    prompt = int(argv[3]) if len(argv) > 3 else 16
    predictor = argv[4] if len(argv) > 4 else None
    model = Model(path, mode=mode, predictor=predictor)
    model.counter.enabled = False
    generate(model, list(range(1, prompt + 1)), n)


if __name__ == "__main__":
    main(sys.argv[1:])
