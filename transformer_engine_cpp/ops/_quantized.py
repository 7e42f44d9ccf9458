"""Quantized operands inside the pipeline (docs/quantization.md).

A quantized operand is the storage form of a quantized tensor (``Float8TensorStorage`` /
``MXFP8TensorStorage``, from ``Quantizer.quantize_storage``): plain uint8 data and fp32 or E8M0
scales. The GEMM operands are its exact dequantization to fp32 (``dequantize_rowwise`` /
``dequantize_columnwise``), multiplied with fp32 accumulation: an exact emulation of an FP8
GEMM on CPU. The quantizers implement the quantization, the neighbour protocol (``emit``) and
fake quantization; this module holds the pipeline's two helpers around them.
"""

from __future__ import annotations

import torch

from ..quantization.tensor import QuantizedTensorStorage


def is_storage(t) -> bool:
    """Whether ``t`` is a quantized operand in its storage form (handed over by the previous
    op), as opposed to a tensor (a ``Float8Tensor`` given by the caller is a tensor)."""
    return isinstance(t, QuantizedTensorStorage) and not isinstance(t, torch.Tensor)


def emit(y: torch.Tensor, next_op_input_quantizer):
    """The neighbour protocol: ``y`` as the next op's input quantizer hands it over
    (``Quantizer.emit``), or ``y`` itself without a quantizer."""
    return y if next_op_input_quantizer is None else next_op_input_quantizer.emit(y)


def grad_output_quantizer_for(op, ctx):
    """The quantizer the op after ``op`` hands ``op``'s dy over with (the backward neighbour
    protocol), for ``op``'s context ``ctx``: ``op``'s grad-output quantizer with only the copies
    ``op``'s backward GEMMs read: none where the backward does not reach ``op``, no row-wise
    copy (the dgrad's) where its input needs no gradient (pipeline_forward and the fused
    linear forwards hand dy over with it)."""
    if not ctx.requires_grad:
        return None
    q = op.get_grad_output_quantizer()
    if q is not None and not ctx.input_requires_grad:
        return q.usage_variant(rowwise=False, columnwise=True) if q.columnwise_usage else None
    return q


def as_high_precision(t):
    """An op that cannot consume a quantized operand dequantizes it (to its nominal dtype).
    (``is_storage`` inlined: this runs on every op's per-call path.)"""
    if isinstance(t, QuantizedTensorStorage) and not isinstance(t, torch.Tensor):
        return t.dequantize()
    return t


def public(t):
    """What leaves the pipeline (its output, the input's gradient) when it is a quantized
    operand (the caller checks ``is_storage``, inlined on the per-call path): as its
    public tensor subclass (``Float8Tensor`` / ``MXFP8Tensor`` over the same buffers), so a
    ``Quantize`` at either end hands the caller a quantized tensor, as TransformerEngine's.
    Under torch.compile its dequantization instead (the same values): AOTAutograd would expect
    a tensor-subclass output's gradient to be that subclass too, and the caller's is plain."""
    return t.dequantize() if torch.compiler.is_compiling() else t.to_tensor()
