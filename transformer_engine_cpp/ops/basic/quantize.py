"""Quantize: quantize the tensor passing through, forward and/or backward (TransformerEngine's
``te.ops.Quantize``).

Inside the pipeline tensors stay high precision, so under a recipe the op yields the values an
FP8 consumer sees, dequantize(quantize(x)), in x's dtype (quantize-dequantize), through the
``fp8_quantize`` / ``mxfp8_quantize`` and dequantize custom ops. Outside autocast, or for a
direction it does not quantize, it is the identity (a pass-through, no custom op).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from .. import _quantized
from ..op import BasicOperation, OperationContext


@dataclasses.dataclass
class QuantizeContext(OperationContext):
    """What Quantize's backward reads (it saves no tensors)."""

    #: the backward quantizer, None when the gradient passes through
    grad_quantizer: Any = None


class Quantize(BasicOperation):
    """Args: forward / backward: whether the output / the gradient are quantized."""

    accepts_forward_kwargs = False
    context_type = QuantizeContext

    def __init__(self, forward: bool = True, backward: bool = False) -> None:
        super().__init__()
        for name, value in (("forward", forward), ("backward", backward)):
            if not isinstance(value, bool):
                raise TypeError(f"Quantize: {name} must be a bool, got {type(value).__name__}")
        self._quantize_forward = forward
        self._quantize_backward = backward

    def num_quantizers(self, mode: str) -> int:
        if mode == "forward":
            return 1 if self._quantize_forward else 0
        return 1 if self._quantize_backward else 0

    def op_forward(self, ctx: QuantizeContext, input_: torch.Tensor, *,
                   prev_op_grad_output_quantizer=None, next_op_input_quantizer=None, **kwargs):
        quantizer = self.get_quantizer("forward", 0) if self._quantize_forward else None
        ctx.grad_quantizer = (self.get_quantizer("backward", 0)
                              if self._quantize_backward and self.backward_override() is None
                              else None)
        if _quantized.is_storage(input_):
            return input_.dequantize()  # the previous op already quantized it with ours
        if quantizer is None:
            return input_
        return quantizer.fake_quantize(input_)

    def op_backward(self, ctx: QuantizeContext, grad_output: torch.Tensor):
        if _quantized.is_storage(grad_output):
            return grad_output.dequantize(), ()
        if ctx.grad_quantizer is None:
            return grad_output, ()
        return ctx.grad_quantizer.fake_quantize(grad_output), ()

    def extra_repr(self) -> str:
        return f"forward={self._quantize_forward}, backward={self._quantize_backward}"
