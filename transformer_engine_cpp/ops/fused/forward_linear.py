"""Forward-only fusions around a BasicLinear: one GEMM with its epilogue.

* ForwardLinearBiasActivation: ``[BasicLinear, Bias?, act?]`` (at least one of the two):
  ``act(x W^T + b)``, the bias and the activation applied in one pass over the GEMM output
  (``torch.ops.te_cpp.linear_bias_act_fwd``), or bias only through the GEMM's own C operand
  (``linear_fwd``). The anchor fuses only the bias, and only for fp16/bf16 weights; here any
  floating dtype and the activations GELU, ReLU, SiLU, QGELU and SReLU.
* ForwardLinearBiasAdd: ``[BasicLinear, Bias?, AddExtraInput]``: the GEMM accumulates into the
  residual (``linear_fwd_add``); with ``in_place=True`` into the caller's buffer in eager mode.
  The anchor needs ``in_place=True``; here the functional add fuses too.
* ForwardLinearScaleAdd: ``[BasicLinear, ConstantScale, AddExtraInput]``: extra + s * x W^T,
  the scale as the GEMM's alpha.

Each leaves the basic ops' contexts exactly as their unfused forwards would, so the backward
runs unfused or through the backward fusions. Under a quantization recipe they do not apply
(BasicLinear's FP8 path runs unfused).
"""

from __future__ import annotations

from typing import Optional

import torch

from .._common import autocast_dtype, is_compiling, shares_storage
from ..basic import (GELU, QGELU, AddExtraInput, BasicLinear, Bias, ConstantScale, ReLU, SiLU,
                     SReLU)
from ..op import FusedOperation
from ._window import fuse_windows

# the custom ops' OpOverloads, resolved once (a packet call resolves the overload every time)
_linear_fwd = torch.ops.te_cpp.linear_fwd.default
_linear_bias_act_fwd = torch.ops.te_cpp.linear_bias_act_fwd.default

# Activation class -> name understood by linear_bias_act_fwd.
EPILOGUE_ACTIVATIONS = {GELU: "gelu", ReLU: "relu", SiLU: "silu", QGELU: "qgelu", SReLU: "srelu"}


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


class ForwardLinearBiasActivation(FusedOperation):
    """Forward-only fusion of BasicLinear with the Bias and/or activation after it."""

    def __init__(self, *, linear: BasicLinear, bias: Optional[Bias] = None, activation=None):
        if bias is None and activation is None:
            raise ValueError("ForwardLinearBiasActivation needs a bias or an activation")
        if activation is not None and type(activation) not in EPILOGUE_ACTIVATIONS:
            raise ValueError("ForwardLinearBiasActivation: unsupported activation "
                             f"{type(activation).__name__}")
        super().__init__([op for op in (linear, bias, activation) if op is not None])
        self._has_bias = bias is not None
        self._activation = None if activation is None else EPILOGUE_ACTIVATIONS[type(activation)]

    def fuser_forward(self, basic_op_ctxs, input_, *, basic_op_extra_inputs,
                      prev_op_grad_output_quantizer=None, next_op_input_quantizer=None,
                      basic_op_kwargs):
        if self._has_bias and not bias_fuses(self, input_):
            return run_unfused(self, basic_op_ctxs, input_, basic_op_kwargs)
        x, w, b = _linear_prologue(self, basic_op_ctxs, input_, basic_op_kwargs, self._has_bias)
        if self._activation is None:
            return _linear_fwd(x, w, b), [()] * len(self._ops)
        y, act_input = _linear_bias_act_fwd(x, w, b, self._activation)
        act_ctx = basic_op_ctxs[-1]
        act_ctx.input_dtype = act_input.dtype
        if act_ctx.requires_grad:
            act_ctx.save_for_backward(act_input)
        return y, [()] * len(self._ops)


class ForwardLinearBiasAdd(FusedOperation):
    """Forward-only fusion of BasicLinear, an optional Bias and AddExtraInput."""

    def __init__(self, *, linear: BasicLinear, bias: Optional[Bias], add: AddExtraInput,
                 scale: Optional[ConstantScale] = None):
        super().__init__([op for op in (linear, bias, scale, add) if op is not None])
        self._has_bias = bias is not None
        self._has_scale = scale is not None
        self._in_place = add._in_place

    def fuser_forward(self, basic_op_ctxs, input_, *, basic_op_extra_inputs,
                      prev_op_grad_output_quantizer=None, next_op_input_quantizer=None,
                      basic_op_kwargs):
        if self._has_bias and not bias_fuses(self, input_):
            # linear and bias unfused; the residual add through the op's own forward
            h, _ = run_unfused(self, basic_op_ctxs[:-1], input_, basic_op_kwargs[:-1])
            add = self._ops[-1]
            return add.fuser_forward(basic_op_ctxs[-1:], h,
                                     basic_op_extra_inputs=basic_op_extra_inputs[-1:],
                                     basic_op_kwargs=basic_op_kwargs[-1:])[0], \
                [()] * len(self._ops)
        extra = basic_op_extra_inputs[-1][0]
        if self._in_place and not is_compiling() and shares_storage(input_, extra):
            # the GEMM must not read (nor the linear save) the buffer it accumulates into
            input_ = input_.clone()
        x, w, b = _linear_prologue(self, basic_op_ctxs, input_, basic_op_kwargs, self._has_bias)
        # the scale is read per call (a ConstantScale's value may change after planning)
        alpha = self._ops[-2].scale if self._has_scale else 1.0
        if self._in_place and not is_compiling():
            buffer = extra.detach()
            torch.ops.te_cpp.linear_fwd_add_inplace.default(buffer, x, w, b, alpha)
            torch.autograd.graph.increment_version(buffer)
            return buffer, [()] * len(self._ops)
        out_dtype = extra.dtype if self._in_place else torch.promote_types(x.dtype, extra.dtype)
        extra = extra if extra.dtype == out_dtype else extra.to(out_dtype)
        out = torch.ops.te_cpp.linear_fwd_add.default(x, w, b, extra, alpha)
        return out, [()] * len(self._ops)


class ForwardLinearScaleAdd(ForwardLinearBiasAdd):
    """Forward-only fusion of BasicLinear, ConstantScale and AddExtraInput."""

    def __init__(self, *, linear: BasicLinear, scale: ConstantScale, add: AddExtraInput):
        super().__init__(linear=linear, bias=None, add=add, scale=scale)


def _linear_ok(op) -> bool:
    return type(op) is BasicLinear


def _linear_bias_only(op) -> Optional[tuple]:
    """``(linear, bias)`` of a ForwardLinearBiasActivation without activation (the
    TransformerEngine fusion of ``[BasicLinear, Bias]``), which a later fusion may extend; else
    None."""
    if type(op) is ForwardLinearBiasActivation and op._activation is None:
        return op._ops
    return None


def _fuse_linear_bias_add(ops: list, in_place: bool) -> list:
    """``[BasicLinear, Bias?, AddExtraInput]`` with the add's ``in_place`` as given; a
    ``[BasicLinear, Bias]`` already fused without activation (ForwardLinearBiasActivation, an
    earlier fusion) takes the add after it."""
    def is_add(j):
        return j < len(ops) and type(ops[j]) is AddExtraInput and ops[j]._in_place == in_place

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
        bias = ops[j] if j < len(ops) and type(ops[j]) is Bias else None
        j += bias is not None
        if is_add(j):
            return ForwardLinearBiasAdd(linear=op, bias=bias, add=ops[j]), j - i + 1
        return None

    return fuse_windows(ops, match)


def _unquantized_add_fusion(fuse, in_place: bool, name: str, doc: str):
    """A fusion function applying ``fuse(ops, in_place)`` when no recipe is active (quantized
    GEMMs run through BasicLinear's FP8 path, unfused)."""
    def fusion(ops: list, *, recipe=None) -> list:
        return ops if recipe is not None else fuse(ops, in_place)

    fusion.__name__ = fusion.__qualname__ = name
    fusion.__doc__ = doc
    return fusion


fuse_forward_linear_bias_add = _unquantized_add_fusion(
    _fuse_linear_bias_add, True, "fuse_forward_linear_bias_add",
    "``[BasicLinear, Bias?, AddExtraInput(in_place=True)]``, as TransformerEngine.")
extend_forward_linear_bias_add = _unquantized_add_fusion(
    _fuse_linear_bias_add, False, "extend_forward_linear_bias_add",
    "The same with the functional add (an extension).")


def fuse_forward_linear_bias_activation(ops: list, *, recipe=None) -> list:
    """``[BasicLinear, Bias]`` with an fp16/bf16 weight, as TransformerEngine (which fuses no
    activation into the GEMM)."""
    if recipe is not None:  # quantized GEMMs run through BasicLinear's FP8 path, unfused
        return ops

    def match(ops, i):
        if (i + 1 < len(ops) and _linear_ok(ops[i]) and type(ops[i + 1]) is Bias
                and ops[i]._parameters["weight"].dtype in (torch.float16, torch.bfloat16)):
            return ForwardLinearBiasActivation(linear=ops[i], bias=ops[i + 1]), 2
        return None

    return fuse_windows(ops, match)


def _epilogue_activation(op) -> bool:
    return type(op) in EPILOGUE_ACTIVATIONS and not op.cache_quantized_input


def extend_forward_linear_bias_activation(ops: list, *, recipe=None) -> list:
    """The extension: ``[BasicLinear, Bias?, act?]`` in any float dtype, with the activations
    of EPILOGUE_ACTIVATIONS in the epilogue; a ``[BasicLinear, Bias]`` already fused without
    activation takes the activation after it."""
    if recipe is not None:
        return ops

    def match(ops, i):
        op = ops[i]
        fused = _linear_bias_only(op)
        if fused is not None:
            if i + 1 < len(ops) and _epilogue_activation(ops[i + 1]):
                return ForwardLinearBiasActivation(linear=fused[0], bias=fused[1],
                                                   activation=ops[i + 1]), 2
            return None
        if not _linear_ok(op):
            return None
        j = i + 1
        bias = ops[j] if j < len(ops) and type(ops[j]) is Bias else None
        j += bias is not None
        act = ops[j] if j < len(ops) and _epilogue_activation(ops[j]) else None
        j += act is not None
        if bias is None and act is None:
            return None
        return ForwardLinearBiasActivation(linear=op, bias=bias, activation=act), j - i

    return fuse_windows(ops, match)


def _fuse_linear_scale_add(ops: list, in_place: bool) -> list:
    def match(ops, i):
        if (i + 2 < len(ops) and _linear_ok(ops[i]) and type(ops[i + 1]) is ConstantScale
                and type(ops[i + 2]) is AddExtraInput and ops[i + 2]._in_place == in_place):
            return ForwardLinearScaleAdd(linear=ops[i], scale=ops[i + 1], add=ops[i + 2]), 3
        return None

    return fuse_windows(ops, match)


fuse_forward_linear_scale_add = _unquantized_add_fusion(
    _fuse_linear_scale_add, True, "fuse_forward_linear_scale_add",
    "``[BasicLinear, ConstantScale, AddExtraInput(in_place=True)]``, as TransformerEngine.")
extend_forward_linear_scale_add = _unquantized_add_fusion(
    _fuse_linear_scale_add, False, "extend_forward_linear_scale_add",
    "The same with the functional add (an extension).")
