"""AllGather: concatenate every rank's tensor along dim 0 (tensor/sequence parallelism)."""

from __future__ import annotations

import torch

from ... import _comm
from ..op import OperationContext
from ._comm import CommunicationOperation, plain


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
        group, size = self._resolved()
        if size == 1:
            return input_
        return _comm.wait(_comm.all_gather(plain(input_), group, size, who="AllGather",
                                           what="input"))

    def op_backward(self, ctx: OperationContext, grad_output: torch.Tensor):
        group, size = self._resolved()
        if size == 1:
            return grad_output, ()
        return _comm.wait(_comm.reduce_scatter(plain(grad_output), group, size, who="AllGather",
                                               what="output gradient")), ()
