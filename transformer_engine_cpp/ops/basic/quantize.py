"""Quantize: quantize the tensor passing through, forward and/or backward (TransformerEngine's
``te.ops.Quantize``).

Under a recipe the op quantizes with its quantizer (``fp8_quantize`` / ``mxfp8_quantize``) and
hands the result on quantized: to the next op in storage form (a linear uses it as its GEMM
operand without a second cast; other ops dequantize it), and at the pipeline's end to the
caller as a ``Float8Tensor`` / ``MXFP8Tensor`` (the output forward, the input's gradient
backward), as TransformerEngine returns a QuantizedTensor. An input already quantized passes
as it is. Outside autocast, or for a direction it does not quantize, it is the identity.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from ...quantization.quantizer import MXFP8Quantizer
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
    accepts_quantized_input = True  # passed on as it is
    accepts_quantized_grad_output = True
    passes_input_on = True
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
        if quantizer is None or _quantized.is_storage(input_):  # (the previous op used ours)
            return input_
        return _quantize(quantizer, input_)

    def op_backward(self, ctx: QuantizeContext, grad_output: torch.Tensor):
        if ctx.grad_quantizer is None or _quantized.is_storage(grad_output):
            return grad_output, ()
        return _quantize(ctx.grad_quantizer, grad_output), ()

    def extra_repr(self) -> str:
        return f"forward={self._quantize_forward}, backward={self._quantize_backward}"


def _quantize(quantizer, t: torch.Tensor):
    """``t`` quantized for the GEMMs after it: both copies where the format allows them
    (MXFP8's columnwise copy needs rows in multiples of 32), else the rowwise one."""
    if isinstance(quantizer, MXFP8Quantizer):
        rows = t.numel() // max(t.shape[-1], 1) if t.dim() else 1
        return quantizer.quantize_storage(t, rowwise=True, columnwise=rows % 32 == 0,
                                          op="Quantize")
    return quantizer.quantize_storage(t, rowwise=True, columnwise=True, op="Quantize")
