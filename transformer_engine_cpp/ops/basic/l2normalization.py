"""L2Normalization: y = x * rsqrt(sum(x^2 over the last dim) + eps)."""

from __future__ import annotations

import math
from typing import Optional

import torch

from .._common import check_size
from ..op import BasicOperation, OperationContext


def _check_optional_positive_int(name: str, value) -> Optional[int]:
    return check_size("L2Normalization", name, value, optional=True)


class L2Normalization(BasicOperation):
    """Normalizes each row (the last dim) to unit L2 norm: ``y = x * rsqrt(sum(x^2) + eps)``.

    No parameters. Forward calls ``torch.ops.te_cpp.l2normalization_fwd(x, eps) -> (y,
    rsqrt_norm)`` and saves ``(x, rsqrt_norm)``; backward calls
    ``l2normalization_bwd(dy, x, rsqrt_norm)``.

    Args:
        eps: added to the sum of squares (finite, >= 0).
        seq_length, micro_batch_size: accepted for API compatibility (positive ints or None).
            TransformerEngine uses them to warm up its JIT-compiled kernels; they have no
            effect here.
    """

    accepts_forward_kwargs = False

    def __init__(
        self,
        *,
        eps: float = 1e-6,
        seq_length: Optional[int] = None,
        micro_batch_size: Optional[int] = None,
    ) -> None:
        super().__init__()
        if (isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps)
                or eps < 0):
            raise ValueError(f"L2Normalization: eps must be a finite number >= 0, got {eps!r}")
        self.eps = float(eps)
        self.seq_length = _check_optional_positive_int("seq_length", seq_length)
        self.micro_batch_size = _check_optional_positive_int("micro_batch_size", micro_batch_size)

    def op_forward(
        self,
        ctx: OperationContext,
        input_: torch.Tensor,
        *,
        prev_op_grad_output_quantizer=None,
        next_op_input_quantizer=None,
        **kwargs,
    ) -> torch.Tensor:
        y, rsqrt_norm = torch.ops.te_cpp.l2normalization_fwd.default(input_, self.eps)
        if ctx.requires_grad:
            ctx.save_for_backward(input_, rsqrt_norm)
        return y

    def op_backward(self, ctx: OperationContext, grad_output: torch.Tensor):
        x, rsqrt_norm = ctx.saved_tensors
        return torch.ops.te_cpp.l2normalization_bwd.default(grad_output, x, rsqrt_norm), ()

    def extra_repr(self) -> str:
        return f"eps={self.eps}"
