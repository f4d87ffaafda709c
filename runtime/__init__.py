"""numpy/numba engine for converted artifacts, with byte accounting (MB/token)."""
