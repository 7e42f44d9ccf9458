"""The RMSNorm op."""

from __future__ import annotations

from typing import Optional

import torch

from .. import _quantized
from ._normalization import NormContext, _Norm

# the custom ops' OpOverloads, resolved once (calling torch.ops.te_cpp.<op> resolves the
# overload packet on every call)
_rmsnorm_fwd = torch.ops.te_cpp.rmsnorm_fwd.default
_rmsnorm_bwd = torch.ops.te_cpp.rmsnorm_bwd.default
_rmsnorm_bwd_add = torch.ops.te_cpp.rmsnorm_bwd_add.default


class RMSNorm(_Norm):
    """y = x / sqrt(mean(x^2) + eps) * weight (weight -> 1 + weight with
    ``zero_centered_gamma``), over the trailing ``normalized_shape`` dims."""

    def op_forward(self, ctx: NormContext, input_: torch.Tensor, *,
                   prev_op_grad_output_quantizer=None, next_op_input_quantizer=None, **kwargs):
        x, w = self._cast_inputs(ctx, input_, kwargs)
        y, rstd = _rmsnorm_fwd(x, w, self.eps, self.zero_centered_gamma)
        if ctx.requires_grad:
            ctx.save_for_backward(x, rstd, w)
            ctx.grads_needed = (self._parameters["weight"].requires_grad,)
        return _quantized.emit(y, next_op_input_quantizer)

    def op_backward(self, ctx: NormContext, grad_output: torch.Tensor):
        return self.backward_with_extra(ctx, grad_output, None)

    def backward_with_extra(self, ctx: NormContext, grad_output: torch.Tensor,
                            grad_extra: Optional[torch.Tensor]):
        """Backward, optionally adding the gradient of a residual branch forked off the input
        (BackwardAddRMSNorm) in the same pass."""
        x, rstd, w = ctx.saved_tensors
        if grad_extra is None:
            dx, dw = _rmsnorm_bwd(grad_output, x, rstd, w, self.zero_centered_gamma)
        else:
            dx, dw = _rmsnorm_bwd_add(grad_output, x, rstd, w, self.zero_centered_gamma,
                                      grad_extra)
        if dx.dtype != ctx.input_dtype:
            dx = dx.to(ctx.input_dtype)
        return dx, (self._param_grad(dw, self._parameters["weight"], ctx.grads_needed[0]),)
