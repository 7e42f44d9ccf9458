"""The ForwardLinearBiasAdd fusion: a BasicLinear and its Bias accumulated into a residual."""

from __future__ import annotations

from typing import Optional

import torch

from .._common import is_compiling, shares_storage
from ..basic import AddExtraInput, BasicLinear, Bias, ConstantScale
from ..op import FusedOperation
from ._linear import (_linear_ok, _linear_prologue, add_fusion, gemm_bias_at,
                      quantized_linear)
from ._window import fuse_windows
from .forward_linear_bias_activation import _linear_bias_only


class ForwardLinearBiasAdd(FusedOperation):
    """Forward-only fusion of BasicLinear, an optional Bias and AddExtraInput.

    ``[BasicLinear, Bias?, AddExtraInput]``: the GEMM accumulates into the residual
    (``torch.ops.te_cpp.linear_fwd_add``); with ``in_place=True`` into the caller's buffer in
    eager mode. TransformerEngine needs ``in_place=True``; here the functional add fuses too.
    The fusion functions build it with a bias only where the GEMM can add it (``bias_fuses``).
    """

    accepts_quantized_input = True  # the linear's GEMM operand

    def __init__(self, *, linear: BasicLinear, bias: Optional[Bias], add: AddExtraInput,
                 scale: Optional[ConstantScale] = None):
        super().__init__([op for op in (linear, bias, scale, add) if op is not None])
        self._has_bias = bias is not None
        self._has_scale = scale is not None
        self._in_place = add.in_place

    def fuser_forward(self, basic_op_ctxs, input_, *, basic_op_extra_inputs,
                      prev_op_grad_output_quantizer=None, next_op_input_quantizer=None,
                      basic_op_kwargs):
        extra = basic_op_extra_inputs[-1][0]
        if self._in_place and not is_compiling() and shares_storage(input_, extra):
            # the GEMM must not read (nor the linear save) the buffer it accumulates into
            input_ = input_.clone()
        # the scale is read per call (a ConstantScale's value may change after planning)
        alpha = self._ops[-2].scale if self._has_scale else 1.0
        if self._ops[0]._quantizers is not None:  # an FP8 GEMM accumulating in fp32
            out = quantized_linear(self._ops, basic_op_ctxs, input_, self._has_bias,
                                   extra=extra, alpha=alpha)
            if self._in_place and not is_compiling():
                buffer = extra.detach()
                buffer.copy_(out)
                torch.autograd.graph.increment_version(buffer)
                return buffer, [()] * len(self._ops)
            dtype = basic_op_ctxs[0].dtype
            out_dtype = (extra.dtype if self._in_place
                         else torch.promote_types(dtype, extra.dtype))
            return out.to(out_dtype), [()] * len(self._ops)
        x, w, b = _linear_prologue(self._ops, basic_op_ctxs, input_, self._has_bias)
        if self._in_place and not is_compiling():
            buffer = extra.detach()
            torch.ops.te_cpp.linear_fwd_add_inplace.default(buffer, x, w, b, alpha)
            torch.autograd.graph.increment_version(buffer)
            return buffer, [()] * len(self._ops)
        out_dtype = extra.dtype if self._in_place else torch.promote_types(x.dtype, extra.dtype)
        extra = extra if extra.dtype == out_dtype else extra.to(out_dtype)
        out = torch.ops.te_cpp.linear_fwd_add.default(x, w, b, extra, alpha)
        return out, [()] * len(self._ops)


def _fuse_linear_bias_add(ops: list, in_place: bool) -> list:
    """``[BasicLinear, Bias?, AddExtraInput]`` with the add's ``in_place`` as given, the Bias
    only where the GEMM can add it (``bias_fuses``); a ``[BasicLinear, Bias]`` already fused
    without activation (ForwardLinearBiasActivation, an earlier fusion) takes the add after
    it."""
    def is_add(j):
        return j < len(ops) and type(ops[j]) is AddExtraInput and ops[j].in_place == in_place

    def match(ops, i):
        op = ops[i]
        fused = _linear_bias_only(op)
        if fused is not None:
            if not is_add(i + 1):
                return None
            return ForwardLinearBiasAdd(linear=fused[0], bias=fused[1], add=ops[i + 1]), 2
        if not _linear_ok(op):
            return None
        j = i + 1
        bias = gemm_bias_at(ops, j, op)
        j += bias is not None
        if is_add(j):
            return ForwardLinearBiasAdd(linear=op, bias=bias, add=ops[j]), j - i + 1
        return None

    return fuse_windows(ops, match)


fuse_forward_linear_bias_add = add_fusion(
    _fuse_linear_bias_add, True, "fuse_forward_linear_bias_add",
    "``[BasicLinear, Bias?, AddExtraInput(in_place=True)]``, as TransformerEngine.")
extend_forward_linear_bias_add = add_fusion(
    _fuse_linear_bias_add, False, "extend_forward_linear_bias_add",
    "The same with the functional add (an extension).")
