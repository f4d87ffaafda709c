"""``aios-convert alias``: one canonical weight + per-layer deltas (R3).

- ``config``: the option vocabularies (torch-free; read by ``convert/cli.py``);
- ``posthoc``: post-hoc aliasing — analysis, groups, the aliased HF folder (``alias``);
- ``train``: trained aliasing (``--train``), reusing the analysis and the writer;
- ``export``: the aliased GGUF (for aios-run) and the de-aliased one (for llama.cpp);
- ``run``: the command as one library call (``run_alias``), choosing among the above;
- ``cli``: rendering.

This root imports nothing: ``posthoc``, ``train`` and ``export`` load torch, and the command's
options must build without it.
"""
