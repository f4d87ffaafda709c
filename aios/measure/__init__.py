"""Measurements that run or read a model, shared by the checker, the converters and the runtime.

Layering: ``aios`` is the bottom layer. ``contract``, ``convert`` and ``runtime`` sit side by
side above it and their library modules do not import one another; a helper two of them need
(these measurements, the held-out token streams in ``aios.evaluation``) moves down into
``aios``. Only top-level applications — the ``*/cli.py`` commands and ``runtime.bench``, which
runs ``contract.check`` on the file it measures — may compose packages across the side.
"""
