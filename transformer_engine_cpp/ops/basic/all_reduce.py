"""AllReduce: sum a tensor over ranks (tensor parallelism)."""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

from ..op import OperationContext
from ._comm import CommunicationOperation, plain


class AllReduce(CommunicationOperation):
    """All-reduce: y is the sum of x over the ranks of ``process_group`` (the default group
    when None), on every rank. As in TransformerEngine, the output is assumed to feed
    computation repeated identically on every rank, so the gradients are identical across ranks
    and backward is the identity (dx = dy, no communication). ``reduce_in_backward`` is accepted
    and kept (``_reduce_in_backward``) for TransformerEngine's signature; like TransformerEngine,
    backward does not read it. With one rank forward is the identity too. A quantized input is
    reduced dequantized. The input is never modified: the sum is written to a new tensor."""

    def __init__(self, process_group: Optional[dist.ProcessGroup] = None,
                 reduce_in_backward: bool = True) -> None:
        super().__init__(process_group)
        self._reduce_in_backward = bool(reduce_in_backward)

    def op_forward(
        self,
        ctx: OperationContext,
        input_: torch.Tensor,
        *,
        prev_op_grad_output_quantizer=None,
        next_op_input_quantizer=None,
        **kwargs,
    ) -> torch.Tensor:
        if self.process_group_size == 1:
            return input_
        x = plain(input_)
        # the collective works in place: never on the caller's tensor (or one saved by an op)
        y = x.clone() if x is input_ else x
        dist.all_reduce(y, group=self.process_group)
        return y

    def op_backward(self, ctx: OperationContext, grad_output: torch.Tensor):
        return grad_output, ()

    def extra_repr(self) -> str:
        return f"reduce_in_backward={self._reduce_in_backward}"
