"""The BackwardLinearAdd fusion: the dgrad GEMM accumulating onto the residual's gradient."""

from __future__ import annotations

from ..basic import BasicLinear, MakeExtraOutput
from ..op import FusedOperation
from ._linear import backward_linear_ok
from ._window import fuse_windows


class BackwardLinearAdd(FusedOperation):
    """Backward-only fusion of MakeExtraOutput and the BasicLinear after it.

    ``[MakeExtraOutput, BasicLinear]``: the residual branch forks off the linear's input, so
    dx = d(extra) + dy W; the dgrad GEMM accumulates onto d(extra) as its C operand
    (``torch.ops.te_cpp.linear_dgrad_add``). TransformerEngine needs ``in_place=True``; the
    functional add fuses the same way here.
    """

    accepts_quantized_grad_output = True  # the linear's GEMM operand

    def __init__(self, *, backward_add: MakeExtraOutput, linear: BasicLinear) -> None:
        super().__init__((backward_add, linear))

    def fuser_backward(self, basic_op_ctxs, grad_output, *, basic_op_grad_extra_outputs):
        linear = self._ops[1]
        grad_extra = basic_op_grad_extra_outputs[0][0]
        dx, grads = linear.backward_grads(basic_op_ctxs[1], grad_output, grad_extra=grad_extra)
        return dx, [(), grads], [(), ()]


def _fuse_linear_add(ops: list, in_place: bool) -> list:
    def match(ops, i):
        if (i + 1 < len(ops) and type(ops[i]) is MakeExtraOutput
                and ops[i].in_place == in_place
                and backward_linear_ok(ops[i + 1])):
            return BackwardLinearAdd(backward_add=ops[i], linear=ops[i + 1]), 2
        return None

    return fuse_windows(ops, match)


def fuse_backward_linear_add(ops: list, *, recipe=None) -> list:
    """``[MakeExtraOutput(in_place=True), BasicLinear]``, as TransformerEngine."""
    return _fuse_linear_add(ops, True)


def extend_backward_linear_add(ops: list, *, recipe=None) -> list:
    """The same with ``in_place=False`` (an extension, applied after the registered fusions)."""
    return _fuse_linear_add(ops, False)
