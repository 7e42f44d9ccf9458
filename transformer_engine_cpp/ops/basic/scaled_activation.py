"""Scaled activations: an activation whose output rows are multiplied by per-row scales,
``y = scales[..., None] * act(x)`` (the middle op of the anchor's grouped MLP).

``scales`` is the op's one extra input, of shape ``x.shape[:-1]``. The ops save ``(x, scales)``
and, in backward, return ``dx`` and ``d(scales)``; ``d(scales)`` is computed only when
``scales`` required grad in the forward pass (recorded on the op context there, never read from
the gradients).
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from ..op import BasicOperation, OperationContext
from .activation import _check_interleave


def _check_bool(op: str, name: str, value) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{op}: {name} must be a bool, got {type(value).__name__}")
    return value


class _ScaledActivation(BasicOperation):
    """Base of the scaled activations: ``torch.ops.te_cpp.scaled_<stem>_fwd(x, scales, *args)``
    forward and ``scaled_<stem>_bwd(dy, x, scales, compute_dscales, *args) -> (dx, dscales)``
    backward, where ``args`` is :meth:`_op_args`."""

    accepts_forward_kwargs = False

    num_extra_inputs = 1
    _op_stem: str = ""

    def __init__(self, *, activation_recompute_in_mlp: bool = False) -> None:
        super().__init__()
        self.activation_recompute_in_mlp = _check_bool(
            self.__class__.__name__, "activation_recompute_in_mlp", activation_recompute_in_mlp
        )
        self._fwd_op = getattr(torch.ops.te_cpp, f"scaled_{self._op_stem}_fwd")
        self._bwd_op = getattr(torch.ops.te_cpp, f"scaled_{self._op_stem}_bwd")

    def _op_args(self) -> tuple:
        return ()

    def op_forward(self, *args, **kwargs):
        raise RuntimeError(f"{self.__class__.__name__} runs through fuser_forward (it has an "
                           "extra input, the scales)")

    def op_backward(self, *args, **kwargs):
        raise RuntimeError(f"{self.__class__.__name__} runs through fuser_backward (it has an "
                           "extra input, the scales)")

    def fuser_forward(self, basic_op_ctxs, input_, *, basic_op_extra_inputs, basic_op_kwargs,
                      **unused):
        name = self.__class__.__name__
        if self.activation_recompute_in_mlp:
            raise RuntimeError(
                f"{name}(activation_recompute_in_mlp=True) needs the fused grouped MLP path, "
                "which is not available"
            )
        scales = basic_op_extra_inputs[0][0]
        ctx = basic_op_ctxs[0]
        if ctx.requires_grad:
            # decided in forward by the fuser (a channel's tensor made inside the pipeline
            # does not carry requires_grad)
            ctx.scales_requires_grad = ctx.extra_inputs_requires_grad[0]
            ctx.save_for_backward(input_, scales)
        return self._fwd_op(input_, scales, *self._op_args()), [()]

    def fuser_backward(self, basic_op_ctxs, grad_output, *, basic_op_grad_extra_outputs):
        ctx = basic_op_ctxs[0]
        x, scales = ctx.saved_tensors
        compute_dscales = ctx.scales_requires_grad
        dx, dscales = self._bwd_op(grad_output, x, scales, compute_dscales, *self._op_args())
        return dx, [()], [(dscales if compute_dscales else None,)]


class _ScaledGatedActivation(_ScaledActivation):
    """Scaled gated activation: ``y = scales[..., None] * act(a) * lin(b)`` with the gated
    convention of :class:`~transformer_engine_cpp.ops.SwiGLU` (``glu_interleave_size``
    included). Activation recomputation (a fused grouped-MLP feature) is refused."""

    def __init__(
        self,
        glu_interleave_size: Optional[int] = None,
        *,
        activation_recompute_in_mlp: bool = False,
    ) -> None:
        name = self.__class__.__name__
        if _check_bool(name, "activation_recompute_in_mlp", activation_recompute_in_mlp):
            raise ValueError(
                f"{name} does not support activation recomputation "
                "(activation_recompute_in_mlp=True)"
            )
        super().__init__(activation_recompute_in_mlp=activation_recompute_in_mlp)
        self._interleave = _check_interleave(name, glu_interleave_size)
        self.glu_interleave_size = glu_interleave_size

    def _op_args(self) -> tuple:
        return (self._interleave,)


class ScaledSwiGLU(_ScaledGatedActivation):
    """``scales[..., None] * silu(a) * b``."""

    _op_stem = "swiglu"


class ScaledClampedQGeGLU(_ScaledGatedActivation):
    """Clamped quick-GEGLU with per-row scales, with :class:`ClampedSwiGLU`'s numerics (as in
    the anchor): ``a' = min(a, limit)``, ``b' = clamp(b, -limit, limit)``,
    ``y = scales[..., None] * a' * sigmoid(alpha a') * (b' + glu_linear_offset)``."""

    _op_stem = "clamped_qgeglu"

    def __init__(
        self,
        glu_interleave_size: Optional[int] = None,
        *,
        activation_recompute_in_mlp: bool = False,
        limit: float = 7.0,
        alpha: float = 1.702,
        glu_linear_offset: float = 1.0,
    ) -> None:
        for name, value in (("limit", limit), ("alpha", alpha),
                            ("glu_linear_offset", glu_linear_offset)):
            if (isinstance(value, bool) or not isinstance(value, (int, float))
                    or not math.isfinite(value)):
                raise ValueError(f"ScaledClampedQGeGLU: {name} must be a finite number, got "
                                 f"{value!r}")
        if limit <= 0:
            raise ValueError(f"ScaledClampedQGeGLU: limit must be > 0, got {limit!r}")
        super().__init__(glu_interleave_size,
                         activation_recompute_in_mlp=activation_recompute_in_mlp)
        self.limit = float(limit)
        self.alpha = float(alpha)
        self.glu_linear_offset = float(glu_linear_offset)

    def _op_args(self) -> tuple:
        return (self.limit, self.alpha, self.glu_linear_offset, self._interleave)


class ScaledSiTUGLU(_ScaledGatedActivation):
    """``scales[..., None] * beta1 tanh(a / beta1) sigmoid(a) * beta2 tanh(b / beta2)``."""

    _op_stem = "situglu"

    def __init__(
        self,
        glu_interleave_size: Optional[int] = None,
        *,
        activation_recompute_in_mlp: bool = False,
        beta1: float = 4.0,
        beta2: float = 25.0,
    ) -> None:
        for name, value in (("beta1", beta1), ("beta2", beta2)):
            if (isinstance(value, bool) or not isinstance(value, (int, float))
                    or not math.isfinite(value) or value <= 0):
                raise ValueError(f"ScaledSiTUGLU: {name} must be finite and > 0, got {value!r}")
        super().__init__(glu_interleave_size,
                         activation_recompute_in_mlp=activation_recompute_in_mlp)
        self.beta1 = float(beta1)
        self.beta2 = float(beta2)

    def _op_args(self) -> tuple:
        return (self.beta1, self.beta2, self._interleave)


class ScaledSReLU(_ScaledActivation):
    """``scales[..., None] * max(x, 0)^2``.

    ``activation_recompute_in_mlp=True`` is accepted as configuration (as in the anchor) but
    running the op then raises RuntimeError: recomputation needs the fused grouped MLP path.
    """

    _op_stem = "srelu"
