"""The Reshape op (no custom op: y is a view of x where torch can make one)."""

from __future__ import annotations

from typing import Iterable

import torch

from .._common import check_shape
from ..op import BasicOperation, OperationContext


class Reshape(BasicOperation):
    """y = x.reshape(shape) (one entry may be -1); dx = dy.reshape(x.shape)."""

    accepts_forward_kwargs = False

    def __init__(self, shape: Iterable[int]) -> None:
        super().__init__()
        self._shape = check_shape("Reshape", "shape", shape, allow_infer=True)

    def op_forward(
        self,
        ctx: OperationContext,
        input_: torch.Tensor,
        *,
        prev_op_grad_output_quantizer=None,
        next_op_input_quantizer=None,
        **kwargs,
    ) -> torch.Tensor:
        ctx.input_shape = input_.shape
        return input_.reshape(*self._shape)

    def op_backward(self, ctx: OperationContext, grad_output: torch.Tensor):
        return grad_output.reshape(ctx.input_shape), ()

    def extra_repr(self) -> str:
        return f"shape={self._shape}"
