"""Measurements that run or read a model, shared by the checker, the converters and the runtime.

They live in ``aios`` (the bottom layer) so ``contract``, ``convert`` and ``runtime`` can all
use the one implementation without importing each other.
"""
