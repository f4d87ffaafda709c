"""runtime.kernels is a package of one module per seam: every public name of its modules under
``kernels.X``, and the arithmetic a value the caller passes (``kernels.Arithmetic``)."""

from __future__ import annotations

import importlib
import pkgutil

import numpy as np
import pytest

from runtime import kernels as K
from runtime.kernels import dispatch

RNG = np.random.default_rng(3)


def test_every_public_name_of_the_modules_is_a_package_name():
    for info in pkgutil.iter_modules(K.__path__):
        module = importlib.import_module(f"{K.__name__}.{info.name}")
        for name, value in vars(module).items():
            if name in K.__all__:
                assert getattr(K, name) is value, (info.name, name)
    assert len(K.__all__) == len(set(K.__all__)) and all(hasattr(K, n) for n in K.__all__)


def test_an_arithmetic_is_a_value():
    """The arithmetic is passed, never set: an unknown name is one sentence (exit 2), the value's
    per-call forms leave it unchanged, and a shared input is quantized once for its matmuls."""
    from aios.errors import UsageError

    with pytest.raises(UsageError, match="Unknown arithmetic 'int4'"):
        K.Arithmetic("int4")
    a = K.Arithmetic("int16", batched=True)
    assert a.for_head().head and not a.head and a.for_head().name == "int16"
    X = RNG.standard_normal((2, 64)).astype(np.float32)
    s = a.sharing(X)
    made = []
    first = s.cached(X, "k", lambda: made.append(1) or object())
    assert s.cached(X, "k", lambda: made.append(1)) is first and made == [1]
    assert a.shared is None and s.cached(X.copy(), "k", lambda: "other") == "other"  # another input: not shared


def test_a_type_set_is_read_where_it_is_defined(monkeypatch):
    saved = dispatch.INT8_DEFAULT
    monkeypatch.setattr(dispatch, "INT8_DEFAULT", saved - {"q3_k"})
    assert K.arithmetic_label(K.Arithmetic("int8"), {"Q4_K", "Q3_K"}).endswith("; Q3_K float)")
