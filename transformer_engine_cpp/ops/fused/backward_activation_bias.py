"""BackwardActivationBias: the backward of Bias followed by a unary activation in one pass.

Pattern (forward order): ``[Bias, act]``, exact classes, ``act`` an activation whose class sets
``fuses_dbias_dact`` (the table below). One C++ kernel (``torch.ops.te_cpp.dbias_d<act>``)
computes dx = dy * act'(x) and dbias = sum of dx over the leading dims. After
ForwardBiasActivation the activation's context holds the bias' input and the bias instead of x;
the kernel then recomputes x = input + bias on the fly. Unlike TransformerEngine's, it needs no
quantization recipe; under a recipe with a ``backward_override`` it is not applied.
"""

from __future__ import annotations

import torch

from ..basic import ACTIVATIONS, Bias
from ..op import FusedOperation
from ._window import fuse_windows

# Activation class -> fused dbias+dact custom op name, from the activation classes' attributes.
_DBIAS_DACT_OPS = {cls: f"dbias_d{cls.op_stem}" for cls in ACTIVATIONS if cls.fuses_dbias_dact}


class BackwardActivationBias(FusedOperation):
    """Backward-only fusion of ``Bias`` and the activation after it."""

    def __init__(self, *, bias: Bias, activation) -> None:
        if type(activation) not in _DBIAS_DACT_OPS:
            raise ValueError(
                "BackwardActivationBias: the activation must be one of "
                f"{sorted(c.__name__ for c in _DBIAS_DACT_OPS)}, got {type(activation).__name__}"
            )
        super().__init__((bias, activation))
        self._dbias_dact = getattr(torch.ops.te_cpp, _DBIAS_DACT_OPS[type(activation)]).default

    def fuser_backward(self, basic_op_ctxs, grad_output, *, basic_op_grad_extra_outputs):
        bias_op, act_op = self._ops
        bias_ctx, act_ctx = basic_op_ctxs
        # x is z, or (after ForwardBiasActivation) the bias' input, z = x + bias recomputed
        x, bias = act_op.saved_operands(act_ctx)
        dx, db = self._dbias_dact(grad_output, x, bias_op.bias_dtype, bias)
        if not bias_op.bias_grad_required(bias_ctx):  # a frozen bias: dbias is dropped
            db = None
        # dx as the Bias' own backward hands it on (dtype, the previous op's quantizer)
        return bias_op.input_grad(bias_ctx, dx), [(db,), ()], [(), ()]


def _fuse(ops: list) -> list:
    def match(ops, i):
        if i + 1 < len(ops) and type(ops[i]) is Bias and type(ops[i + 1]) in _DBIAS_DACT_OPS:
            return BackwardActivationBias(bias=ops[i], activation=ops[i + 1]), 2
        return None

    return fuse_windows(ops, match)


def fuse_backward_activation_bias(ops: list, *, recipe=None) -> list:
    """Replace each ``[Bias, act]`` window (act in the table above) with the fused op, where
    TransformerEngine does: under a quantization recipe without ``backward_override``."""
    if recipe is None or getattr(recipe, "backward_override", None) is not None:
        return ops
    return _fuse(ops)


def extend_backward_activation_bias(ops: list, *, recipe=None) -> list:
    """The same fusion without a recipe (no TransformerEngine counterpart): an extension,
    applied after the registered fusions."""
    if recipe is not None:
        return ops
    return _fuse(ops)
