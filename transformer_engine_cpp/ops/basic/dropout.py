"""Dropout: in training, zero each element with probability p and scale the kept ones by
1 / (1 - p); in evaluation mode, the identity."""

from __future__ import annotations

import dataclasses

import torch

from ..op import BasicOperation, OperationContext


@dataclasses.dataclass
class DropoutContext(OperationContext):
    """What Dropout's backward reads besides the saved mask."""

    #: "mask" (training: dx = dy * mask / (1 - p)), "evaluation" or "identity" (dx = dy)
    impl: str = "identity"


class Dropout(BasicOperation):
    """Randomly zeroes elements during training.

    Training (``self.training`` and ``p > 0``): the op draws a fresh int64 ``seed`` from torch's
    random number generator for ``x``'s device (``te_cpp.random_seeds``, which draws as
    ``torch.randint`` does, so ``torch.manual_seed`` makes runs reproducible), then
    ``torch.ops.te_cpp.dropout_fwd(x, seed, p) -> (y, mask)`` computes the keep mask from
    ``(seed, element index)`` with a counter-based Philox draw and ``y = x * mask / (1 - p)``.
    The uint8 mask is saved; backward calls ``dropout_bwd(dy, mask, p)``. Evaluation mode and
    ``p == 0``: ``y`` is ``x`` and ``dx`` is ``dy``, in Python, without a custom op.

    Under ``torch.compile`` the seed draw is part of the traced graph (``dropout_fwd`` itself is
    deterministic given its seed), so every compiled call draws a new mask, from the same
    generator as eager: after the same ``torch.manual_seed``, compiled (aot_eager or inductor)
    and eager masks are the same bits.

    Args:
        p: dropout probability, in ``[0, 1)``.
    """

    accepts_forward_kwargs = False
    context_type = DropoutContext

    def __init__(self, p: float) -> None:
        super().__init__()
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p < 1.0:
            raise ValueError(f"Dropout: p must be a number in [0, 1), got {p!r}")
        self.dropout_probability = float(p)

    def op_forward(
        self,
        ctx: DropoutContext,
        input_: torch.Tensor,
        *,
        prev_op_grad_output_quantizer=None,
        next_op_input_quantizer=None,
        **kwargs,
    ) -> torch.Tensor:
        p = self.dropout_probability
        if not self.training or p == 0.0:
            ctx.impl = "evaluation" if not self.training else "identity"
            return input_
        ctx.impl = "mask"
        seed = torch.ops.te_cpp.random_seeds.default(input_, 1)
        y, mask = torch.ops.te_cpp.dropout_fwd.default(input_, seed, p)
        if ctx.requires_grad:
            ctx.save_for_backward(mask)
        return y

    def op_backward(self, ctx: DropoutContext, grad_output: torch.Tensor):
        if ctx.impl != "mask":
            return grad_output, ()
        (mask,) = ctx.saved_tensors
        return torch.ops.te_cpp.dropout_bwd.default(grad_output, mask, self.dropout_probability), ()

    def extra_repr(self) -> str:
        return f"p={self.dropout_probability}"
