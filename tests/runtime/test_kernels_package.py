"""runtime.kernels is a package of one module per seam that answers as the single module it was:
every public name of its modules under ``kernels.X``, one object per piece of state, and an
assignment to ``kernels.X`` seen by the functions that read X in the submodules."""

from __future__ import annotations

import importlib
import pkgutil

import numpy as np

from runtime import kernels as K
from runtime.kernels import dispatch, threads


def test_every_public_name_of_the_modules_is_a_package_name():
    for info in pkgutil.iter_modules(K.__path__):
        module = importlib.import_module(f"{K.__name__}.{info.name}")
        for name, value in vars(module).items():
            if name in K.__all__:
                assert getattr(K, name) is value, (info.name, name)
    assert len(K.__all__) == len(set(K.__all__)) and all(hasattr(K, n) for n in K.__all__)


def test_the_state_is_one_object():
    assert K._THREADS is threads._THREADS and K._SHARED is dispatch._SHARED
    X = np.zeros((1, 32), np.float32)
    K.share_input(X)
    try:
        assert K._SHARED["x"] is X
    finally:
        K.share_input(None)


def test_an_assignment_reaches_the_functions_that_read_the_name(arithmetic, monkeypatch):
    arithmetic("int8")
    saved = K.INT8_DEFAULT
    monkeypatch.setattr(K, "INT8_DEFAULT", saved - {"q3_k"})
    assert dispatch.INT8_DEFAULT is K.INT8_DEFAULT
    assert K.arithmetic_label({"Q4_K", "Q3_K"}).endswith("; Q3_K float)")
    monkeypatch.setattr(K, "OMP_SET_HERE", ("X",))
    assert threads.OMP_SET_HERE == ("X",)
    monkeypatch.undo()
    assert dispatch.INT8_DEFAULT is saved and threads.OMP_SET_HERE is K.OMP_SET_HERE
