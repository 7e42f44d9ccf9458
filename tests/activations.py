"""The activation table as the tests see it.

``transformer_engine_cpp.ops.basic.ACTIVATIONS`` split by kind and by fused kernel, and the
float64 reference of an activation op: ``testing/reference.py``'s function named by the class's
``op_stem``, called with the input(s) and then the op's own configuration arguments. Tests
iterate these instead of listing activations, so a new activation class is tested as soon as it
exists (tests/test_activation_table.py checks that it has its kernels and its reference).
"""

from __future__ import annotations

from transformer_engine_cpp.ops.basic import ACTIVATIONS
from transformer_engine_cpp.ops.basic.activation import _ScaledActivation
from transformer_engine_cpp.testing import reference as ref

#: the scaled activations (one extra input, the per-row scales)
SCALED = tuple(c for c in ACTIVATIONS if issubclass(c, _ScaledActivation))
#: the unary and the gated activations without scales
UNARY = tuple(c for c in ACTIVATIONS if c not in SCALED and not c.gated)
GATED = tuple(c for c in ACTIVATIONS if c not in SCALED and c.gated)
#: the activations each fused kernel takes (ForwardLinearBiasActivation's epilogue,
#: ForwardBiasActivation, BackwardActivationBias)
LINEAR_BIAS_ACT = tuple(c for c in ACTIVATIONS if c.fuses_linear_bias_act)
BIAS_ACT = tuple(c for c in ACTIVATIONS if c.fuses_bias_act)
DBIAS_DACT = tuple(c for c in ACTIVATIONS if c.fuses_dbias_dact)


def reference_function(cls):
    """The float64 reference of an activation class: ``reference.<op_stem>``."""
    return getattr(ref, cls.op_stem)


def op_params(op) -> tuple:
    """The configuration arguments an activation op passes to its kernels, without a gated
    op's trailing ``glu_interleave_size``."""
    args = op._op_args()
    return args[:-1] if type(op).gated else args


def reference(op):
    """The float64 reference of an activation op with its configuration: a function of ``x``
    (of ``x, scales`` for a scaled activation)."""
    fn = reference_function(type(op))
    params = op_params(op)
    if not type(op).gated:
        return lambda *inputs: fn(*inputs, *params)
    interleave = op._op_args()[-1] or None  # the ops' 0 means halves
    return lambda *inputs: fn(*inputs, *params, glu_interleave_size=interleave)
