"""AllGather: concatenate every rank's tensor along dim 0 (tensor/sequence parallelism)."""

from __future__ import annotations

import torch

from ..op import OperationContext
from ._comm import CommunicationOperation, gather_dim0, reduce_scatter_dim0


class AllGather(CommunicationOperation):
    """All-gather along the outer dimension: y is the concatenation along dim 0 of x from every
    rank of ``process_group`` (the default group when None), in rank order. Backward is the
    dual reduce-scatter: dx is this rank's dim-0 chunk of the sum of dy over the ranks. With one
    rank both passes are the identity. A quantized input is gathered dequantized."""

    def op_forward(
        self,
        ctx: OperationContext,
        input_: torch.Tensor,
        *,
        prev_op_grad_output_quantizer=None,
        next_op_input_quantizer=None,
        **kwargs,
    ) -> torch.Tensor:
        size = self.process_group_size
        if size == 1:
            return input_
        return gather_dim0(type(self).__name__, "input", input_, self.process_group, size)

    def op_backward(self, ctx: OperationContext, grad_output: torch.Tensor):
        size = self.process_group_size
        if size == 1:
            return grad_output, ()
        return reduce_scatter_dim0(type(self).__name__, "output gradient", grad_output,
                                   self.process_group, size), ()
