"""The svd-residual converter's parts; its entry point is ``convert/svd_residual.py`` (the
file format and the math are in its docstring).

- ``config``: options and their validation (torch-free);
- ``factorize``: storage types and layouts of U, V and the residual, whitening, rank choice,
  and the factorization of one matrix (``compress``);
- ``calibrate``: XᵀX of each factorized matrix's input on calibration texts;
- ``write``: the GGUF, its ``aios.lowrank.*`` keys, and the result;
- ``cli``: rendering and the report file.
"""
