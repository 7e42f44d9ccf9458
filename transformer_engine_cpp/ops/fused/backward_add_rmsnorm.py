"""BackwardAddRMSNorm: the backward of MakeExtraOutput(in_place=False) followed by RMSNorm.

Pattern (forward order): ``[MakeExtraOutput(in_place=False), RMSNorm]``. The residual branch
forks off the norm's input, so the input gradient is rmsnorm_dx(dy) + d(extra); one kernel
(``torch.ops.te_cpp.rmsnorm_bwd_add``) computes it with dgamma in a single pass instead of a
norm backward followed by an add. Any recipe.
"""

from __future__ import annotations

from ..basic import MakeExtraOutput, RMSNorm
from ..op import FusedOperation
from ._window import fuse_windows


class BackwardAddRMSNorm(FusedOperation):
    """Backward-only fusion of ``MakeExtraOutput`` and the ``RMSNorm`` after it."""

    def __init__(self, *, add: MakeExtraOutput, rmsnorm: RMSNorm) -> None:
        super().__init__((add, rmsnorm))

    def fuser_backward(self, basic_op_ctxs, grad_output, *, basic_op_grad_extra_outputs):
        _, norm = self._ops
        grad_extra = basic_op_grad_extra_outputs[0][0]
        dx, norm_grads = norm.backward_with_extra(basic_op_ctxs[1], grad_output, grad_extra)
        return dx, [(), norm_grads], [(), ()]


def fuse_backward_add_rmsnorm(ops: list, *, recipe=None) -> list:
    """Replace each ``[MakeExtraOutput(in_place=False), RMSNorm]`` window with the fused op."""
    def match(ops, i):
        if (i + 1 < len(ops) and type(ops[i]) is MakeExtraOutput and not ops[i].in_place
                and type(ops[i + 1]) is RMSNorm):
            return BackwardAddRMSNorm(add=ops[i], rmsnorm=ops[i + 1]), 2
        return None

    return fuse_windows(ops, match)
