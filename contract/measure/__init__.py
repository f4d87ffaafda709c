"""Transitional: the shared measurements moved to :mod:`aios.measure`."""
