"""The runtime's extension formats: the layer hooks ``runtime.model.Model`` runs, in order.

A hook ``hook(model, tensors_by_name, layer_index, layer_dict)`` runs after a layer's stored
tensors are loaded and may replace entries such as ``"ffn_up.weight"`` with an operator
implementing ``runtime.weights.Linear``; the forward pass only sees operators.

The order is part of the formats' meaning: the low-rank hook (``aios-convert svd-residual``)
first wraps every ``X.lr_u``/``X.lr_v`` pair as ``X.weight`` (and a neuron-major
``X.lr_u``/``X.lr_v.t`` [+ ``X.residual.t``] of ``--sparse-down`` as ``X.weight`` and ``X.T``);
the alias hook (``aios-convert alias``: canonical + delta) then drops the raw entries of alias
groups, including what the low-rank hook made of a low-rank delta, and puts a neuron-major
group's members (``.canonical.t``) under ``ffn_down.weight`` and ``ffn_down.T``; the fused
gate/up hook (Phi-3) then splits whatever operator holds ``ffn_up`` into row views; the
sparse-down hook turns a neuron-major ``ffn_down.t`` into the layer's down projection. An
operator under ``ffn_down.T`` has ``sparse_matvec(a, active)`` and ``sparse_reads(active)``
(``runtime.sparse_down``), which ``Model._ffn`` calls in the sparse modes.

This module sits below ``runtime.model``: hooks receive the model as an argument, so neither
they nor this list import it.
"""

from __future__ import annotations

from typing import Callable

from runtime.alias import alias_hook
from runtime.fused import fused_gate_up_hook
from runtime.lowrank import lowrank_hook
from runtime.sparse_down import sparse_down_hook

LayerHook = Callable[[object, dict, int, dict], None]

LAYER_HOOKS: list[LayerHook] = [lowrank_hook, alias_hook, fused_gate_up_hook, sparse_down_hook]
