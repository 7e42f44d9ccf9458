"""The LayerNorm op."""

from __future__ import annotations

import torch

from .. import _quantized
from ._normalization import NormContext, _Norm

# the custom ops' OpOverloads, resolved once (calling torch.ops.te_cpp.<op> resolves the
# overload packet on every call)
_layernorm_fwd = torch.ops.te_cpp.layernorm_fwd.default
_layernorm_bwd = torch.ops.te_cpp.layernorm_bwd.default


class LayerNorm(_Norm):
    """y = (x - mean) / sqrt(var + eps) * weight + bias (weight -> 1 + weight with
    ``zero_centered_gamma``), over the trailing ``normalized_shape`` dims."""

    _has_bias = True

    def op_forward(self, ctx: NormContext, input_: torch.Tensor, *,
                   prev_op_grad_output_quantizer=None, next_op_input_quantizer=None, **kwargs):
        x, w = self._cast_inputs(ctx, input_, kwargs)
        bias = self._parameters["bias"]
        b = bias if bias.dtype == ctx.dtype else bias.to(ctx.dtype)
        y, mean, rstd = _layernorm_fwd(x, w, b, self.eps, self.zero_centered_gamma)
        if ctx.requires_grad:
            ctx.save_for_backward(x, mean, rstd, w)
            ctx.grads_needed = (self._parameters["weight"].requires_grad, bias.requires_grad)
        return _quantized.emit(y, next_op_input_quantizer)

    def op_backward(self, ctx: NormContext, grad_output: torch.Tensor):
        x, mean, rstd, w = ctx.saved_tensors
        dx, dw, db = _layernorm_bwd(grad_output, x, mean, rstd, w, self.zero_centered_gamma)
        if dx.dtype != ctx.input_dtype:
            dx = dx.to(ctx.input_dtype)
        params = self._parameters
        return dx, (self._param_grad(dw, params["weight"], ctx.grads_needed[0]),
                    self._param_grad(db, params["bias"], ctx.grads_needed[1]))
