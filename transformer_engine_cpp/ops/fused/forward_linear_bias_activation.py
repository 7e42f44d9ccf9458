"""The ForwardLinearBiasActivation fusion: a BasicLinear, its Bias and activation in one GEMM."""

from __future__ import annotations

from typing import Optional

import torch

from ..basic import ACTIVATIONS, BasicLinear, Bias
from ..op import FusedOperation
from ._linear import (_linear_ok, _linear_prologue, bias_fuses, gemm_bias_at,
                      quantized_linear)
from ._window import fuse_windows

# the custom ops' OpOverloads (host cost: docs/architecture.md)
_linear_fwd = torch.ops.te_cpp.linear_fwd.default
_linear_bias_act_fwd = torch.ops.te_cpp.linear_bias_act_fwd.default

# Activation class -> name understood by linear_bias_act_fwd, from the activation classes'
# attributes.
EPILOGUE_ACTIVATIONS = {cls: cls.op_stem for cls in ACTIVATIONS if cls.fuses_linear_bias_act}


class ForwardLinearBiasActivation(FusedOperation):
    """Forward-only fusion of BasicLinear with the Bias and/or activation after it.

    ``[BasicLinear, Bias?, act?]`` (at least one of the two): ``act(x W^T + b)``, the bias and
    the activation applied in one pass over the GEMM output
    (``torch.ops.te_cpp.linear_bias_act_fwd``), or bias only through the GEMM's own C operand
    (``linear_fwd``). TransformerEngine fuses only the bias, and only for fp16/bf16 weights;
    here any floating dtype and the activations whose class sets ``fuses_linear_bias_act``
    (EPILOGUE_ACTIVATIONS). The fusion functions build it with a bias only where the GEMM can
    add it (``bias_fuses``).
    """

    accepts_quantized_input = True  # the linear's GEMM operand

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
        ops = self._ops
        if ops[0]._quantizers is not None:  # TransformerEngine's fusion: an FP8 GEMM + bias
            return (quantized_linear(ops, basic_op_ctxs, input_, self._has_bias),
                    [()] * len(ops))
        x, w, b = _linear_prologue(ops, basic_op_ctxs, input_, self._has_bias)
        if self._activation is None:
            return _linear_fwd(x, w, b), [()] * len(ops)
        y, act_input = _linear_bias_act_fwd(x, w, b, self._activation)
        ops[-1].save_fused_input(basic_op_ctxs[-1], act_input)
        return y, [()] * len(ops)


def _linear_bias_only(op) -> Optional[tuple]:
    """``(linear, bias)`` of a ForwardLinearBiasActivation without activation (the
    TransformerEngine fusion of ``[BasicLinear, Bias]``), which a later fusion may extend; else
    None."""
    if type(op) is ForwardLinearBiasActivation and op._activation is None:
        return op._ops
    return None


def fuse_forward_linear_bias_activation(ops: list, *, recipe=None) -> list:
    """``[BasicLinear, Bias]`` with an fp16/bf16 weight, as TransformerEngine (which fuses no
    activation into the GEMM), where the GEMM can add the bias (``bias_fuses``); under any
    recipe or none."""

    def match(ops, i):
        if (i + 1 < len(ops) and _linear_ok(ops[i]) and type(ops[i + 1]) is Bias
                and ops[i].weight_dtype in (torch.float16, torch.bfloat16)
                and bias_fuses(ops[i], ops[i + 1])):
            return ForwardLinearBiasActivation(linear=ops[i], bias=ops[i + 1]), 2
        return None

    return fuse_windows(ops, match)


def _epilogue_activation(op) -> bool:
    return type(op) in EPILOGUE_ACTIVATIONS and not op.cache_quantized_input


def extend_forward_linear_bias_activation(ops: list, *, recipe=None) -> list:
    """The extension: ``[BasicLinear, Bias?, act?]`` in any float dtype, with the activations
    of EPILOGUE_ACTIVATIONS in the epilogue; a ``[BasicLinear, Bias]`` already fused without
    activation takes the activation after it. A Bias the GEMM cannot add (``bias_fuses``)
    stays out, and so does the activation after it. Not under a recipe."""
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
        bias = gemm_bias_at(ops, j, op)
        j += bias is not None
        act = ops[j] if j < len(ops) and _epilogue_activation(ops[j]) else None
        j += act is not None
        if bias is None and act is None:
            return None
        return ForwardLinearBiasActivation(linear=op, bias=bias, activation=act), j - i

    return fuse_windows(ops, match)
