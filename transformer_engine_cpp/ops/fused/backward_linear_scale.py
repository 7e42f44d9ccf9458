"""The BackwardLinearScale fusion: a ConstantScale after a BasicLinear as its GEMMs' alpha."""

from __future__ import annotations

from ..basic import BasicLinear, ConstantScale
from ..op import FusedOperation
from ._linear import backward_linear_ok
from ._window import fuse_windows


class BackwardLinearScale(FusedOperation):
    """Backward-only fusion of BasicLinear and the ConstantScale after it.

    ``[BasicLinear, ConstantScale]``: dx = s * dy W and dW = s * dy^T x with the scale as the
    GEMMs' alpha, instead of a separate scaling pass.
    """

    accepts_quantized_grad_output = True  # the linear's GEMM operand

    def __init__(self, *, linear: BasicLinear, scale: ConstantScale) -> None:
        super().__init__((linear, scale))

    def fuser_backward(self, basic_op_ctxs, grad_output, *, basic_op_grad_extra_outputs):
        linear, scale = self._ops
        dx, grads = linear.backward_grads(basic_op_ctxs[0], grad_output, alpha=scale.scale)
        return dx, [grads, ()], [(), ()]


def fuse_backward_linear_scale(ops: list, *, recipe=None) -> list:
    def match(ops, i):
        if (i + 1 < len(ops) and backward_linear_ok(ops[i])
                and type(ops[i + 1]) is ConstantScale):
            return BackwardLinearScale(linear=ops[i], scale=ops[i + 1]), 2
        return None

    return fuse_windows(ops, match)
