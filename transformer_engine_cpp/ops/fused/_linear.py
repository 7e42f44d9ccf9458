"""Helpers shared by the fusions around a BasicLinear."""

from __future__ import annotations

import torch

from .. import _quantized
from ..basic import BasicLinear, Bias

# The forward fusions leave the basic ops' contexts exactly as their unfused forwards would, so
# the backward runs unfused or through the backward fusions. Under a quantization recipe
# TransformerEngine's fusions apply (BasicLinear's FP8 GEMM with the fusion's epilogue:
# quantized_linear); our extensions do not.


def _linear_prologue(ops, basic_op_ctxs, input_, has_bias: bool):
    """The shared start of the linear forward fusions: the linear's GEMM input (all-gathered
    under column-parallel sequence parallelism) and weight in the compute dtype, its context
    saved as the unfused BasicLinear would, and with ``has_bias`` the bias (the second op) in
    the compute dtype, else None."""
    linear = ops[0]
    linear_ctx = basic_op_ctxs[0]
    x, w = linear.prepare(linear_ctx, input_)
    b = ops[1].gemm_bias(basic_op_ctxs[1], linear_ctx.dtype) if has_bias else None
    linear.save_ctx(linear_ctx, x, w)
    return (linear.gather_input(x) if linear._gathers_input else x), w, b


def quantized_linear(ops, basic_op_ctxs, input_, has_bias: bool, *, extra=None,
                     alpha: float = 1.0):
    """The linear forward fusions under a recipe: the linear's FP8 GEMM with the fusion's
    epilogue (``BasicLinear._quantized_forward``: the bias, the second op, and the residual
    ``extra`` scaled by ``alpha`` added in fp32 before the one rounding), its context as the
    unfused BasicLinear leaves it. The bias' backward hands dx to the linear quantized with the
    linear's grad-output quantizer, as after the unfused Bias (TransformerEngine's), asking for
    only the copies the linear's backward reads (the pipeline's rule for the unfused Bias)."""
    linear, linear_ctx = ops[0], basic_op_ctxs[0]
    x, w = linear.prepare(linear_ctx, input_)
    b = None
    if has_bias:
        b = ops[1].gemm_bias(basic_op_ctxs[1], linear_ctx.dtype)
        if linear.backward_override() is None:
            basic_op_ctxs[1].grad_input_quantizer = _quantized.grad_output_quantizer_for(
                linear, linear_ctx)
    return linear._quantized_forward(linear_ctx, x, w, bias=b, extra=extra, alpha=alpha)


def bias_fuses(linear: BasicLinear, bias) -> bool:
    """Plan time: whether a forward fusion may add ``bias`` inside ``linear``'s GEMM, in the
    GEMM's dtype, with the unfused ops' result: under torch autocast both are cast to the
    autocast dtype; otherwise only a bias of the weight's dtype (the unfused Bias would promote
    another one, e.g. a bf16 GEMM output and an fp32 bias to fp32). The plan key holds the
    autocast dtype and the parameters' dtypes, so a change of either re-plans."""
    return linear.autocast_enabled() or bias.bias_dtype == linear.weight_dtype


def gemm_bias_at(ops: list, j: int, linear: BasicLinear):
    """The Bias at ``ops[j]`` if ``linear``'s GEMM can add it (``bias_fuses``), else None."""
    if j < len(ops) and type(ops[j]) is Bias and bias_fuses(linear, ops[j]):
        return ops[j]
    return None


def dbias_fuses(linear: BasicLinear, bias) -> bool:
    """Plan time: whether a backward fusion may take ``bias``' dbias from the dy of
    ``linear``'s GEMMs (in their dtype): when the Bias' output, hence dy, has that dtype, under
    torch autocast or when the bias' dtype promotes to the weight's."""
    weight_dtype = linear.weight_dtype
    return (linear.autocast_enabled()
            or torch.promote_types(bias.bias_dtype, weight_dtype) == weight_dtype)


def _linear_ok(op) -> bool:
    """A BasicLinear the forward fusions take: as TransformerEngine, not row-parallel (its
    output reduction follows the GEMM)."""
    return type(op) is BasicLinear and op.tensor_parallel_mode != "row"


def backward_linear_ok(op) -> bool:
    """A BasicLinear BackwardLinearAdd / BackwardLinearScale take: as TransformerEngine, not
    column-parallel (its dgrad is followed by a reduction)."""
    return type(op) is BasicLinear and op.tensor_parallel_mode != "column"


def add_fusion(fuse, in_place: bool, name: str, doc: str):
    """A fusion function applying ``fuse(ops, in_place)``: TransformerEngine's (in place) under
    any recipe or none, our extension (the functional add) without a recipe only."""
    def fusion(ops: list, *, recipe=None) -> list:
        return ops if recipe is not None and not in_place else fuse(ops, in_place)

    fusion.__name__ = fusion.__qualname__ = name
    fusion.__doc__ = doc
    return fusion
