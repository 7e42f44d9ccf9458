"""Helpers shared by the fusions around a BasicLinear."""

from __future__ import annotations

from .._common import autocast_dtype
from ..basic import BasicLinear

# The forward fusions leave the basic ops' contexts exactly as their unfused forwards would, so
# the backward runs unfused or through the backward fusions. Under a quantization recipe they do
# not apply (BasicLinear's FP8 path runs unfused).


def _linear_prologue(fused, basic_op_ctxs, input_, basic_op_kwargs, has_bias: bool):
    """The shared start of the linear forward fusions: the linear's input and weight in the
    compute dtype, its context saved as the unfused BasicLinear would, and the Bias' context
    filled. Returns (x, w, bias or None) in the compute dtype. (The fuser has already rejected
    forward kwargs for these ops.)"""
    linear = fused._ops[0]
    linear_ctx = basic_op_ctxs[0]
    x, w = linear.prepare(linear_ctx, input_)
    b = None
    if has_bias:
        bias = fused._ops[1]
        basic_op_ctxs[1].grad_input_quantizer = None  # the linear before it is in the fusion
        b = bias.bias_in(linear_ctx.dtype)
    linear.save_ctx(linear_ctx, x, w)
    return x, w, b


def bias_fuses(fused, input_) -> bool:
    """Whether the bias can ride in the GEMM: under autocast both are cast to the autocast
    dtype; otherwise only when the bias already has the linear's compute dtype (the unfused
    Bias would promote a differing dtype, e.g. bf16 activations + fp32 bias -> fp32)."""
    linear, bias = fused._ops[0], fused._ops[1]
    if autocast_dtype(input_, None) is not None:
        return True
    return bias._parameters["bias"].dtype == linear._parameters["weight"].dtype


def run_unfused(fused, basic_op_ctxs, input_, basic_op_kwargs):
    """The basic ops' own forwards in sequence (for configurations a fusion does not cover)."""
    x = input_
    for op, ctx, kwargs in zip(fused._ops, basic_op_ctxs, basic_op_kwargs):
        x = op.op_forward(ctx, x, **kwargs)
    return x, [()] * len(fused._ops)


def _linear_ok(op) -> bool:
    return type(op) is BasicLinear


def _unquantized_add_fusion(fuse, in_place: bool, name: str, doc: str):
    """A fusion function applying ``fuse(ops, in_place)`` when no recipe is active (quantized
    GEMMs run through BasicLinear's FP8 path, unfused)."""
    def fusion(ops: list, *, recipe=None) -> list:
        return ops if recipe is not None else fuse(ops, in_place)

    fusion.__name__ = fusion.__qualname__ = name
    fusion.__doc__ = doc
    return fusion
