"""The AddExtraInput op: adds an extra input (the residual) to the main input."""

from __future__ import annotations

import torch

from .._common import _check_in_place, is_compiling
from ..op import BasicOperation


class AddExtraInput(BasicOperation):
    """y = x + extra. The gradient of both x and extra is dy.

    Args:
        in_place: write the sum into the extra input's buffer (eager mode only) and return it,
            in the extra input's dtype.

    With ``in_place=True`` TransformerEngine writes into the caller's buffers; here that happens
    in eager mode only, and under ``torch.compile`` the same values come from the functional
    form (in-place writes inside the traced pipeline are unsafe on torch 2.11, see
    docs/architecture.md).
    """

    accepts_forward_kwargs = False

    num_extra_inputs = 1

    def __init__(self, *, in_place: bool = False) -> None:
        super().__init__()
        self._in_place = _check_in_place("AddExtraInput", in_place)

    @property
    def in_place(self) -> bool:
        """The constructor's ``in_place`` (for the fusion functions' plan-time checks)."""
        return self._in_place

    def in_place_extra_inputs(self) -> tuple:
        return (0,) if self._in_place else ()

    def op_forward(self, *args, **kwargs):
        raise RuntimeError("AddExtraInput runs through fuser_forward")

    def op_backward(self, *args, **kwargs):
        raise RuntimeError("AddExtraInput runs through fuser_backward")

    def fuser_forward(self, basic_op_ctxs, input_, *, basic_op_extra_inputs, basic_op_kwargs,
                      **unused):
        extra = basic_op_extra_inputs[0][0]
        if self._in_place and not is_compiling():
            out = extra.detach()
            torch.ops.te_cpp.add_extra_input_fwd_inplace.default(out, input_)
            # Let autograd see the write (the custom op has no ADInplaceOrView kernel): a
            # tensor saved earlier from this buffer then fails loudly in backward.
            torch.autograd.graph.increment_version(out)
        else:
            out = torch.ops.te_cpp.add_extra_input_fwd.default(input_, extra)
            if self._in_place and out.dtype != extra.dtype:
                out = out.to(extra.dtype)
        return out, [()]

    def fuser_backward(self, basic_op_ctxs, grad_output, *, basic_op_grad_extra_outputs):
        # Both branches get dy unchanged (pass-through, decided here in Python).
        return grad_output, [()], [(grad_output,)]

    def extra_repr(self) -> str:
        return f"in_place={self._in_place}"
