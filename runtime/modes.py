"""The runtime's FFN execution modes (``aios-run --mode``), importable without numba.

dense    every weight row read
sparse   exact: rows of zero activations skipped (identical results to dense)
map      static sparsity map (``blk.N.ffn_active``): masked neurons skipped — lossy
predict  a low-rank activation predictor picks the rows to compute — lossy

``runtime/model.py`` documents each mode; CLIs build their choices from here so ``--help``
does not compile or load the kernels.
"""

MODES = ("dense", "sparse", "map", "predict")
LOSSY_MODES = ("map", "predict")
