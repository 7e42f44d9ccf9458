"""ForwardBiasActivation: the forward of Bias followed by a unary activation in one pass.

Pattern: ``[Bias, act]``, exact classes, ``act`` an activation whose class sets
``fuses_bias_act`` (the table below). One C++ kernel (``torch.ops.te_cpp.bias_act_fwd``) reads
x and writes y = act(x + b): the pre-activation z = x + b is never stored. The activation's
context keeps (x, bias) instead of z; its backward, fused (BackwardActivationBias, which passes
the bias to ``dbias_d<act>``) or not, recomputes z on the fly, rounded to the dtype exactly as
the unfused Bias op stores it, so results equal the unfused path's. No counterpart in
TransformerEngine.

An extension (ops/fused/__init__.py), applied after the linear forward fusions, so
``[BasicLinear, Bias, act]`` still becomes a ForwardLinearBiasActivation. Not applied under a
quantization recipe (as the linear forward fusions), nor for an activation with
``cache_quantized_input=True``.
"""

from __future__ import annotations

import torch

from .. import _quantized
from ..basic import ACTIVATIONS, Bias
from ..op import FusedOperation
from ._window import fuse_windows

# Activation class -> name understood by bias_act_fwd, from the activation classes' attributes.
BIAS_ACT_ACTIVATIONS = {cls: cls.op_stem for cls in ACTIVATIONS if cls.fuses_bias_act}


class ForwardBiasActivation(FusedOperation):
    """Forward-only fusion of ``Bias`` and the unary activation after it."""

    def __init__(self, *, bias: Bias, activation) -> None:
        if type(activation) not in BIAS_ACT_ACTIVATIONS:
            raise ValueError(
                "ForwardBiasActivation: the activation must be one of "
                f"{sorted(c.__name__ for c in BIAS_ACT_ACTIVATIONS)}, got "
                f"{type(activation).__name__}"
            )
        super().__init__((bias, activation))
        self._activation = BIAS_ACT_ACTIVATIONS[type(activation)]

    def fuser_forward(self, basic_op_ctxs, input_, *, basic_op_extra_inputs,
                      prev_op_grad_output_quantizer=None, next_op_input_quantizer=None,
                      basic_op_kwargs):
        bias_op, act_op = self._ops
        bias_ctx, act_ctx = basic_op_ctxs
        # x and the bias as the Bias' forward adds them (promoted by the kernel outside
        # autocast), its context filled as that forward fills it
        x, b = bias_op.fused_forward_operands(bias_ctx, input_, prev_op_grad_output_quantizer)
        y = torch.ops.te_cpp.bias_act_fwd.default(x, b, self._activation)
        # the activation's context: its input is z = x + b (never stored); it keeps x and b
        act_op.save_bias_input(act_ctx, x, b, torch.promote_types(x.dtype, b.dtype))
        return _quantized.emit(y, next_op_input_quantizer), [(), ()]


def extend_forward_bias_activation(ops: list, *, recipe=None) -> list:
    """Replace each ``[Bias, act]`` window (act in the table above) with the fused op (an
    extension, applied after the registered fusions and the linear extensions)."""
    if recipe is not None:  # as the linear forward fusions: quantized pipelines run unfused
        return ops

    def match(ops, i):
        if (i + 1 < len(ops) and type(ops[i]) is Bias
                and type(ops[i + 1]) in BIAS_ACT_ACTIVATIONS
                and not ops[i + 1].cache_quantized_input):
            return ForwardBiasActivation(bias=ops[i], activation=ops[i + 1]), 2
        return None

    return fuse_windows(ops, match)
