"""ConstantScale: y = scale * x."""

from __future__ import annotations

import math

import torch

from ..op import BasicOperation, OperationContext


class ConstantScale(BasicOperation):
    """Multiplies by a fixed Python float; dx = scale * dy."""

    accepts_forward_kwargs = False

    def __init__(self, scale: float) -> None:
        super().__init__()
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
            raise ValueError(f"ConstantScale: scale must be a finite number, got {scale!r}")
        self.scale = float(scale)

    def op_forward(
        self,
        ctx: OperationContext,
        input_: torch.Tensor,
        *,
        prev_op_grad_output_quantizer=None,
        next_op_input_quantizer=None,
        **kwargs,
    ) -> torch.Tensor:
        return torch.ops.te_cpp.constant_scale_fwd.default(input_, self.scale)

    def op_backward(self, ctx: OperationContext, grad_output: torch.Tensor):
        return torch.ops.te_cpp.constant_scale_bwd.default(grad_output, self.scale), ()

    def extra_repr(self) -> str:
        return f"scale={self.scale}"
