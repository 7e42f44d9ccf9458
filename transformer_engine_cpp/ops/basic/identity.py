"""The Identity op (no custom op: y is x)."""

from __future__ import annotations

import torch

from ..op import BasicOperation, OperationContext


class Identity(BasicOperation):
    """y = x; dx = dy."""

    accepts_forward_kwargs = False
    accepts_quantized_input = True  # passed on as it is
    accepts_quantized_grad_output = True
    passes_input_on = True

    def op_forward(
        self,
        ctx: OperationContext,
        input_: torch.Tensor,
        *,
        prev_op_grad_output_quantizer=None,
        next_op_input_quantizer=None,
        **kwargs,
    ) -> torch.Tensor:
        return input_

    def op_backward(self, ctx: OperationContext, grad_output: torch.Tensor):
        return grad_output, ()
