"""The ForwardLinearScaleAdd fusion: a scaled BasicLinear accumulated into a residual."""

from __future__ import annotations

from ..basic import AddExtraInput, BasicLinear, ConstantScale
from ._linear import _linear_ok, add_fusion
from ._window import fuse_windows
from .forward_linear_bias_add import ForwardLinearBiasAdd


class ForwardLinearScaleAdd(ForwardLinearBiasAdd):
    """Forward-only fusion of BasicLinear, ConstantScale and AddExtraInput.

    ``[BasicLinear, ConstantScale, AddExtraInput]``: extra + s * x W^T, the scale as the GEMM's
    alpha.
    """

    def __init__(self, *, linear: BasicLinear, scale: ConstantScale, add: AddExtraInput):
        super().__init__(linear=linear, bias=None, add=add, scale=scale)


def _fuse_linear_scale_add(ops: list, in_place: bool) -> list:
    def match(ops, i):
        if (i + 2 < len(ops) and _linear_ok(ops[i]) and type(ops[i + 1]) is ConstantScale
                and type(ops[i + 2]) is AddExtraInput and ops[i + 2].in_place == in_place):
            return ForwardLinearScaleAdd(linear=ops[i], scale=ops[i + 1], add=ops[i + 2]), 3
        return None

    return fuse_windows(ops, match)


fuse_forward_linear_scale_add = add_fusion(
    _fuse_linear_scale_add, True, "fuse_forward_linear_scale_add",
    "``[BasicLinear, ConstantScale, AddExtraInput(in_place=True)]``, as TransformerEngine.")
extend_forward_linear_scale_add = add_fusion(
    _fuse_linear_scale_add, False, "extend_forward_linear_scale_add",
    "The same with the functional add (an extension).")
