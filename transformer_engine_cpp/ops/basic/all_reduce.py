"""AllReduce: sum a tensor over ranks (tensor parallelism)."""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

from ... import _comm
from ..op import OperationContext
from ._comm import CommunicationOperation


class AllReduce(CommunicationOperation):
    """All-reduce: y is the sum of x over the ranks of ``process_group`` (the default group
    when None), on every rank, in a new tensor (the input is never modified). As in
    TransformerEngine, the output is assumed to feed computation repeated identically on every
    rank, so the gradients are identical across ranks and backward is the identity (dx = dy, no
    communication). ``reduce_in_backward`` is accepted and kept (``_reduce_in_backward``) for
    TransformerEngine's signature; like TransformerEngine, backward does not read it. With one
    rank forward is the identity too. A quantized input is reduced dequantized."""

    def __init__(self, process_group: Optional[dist.ProcessGroup] = None,
                 reduce_in_backward: bool = True) -> None:
        super().__init__(process_group)
        self._reduce_in_backward = bool(reduce_in_backward)

    def _forward_collective(self, x, group, size):
        return _comm.all_reduce(x, group)

    def op_backward(self, ctx: OperationContext, grad_output: torch.Tensor):
        return grad_output, ()

    def extra_repr(self) -> str:
        return f"reduce_in_backward={self._reduce_in_backward}"
