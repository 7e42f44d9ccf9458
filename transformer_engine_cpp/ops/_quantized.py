"""Quantized compute inside the pipeline (docs/fp8.md).

FP8 crosses the custom ops as plain buffers: ``fp8_quantize`` / ``mxfp8_quantize`` return
uint8 data and fp32 (or E8M0) scales, and the GEMM operands are their exact dequantization
(``fp8_dequantize`` / ``mxfp8_dequantize``) to fp32, multiplied with fp32 accumulation: an
exact emulation of an FP8 GEMM on CPU.

The functions here read a quantizer's configuration and call the ops directly; they never
mutate a quantizer (usages are arguments), so they are safe in a traced backward. Delayed
scaling's quantizer records its amax (a mutation); it is eager-only (refused under compile).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from ..quantization.quantizer import (Float8CurrentScalingQuantizer, Float8Quantizer,
                                      MXFP8Quantizer, check_mxfp8_shape)

te_ops = torch.ops.te_cpp


@dataclasses.dataclass(frozen=True)
class QuantizedOperand:
    """A GEMM operand as plain buffers. ``kind`` is "fp8" (per-tensor scale, one copy serves
    both usages) or "mxfp8" (rowwise and/or columnwise copies, 32-element E8M0 blocks)."""

    kind: str
    fmt: torch.dtype  # the FP8 format as its torch dtype
    shape: tuple
    row_data: Optional[torch.Tensor]
    row_scale: Optional[torch.Tensor]
    col_data: Optional[torch.Tensor] = None
    col_scale: Optional[torch.Tensor] = None
    #: the high-precision dtype the operand stands for (for gradients and dequantization)
    dtype: torch.dtype = torch.float32

    def tensors(self) -> tuple:
        """The buffers to save for backward (None where absent)."""
        return (self.row_data, self.row_scale, self.col_data, self.col_scale)

    def meta(self) -> tuple:
        return (self.kind, self.fmt, self.shape)

    @staticmethod
    def rebuild(tensors, meta) -> "QuantizedOperand":
        kind, fmt, shape = meta
        return QuantizedOperand(kind, fmt, shape, *tensors)

    def dequantize(self) -> torch.Tensor:
        """The high-precision values, in the nominal dtype."""
        return self.rowwise(self.dtype) if self.row_data is not None else self.columnwise(self.dtype)

    def rowwise(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Dequantized copy blocked along the last dim (the GEMM's K for x and W forward)."""
        if self.kind == "fp8":
            return te_ops.fp8_dequantize(self.row_data, self.row_scale, self.fmt, dtype)
        return te_ops.mxfp8_dequantize(self.row_data, self.row_scale, self.fmt, dtype)

    def columnwise(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Dequantized copy blocked down the columns (the K of dgrad / wgrad), in the logical
        shape. Per-tensor scaling has one copy for both usages."""
        if self.kind == "fp8":
            data = self.row_data if self.row_data is not None else self.col_data
            scale = self.row_scale if self.row_scale is not None else self.col_scale
            return te_ops.fp8_dequantize(data, scale, self.fmt, dtype)
        t = te_ops.mxfp8_dequantize(self.col_data, self.col_scale, self.fmt, dtype)
        return t.t().reshape(self.shape)


def quantize(quantizer, t: torch.Tensor, *, rowwise: bool = True,
             columnwise: bool = False, op: Optional[str] = None) -> QuantizedOperand:
    """Quantize ``t`` with ``quantizer``'s configuration into plain buffers. ``op`` names the
    calling op in errors."""
    if isinstance(quantizer, Float8CurrentScalingQuantizer):
        data, scale_inv, _ = te_ops.fp8_quantize(t, quantizer.dtype,
                                                 quantizer.force_pow_2_scales,
                                                 quantizer.amax_epsilon)
        return QuantizedOperand("fp8", quantizer.dtype, tuple(t.shape), data, scale_inv,
                                dtype=t.dtype)
    if isinstance(quantizer, Float8Quantizer):
        data, scale_inv, amax = te_ops.fp8_quantize_scaled(t, quantizer.scale.reshape(1),
                                                           quantizer.dtype)
        with torch.no_grad():  # the amax history slot (delayed scaling: eager only)
            quantizer.amax.copy_(torch.maximum(quantizer.amax, amax.reshape(quantizer.amax.shape)))
        return QuantizedOperand("fp8", quantizer.dtype, tuple(t.shape), data, scale_inv,
                                dtype=t.dtype)
    if isinstance(quantizer, MXFP8Quantizer):
        check_mxfp8_shape(op or "MXFP8BlockScaling", t.shape, rowwise=rowwise,
                          columnwise=columnwise)
        row = te_ops.mxfp8_quantize(t, quantizer.dtype) if rowwise else (None, None)
        col = (None, None)
        if columnwise:
            cols = t.shape[-1]
            col = te_ops.mxfp8_quantize(t.reshape(-1, cols).t().contiguous(), quantizer.dtype)
        return QuantizedOperand("mxfp8", quantizer.dtype, tuple(t.shape), *row, *col,
                                dtype=t.dtype)
    raise TypeError(f"unsupported quantizer {type(quantizer).__name__}")


def fake_quantize(quantizer, t: torch.Tensor) -> torch.Tensor:
    """dequantize(quantize(t)) in t's dtype: the values an FP8 consumer would see."""
    return quantize(quantizer, t).rowwise(t.dtype)


def emit(y: torch.Tensor, next_op_input_quantizer):
    """The neighbour protocol (te_ops.md 4.2): an op whose next op quantizes its input hands
    over its output already quantized, so the consumer skips that step. Per-tensor FP8
    (current or delayed scaling): one copy serves the consumer's row- and columnwise uses.
    MXFP8: both copies (the consumer's GEMMs need blocks along either dim), when the rows are
    a multiple of 32; otherwise, or without a quantizer, the output stays high precision."""
    q = next_op_input_quantizer
    if q is None:
        return y
    if isinstance(q, (Float8CurrentScalingQuantizer, Float8Quantizer)):
        return quantize(q, y)
    if isinstance(q, MXFP8Quantizer) and y.dim() >= 1 and y.shape[-1] % 32 == 0 \
            and (y.numel() // max(y.shape[-1], 1)) % 32 == 0:
        return quantize(q, y, rowwise=True, columnwise=True)
    return y


def as_high_precision(t):
    """An op that cannot consume quantized input dequantizes it."""
    return t.dequantize() if isinstance(t, QuantizedOperand) else t
