"""The Reshape op (no custom op: y is a view of x where torch can make one)."""

from __future__ import annotations

import dataclasses
from typing import Iterable, Optional

import torch

from .._common import check_shape
from ..op import BasicOperation, OperationContext


@dataclasses.dataclass
class ReshapeContext(OperationContext):
    """What Reshape's backward reads (it saves no tensors)."""

    #: the input's shape, dx's shape
    input_shape: Optional[torch.Size] = None


class Reshape(BasicOperation):
    """y = x.reshape(shape) (one entry may be -1); dx = dy.reshape(x.shape)."""

    accepts_forward_kwargs = False
    context_type = ReshapeContext

    def __init__(self, shape: Iterable[int]) -> None:
        super().__init__()
        self._shape = check_shape("Reshape", "shape", shape, allow_infer=True)

    def op_forward(
        self,
        ctx: ReshapeContext,
        input_: torch.Tensor,
        *,
        prev_op_grad_output_quantizer=None,
        next_op_input_quantizer=None,
        **kwargs,
    ) -> torch.Tensor:
        ctx.input_shape = input_.shape
        return input_.reshape(*self._shape)

    def op_backward(self, ctx: ReshapeContext, grad_output: torch.Tensor):
        return grad_output.reshape(ctx.input_shape), ()

    def extra_repr(self) -> str:
        return f"shape={self._shape}"
