"""Converters: relufy, sparsity maps, aliasing, low-rank + residual, GGUF export, layout."""
