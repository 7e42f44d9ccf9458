"""Activations: unary (GELU, ReLU, SiLU, QGELU, SReLU) and gated (GLU, GEGLU, QGEGLU, ReGLU,
SReGLU, SwiGLU, ClampedSwiGLU, SiTUGLU).

Gated activations follow the anchor's convention: the last dim is split into halves (a, b) and
the activation applies to the *first* half, y = act(a) * b (the opposite of
``torch.nn.functional.glu``). Each op saves its input and calls ``torch.ops.te_cpp.<name>_fwd``
forward and ``torch.ops.te_cpp.<name>_bwd`` backward.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from ...quantization.tensor import QuantizedTensorStorage
from .. import _quantized
from .._common import INT64_MAX, autocast_dtype, check_size
from ..op import BasicOperation, OperationContext


def _cache_quantizer():
    from ...quantization import Float8CurrentScalingQuantizer  # noqa: PLC0415

    return Float8CurrentScalingQuantizer(torch.float8_e4m3fn)


class _ActivationOperation(BasicOperation):
    """Base of the activations: declares the custom ops and their extra arguments.

    Subclasses set ``_op_stem`` (``torch.ops.te_cpp.<stem>_fwd`` / ``_bwd``) and may override
    :meth:`_op_args` with the op's configuration arguments.
    """

    accepts_forward_kwargs = False

    _op_stem: str = ""

    def __init__(self, *, cache_quantized_input: bool = False) -> None:
        super().__init__()
        if not isinstance(cache_quantized_input, bool):
            raise TypeError(
                f"{self.__class__.__name__}: cache_quantized_input must be a bool, got "
                f"{type(cache_quantized_input).__name__}"
            )
        self.cache_quantized_input = cache_quantized_input
        # the OpOverloads (a packet call resolves the overload on every call)
        self._fwd_op = getattr(torch.ops.te_cpp, f"{self._op_stem}_fwd").default
        self._bwd_op = getattr(torch.ops.te_cpp, f"{self._op_stem}_bwd").default

    def _op_args(self) -> tuple:
        return ()

    def op_forward(
        self,
        ctx: OperationContext,
        input_: torch.Tensor,
        *,
        prev_op_grad_output_quantizer=None,
        next_op_input_quantizer=None,
        **kwargs,
    ) -> torch.Tensor:
        x = self.cast_input(ctx, input_)
        ctx.grad_input_quantizer = prev_op_grad_output_quantizer
        ctx.cached_quantized = None
        ctx.bias_input = False
        if self.cache_quantized_input:
            # as the anchor: x is FP8-quantized (current scaling, E4M3) first; the forward
            # uses those values and the backward keeps only the FP8 buffers
            xq = _cache_quantizer().quantize_storage(x)
            ctx.cached_quantized = (xq.metadata(), x.dtype)
            x = xq.dequantize_rowwise(x.dtype)
            if ctx.requires_grad:
                ctx.save_for_backward(*xq.buffers())
        elif ctx.requires_grad:
            ctx.save_for_backward(x)
        return _quantized.emit(self._fwd_op(x, *self._op_args()), next_op_input_quantizer)

    def save_bias_input(self, ctx: OperationContext, x: torch.Tensor, bias: torch.Tensor,
                        dtype: torch.dtype) -> None:
        """For a forward fusion with the Bias before this op (ForwardBiasActivation): this op's
        input z = x + bias (in ``dtype``) was never stored; the context keeps x and bias and the
        backward recomputes z, rounded as bias_fwd rounds it."""
        ctx.input_dtype = dtype
        ctx.grad_input_quantizer = None  # the Bias before it is in the fusion
        ctx.cached_quantized = None
        ctx.bias_input = ctx.requires_grad
        if ctx.requires_grad:
            ctx.save_for_backward(x, bias)

    def saved_operands(self, ctx: OperationContext):
        """(x, bias): with ``bias`` None, x is the activation's input as saved in forward
        (dequantized if it was cached in FP8); otherwise the input is x + bias, recomputed by
        the caller (see :meth:`save_bias_input`)."""
        if getattr(ctx, "bias_input", False):  # fused forwards may not set it
            x, bias = ctx.saved_tensors
            return x, bias
        cached = getattr(ctx, "cached_quantized", None)  # fused forwards may not set it
        if cached is None:
            return ctx.saved_tensors[0], None
        meta, dtype = cached
        return (QuantizedTensorStorage.from_buffers(ctx.saved_tensors, meta)
                .dequantize_rowwise(dtype), None)

    def saved_input(self, ctx: OperationContext) -> torch.Tensor:
        """The activation's input as saved in forward (dequantized if it was cached in FP8;
        recomputed as x + bias if its Bias was fused into the forward)."""
        x, bias = self.saved_operands(ctx)
        return x if bias is None else torch.ops.te_cpp.bias_fwd.default(x, bias)

    def cast_input(self, ctx: OperationContext, input_: torch.Tensor) -> torch.Tensor:
        """The input in the compute dtype (the autocast dtype when autocast is on, else the
        input's own), recording the input dtype for the backward."""
        input_ = _quantized.as_high_precision(input_)
        ctx.input_dtype = input_.dtype
        dtype = autocast_dtype(input_, input_.dtype)
        return input_ if input_.dtype == dtype else input_.to(dtype)

    def op_backward(self, ctx: OperationContext, grad_output: torch.Tensor):
        x = self.saved_input(ctx)
        dx = self._bwd_op(grad_output, x, *self._op_args())
        dx = dx if dx.dtype == ctx.input_dtype else dx.to(ctx.input_dtype)
        return _quantized.emit(dx, getattr(ctx, "grad_input_quantizer", None)), ()


class GELU(_ActivationOperation):
    """GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""

    _op_stem = "gelu"


class ReLU(_ActivationOperation):
    """max(x, 0)."""

    _op_stem = "relu"


class SiLU(_ActivationOperation):
    """x * sigmoid(x)."""

    _op_stem = "silu"


class QGELU(_ActivationOperation):
    """Quick GELU: x * sigmoid(1.702 x)."""

    _op_stem = "qgelu"


class SReLU(_ActivationOperation):
    """Squared ReLU: max(x, 0)^2."""

    _op_stem = "srelu"


def _check_interleave(op: str, size: Optional[int]) -> int:
    """glu_interleave_size as the ops' int argument (0 for None); the ops read blocks of
    2 * size features, which must fit in int64."""
    size = check_size(op, "glu_interleave_size", size, optional=True, maximum=INT64_MAX // 2,
                      limit_reason="2 * glu_interleave_size must fit in int64")
    return 0 if size is None else size


class _GatedActivation(_ActivationOperation):
    """Gated activation y = act(a) * lin(b), (a, b) the halves of the last dim (or, with
    ``glu_interleave_size=s``, alternating runs of s features)."""

    def __init__(
        self, *, cache_quantized_input: bool = False, glu_interleave_size: Optional[int] = None
    ) -> None:
        super().__init__(cache_quantized_input=cache_quantized_input)
        self.glu_interleave_size = glu_interleave_size
        self._interleave = _check_interleave(self.__class__.__name__, glu_interleave_size)

    def _op_args(self) -> tuple:
        return (self._interleave,)


class GLU(_GatedActivation):
    """sigmoid(a) * b."""

    _op_stem = "glu"

    def __init__(self, *, cache_quantized_input: bool = False) -> None:
        super().__init__(cache_quantized_input=cache_quantized_input)


class GEGLU(_GatedActivation):
    """gelu_tanh(a) * b."""

    _op_stem = "geglu"

    def __init__(self, *, cache_quantized_input: bool = False) -> None:
        super().__init__(cache_quantized_input=cache_quantized_input)


class QGEGLU(_GatedActivation):
    """a * sigmoid(1.702 a) * b."""

    _op_stem = "qgeglu"

    def __init__(self, *, cache_quantized_input: bool = False) -> None:
        super().__init__(cache_quantized_input=cache_quantized_input)


class ReGLU(_GatedActivation):
    """relu(a) * b."""

    _op_stem = "reglu"

    def __init__(self, *, cache_quantized_input: bool = False) -> None:
        super().__init__(cache_quantized_input=cache_quantized_input)


class SReGLU(_GatedActivation):
    """relu(a)^2 * b."""

    _op_stem = "sreglu"

    def __init__(self, *, cache_quantized_input: bool = False) -> None:
        super().__init__(cache_quantized_input=cache_quantized_input)


class SwiGLU(_GatedActivation):
    """silu(a) * b, with optional ``glu_interleave_size``."""

    _op_stem = "swiglu"


class ClampedSwiGLU(_GatedActivation):
    """GPT-OSS SwiGLU: a' = min(a, limit), b' = clamp(b, -limit, limit),
    y = a' * sigmoid(alpha a') * (b' + glu_linear_offset)."""

    _op_stem = "clamped_swiglu"

    def __init__(
        self,
        *,
        limit: float = 7.0,
        alpha: float = 1.702,
        glu_linear_offset: float = 1.0,
        cache_quantized_input: bool = False,
        glu_interleave_size: Optional[int] = None,
    ) -> None:
        for name, value in (("limit", limit), ("alpha", alpha),
                            ("glu_linear_offset", glu_linear_offset)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"ClampedSwiGLU: {name} must be a finite number, got {value!r}")
        if limit <= 0:
            raise ValueError(f"ClampedSwiGLU: limit must be > 0, got {limit!r}")
        super().__init__(cache_quantized_input=cache_quantized_input,
                         glu_interleave_size=glu_interleave_size)
        self.limit = float(limit)
        self.alpha = float(alpha)
        self.glu_linear_offset = float(glu_linear_offset)

    def _op_args(self) -> tuple:
        return (self.limit, self.alpha, self.glu_linear_offset, self._interleave)


class SiTUGLU(_GatedActivation):
    """beta1 tanh(a / beta1) sigmoid(a) * beta2 tanh(b / beta2)."""

    _op_stem = "situglu"

    def __init__(
        self,
        *,
        beta1: float = 4.0,
        beta2: float = 25.0,
        cache_quantized_input: bool = False,
        glu_interleave_size: Optional[int] = None,
    ) -> None:
        for name, value in (("beta1", beta1), ("beta2", beta2)):
            if (isinstance(value, bool) or not isinstance(value, (int, float))
                    or not math.isfinite(value) or value <= 0):
                raise ValueError(f"SiTUGLU: {name} must be finite and > 0, got {value!r}")
        super().__init__(cache_quantized_input=cache_quantized_input,
                         glu_interleave_size=glu_interleave_size)
        self.beta1 = float(beta1)
        self.beta2 = float(beta2)

    def _op_args(self) -> tuple:
        return (self.beta1, self.beta2, self._interleave)
