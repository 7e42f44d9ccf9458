"""ReduceScatter: sum over ranks, each rank keeping its dim-0 chunk (tensor/sequence
parallelism)."""

from __future__ import annotations

import torch

from ..op import OperationContext
from ._comm import CommunicationOperation, gather_dim0, reduce_scatter_dim0


class ReduceScatter(CommunicationOperation):
    """Reduce-scatter along the outer dimension: y is chunk ``rank`` (of ``world size`` equal
    chunks along dim 0) of the sum of x over the ranks of ``process_group`` (the default group
    when None). Dim 0 must be a multiple of the group size (RuntimeError otherwise, as in TransformerEngine). Backward is
    the dual all-gather of dy. With one rank both passes are the identity. A quantized input is
    reduced dequantized."""

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
        return reduce_scatter_dim0(type(self).__name__, "input", input_, self.process_group,
                                   size)

    def op_backward(self, ctx: OperationContext, grad_output: torch.Tensor):
        size = self.process_group_size
        if size == 1:
            return grad_output, ()
        return gather_dim0(type(self).__name__, "output gradient", grad_output,
                           self.process_group, size), ()
