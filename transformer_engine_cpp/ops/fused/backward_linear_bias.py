"""The BackwardLinearBias fusion: dgrad, wgrad and dbias of [BasicLinear, Bias] in one op."""

from __future__ import annotations

from ..basic import BasicLinear, Bias
from ..op import FusedOperation
from ._linear import dbias_fuses
from ._window import fuse_windows


class BackwardLinearBias(FusedOperation):
    """Backward-only fusion of BasicLinear and the Bias after it.

    ``[BasicLinear, Bias]`` (``Linear(bias=True)`` and the other bias after a linear that no
    activation claims): dgrad, wgrad and dbias in one op call (``torch.ops.te_cpp.linear_bwd``),
    where the unfused ops make three. TransformerEngine fuses the bias gradient into its wgrad
    GEMM's epilogue for the same reason. Not applied under a quantization recipe (the bias' dx
    is then handed to the linear quantized), nor where dbias cannot come from the linear's dy
    (``dbias_fuses``: a bias dtype that promotes the linear's output).
    """

    def __init__(self, *, linear: BasicLinear, bias: Bias) -> None:
        super().__init__((linear, bias))

    def fuser_backward(self, basic_op_ctxs, grad_output, *, basic_op_grad_extra_outputs):
        linear, bias = self._ops
        linear_ctx, bias_ctx = basic_op_ctxs
        if not linear_ctx.requires_grad:
            # the backward stops at the bias (bias-only training): the linear is not reached
            dx, bias_grads = bias.op_backward(bias_ctx, grad_output)
            return dx, [(None,), bias_grads], [(), ()]
        # the Bias' dx is dy itself (the plan checked that dy has the linear's compute dtype,
        # and no recipe hands it over quantized); dbias only for a trained bias
        bias_dtype = bias.bias_dtype if bias.bias_grad_required(bias_ctx) else None
        dx, dw, db = linear.backward_grads_and_dbias(linear_ctx, grad_output, bias_dtype)
        return dx, [(dw,), (db,)], [(), ()]


def extend_backward_linear_bias(ops: list, *, recipe=None) -> list:
    """Replace each ``[BasicLinear, Bias]`` window (exact classes) whose dbias can come from the
    linear's dy (``dbias_fuses``) with BackwardLinearBias (an extension: applied after the
    registered fusions and the activation-bias extension, so those keep their ops)."""
    if recipe is not None:
        return ops

    def match(ops, i):
        if (i + 1 < len(ops) and type(ops[i]) is BasicLinear and type(ops[i + 1]) is Bias
                and dbias_fuses(ops[i], ops[i + 1])):
            return BackwardLinearBias(linear=ops[i], bias=ops[i + 1]), 2
        return None

    return fuse_windows(ops, match)
