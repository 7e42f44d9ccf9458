"""Backward-only fusions around a BasicLinear.

* BackwardLinearAdd: ``[MakeExtraOutput, BasicLinear]``: the residual branch forks off the
  linear's input, so dx = d(extra) + dy W; the dgrad GEMM accumulates onto d(extra) as its C
  operand (``torch.ops.te_cpp.linear_dgrad_add``). The anchor needs ``in_place=True``; the
  functional add fuses the same way here.
* BackwardLinearScale: ``[BasicLinear, ConstantScale]``: dx = s * dy W and dW = s * dy^T x with
  the scale as the GEMMs' alpha, instead of a separate scaling pass.
"""

from __future__ import annotations

from ..basic import BasicLinear, ConstantScale, MakeExtraOutput
from ..op import FusedOperation
from ._window import fuse_windows


class BackwardLinearAdd(FusedOperation):
    """Backward-only fusion of MakeExtraOutput and the BasicLinear after it."""

    def __init__(self, *, backward_add: MakeExtraOutput, linear: BasicLinear) -> None:
        super().__init__((backward_add, linear))

    def fuser_backward(self, basic_op_ctxs, grad_output, *, basic_op_grad_extra_outputs):
        linear = self._ops[1]
        grad_extra = basic_op_grad_extra_outputs[0][0]
        dx, grads = linear.backward_grads(basic_op_ctxs[1], grad_output, grad_extra=grad_extra)
        return dx, [(), grads], [(), ()]


class BackwardLinearScale(FusedOperation):
    """Backward-only fusion of BasicLinear and the ConstantScale after it."""

    def __init__(self, *, linear: BasicLinear, scale: ConstantScale) -> None:
        super().__init__((linear, scale))

    def fuser_backward(self, basic_op_ctxs, grad_output, *, basic_op_grad_extra_outputs):
        linear, scale = self._ops
        dx, grads = linear.backward_grads(basic_op_ctxs[0], grad_output, alpha=scale.scale)
        return dx, [grads, ()], [(), ()]


def fuse_backward_linear_add(ops: list, *, recipe=None) -> list:
    def match(ops, i):
        if (i + 1 < len(ops) and type(ops[i]) is MakeExtraOutput
                and type(ops[i + 1]) is BasicLinear and ops[i + 1].tensor_parallel_mode != "column"):
            return BackwardLinearAdd(backward_add=ops[i], linear=ops[i + 1]), 2
        return None

    return fuse_windows(ops, match)


def fuse_backward_linear_scale(ops: list, *, recipe=None) -> list:
    def match(ops, i):
        if (i + 1 < len(ops) and type(ops[i]) is BasicLinear
                and ops[i].tensor_parallel_mode != "column" and type(ops[i + 1]) is ConstantScale):
            return BackwardLinearScale(linear=ops[i], scale=ops[i + 1]), 2
        return None

    return fuse_windows(ops, match)
