"""The relufy converter's parts; its entry point is ``convert/relufy.py`` (read its docstring).

- ``config``: what determines a run (config, activations, file names; torch-free);
- ``run``: the run itself — validation, loading, the work folder, training loop, output;
- ``cli``: the progress bar and result table of ``aios-convert relufy``.
"""
