"""The MakeExtraOutput op: returns its input also as an extra output (the residual)."""

from __future__ import annotations

import torch

from .._common import _check_in_place, is_compiling
from ..op import BasicOperation


class MakeExtraOutput(BasicOperation):
    """Returns x as the main output and as an extra output; dx = dy + d(extra).

    Args:
        in_place: accumulate dy into the extra output's gradient buffer in backward (eager mode
            only) and return that buffer as dx.

    With ``in_place=True`` TransformerEngine writes into the caller's buffers; here that happens
    in eager mode only, and under ``torch.compile`` the same values come from the functional
    form (in-place writes inside the traced pipeline are unsafe on torch 2.11, see
    docs/architecture.md).
    """

    accepts_forward_kwargs = False

    num_extra_outputs = 1

    def __init__(self, *, in_place: bool = False) -> None:
        super().__init__()
        self._in_place = _check_in_place("MakeExtraOutput", in_place)

    @property
    def in_place(self) -> bool:
        """The constructor's ``in_place`` (for the fusion functions' plan-time checks)."""
        return self._in_place

    def in_place_grad_extra_outputs(self) -> tuple:
        return (0,) if self._in_place else ()

    def op_forward(self, *args, **kwargs):
        raise RuntimeError("MakeExtraOutput runs through fuser_forward")

    def op_backward(self, *args, **kwargs):
        raise RuntimeError("MakeExtraOutput runs through fuser_backward")

    def fuser_forward(self, basic_op_ctxs, input_, *, basic_op_extra_inputs, basic_op_kwargs,
                      **unused):
        return input_, [(input_,)]

    def fuser_backward(self, basic_op_ctxs, grad_output, *, basic_op_grad_extra_outputs):
        grad_extra = basic_op_grad_extra_outputs[0][0]
        if grad_extra is None:
            return grad_output, [()], [()]
        writable = basic_op_ctxs[0].writable_grad_extra_outputs
        if (self._in_place and not is_compiling() and writable and writable[0]
                and grad_extra is not grad_output
                and grad_extra.is_contiguous() and grad_extra.shape == grad_output.shape):
            torch.ops.te_cpp.make_extra_output_bwd_inplace.default(grad_extra, grad_output)
            torch.autograd.graph.increment_version(grad_extra)
            return grad_extra, [()], [()]
        return torch.ops.te_cpp.make_extra_output_bwd.default(grad_output, grad_extra), [()], [()]

    def extra_repr(self) -> str:
        return f"in_place={self._in_place}"
