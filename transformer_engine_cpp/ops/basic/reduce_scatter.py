"""ReduceScatter: sum over ranks, each rank keeping its dim-0 chunk (tensor/sequence
parallelism)."""

from __future__ import annotations

import torch

from ... import _comm
from ..op import OperationContext
from ._comm import CommunicationOperation, plain


class ReduceScatter(CommunicationOperation):
    """Reduce-scatter along the outer dimension: y is chunk ``rank`` (of ``group size`` equal
    chunks along dim 0) of the sum of x over the ranks of ``process_group`` (the default group
    when None). Dim 0 must be a multiple of the group size (a RuntimeError otherwise, as in
    TransformerEngine). Backward is the dual all-gather of dy. With one rank both passes are the
    identity. A quantized input is reduced dequantized."""

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
        return _comm.wait(_comm.reduce_scatter(plain(input_), group, size, who="ReduceScatter",
                                               what="input"))

    def op_backward(self, ctx: OperationContext, grad_output: torch.Tensor):
        group, size = self._resolved()
        if size == 1:
            return grad_output, ()
        return _comm.wait(_comm.all_gather(plain(grad_output), group, size,
                                           who="ReduceScatter", what="output gradient")), ()
