"""The activation ops (unary, gated, ScaledSReLU) and the base classes of every activation."""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import torch

from ...quantization.tensor import QuantizedTensorStorage
from .. import _quantized
from .._common import INT64_MAX, autocast_dtype, check_size
from ..op import BasicOperation, OperationContext


def _cache_quantizer():
    from ...quantization import Float8CurrentScalingQuantizer  # noqa: PLC0415

    return Float8CurrentScalingQuantizer(torch.float8_e4m3fn)


@dataclasses.dataclass
class ActivationContext(OperationContext):
    """What an activation's backward reads besides its saved tensors."""

    #: the input's dtype, dx's dtype
    input_dtype: Optional[torch.dtype] = None
    #: the previous op's grad-output quantizer: dx is handed back already quantized
    grad_input_quantizer: Any = None
    #: with cache_quantized_input: the saved FP8 buffers' (meta, dtype); None: saved as is
    cached_quantized: Optional[tuple] = None
    #: True when a fusion with the Bias before it saved (x, bias) instead of the input
    bias_input: bool = False


class _ActivationOperation(BasicOperation):
    """Base of the activations: declares the custom ops and their extra arguments.

    Each activation class declares its kernels once, as class attributes; the fusion tables
    (ops/fused) and the tests' activation lists are computed from them through
    ``ops.basic.ACTIVATIONS``, and tests/test_activation_table.py checks the C++ kernels and
    docs/ops.md's activation table against them:

    * ``op_stem``: the name shared with the C++ half. The op calls
      ``torch.ops.te_cpp.<stem>_fwd`` forward and ``<stem>_bwd`` backward, the fused kernels
      below take the activation as ``<stem>``, and its float64 reference is
      ``testing.reference.<stem>``;
    * ``gated``: y = act(a) * lin(b) over the two halves of the last dim (set by
      :class:`_GatedActivation`);
    * the fused kernels that take it, each enabling one fusion: ``fuses_linear_bias_act``
      (``linear_bias_act_fwd``, the GEMM epilogue of ForwardLinearBiasActivation),
      ``fuses_bias_act`` (``bias_act_fwd``, ForwardBiasActivation) and ``fuses_dbias_dact``
      (``dbias_d<stem>``, BackwardActivationBias).

    Subclasses may override :meth:`_op_args` with the op's configuration arguments. Each op
    saves its input.
    """

    accepts_forward_kwargs = False
    context_type = ActivationContext

    op_stem: str = ""
    gated: bool = False
    fuses_linear_bias_act: bool = False
    fuses_bias_act: bool = False
    fuses_dbias_dact: bool = False

    def __init__(self, *, cache_quantized_input: bool = False) -> None:
        super().__init__()
        if not isinstance(cache_quantized_input, bool):
            raise TypeError(
                f"{self.__class__.__name__}: cache_quantized_input must be a bool, got "
                f"{type(cache_quantized_input).__name__}"
            )
        self.cache_quantized_input = cache_quantized_input
        # this activation's forward and backward OpOverloads
        self._fwd_op = getattr(torch.ops.te_cpp, f"{self.op_stem}_fwd").default
        self._bwd_op = getattr(torch.ops.te_cpp, f"{self.op_stem}_bwd").default

    def _op_args(self) -> tuple:
        return ()

    def op_forward(
        self,
        ctx: ActivationContext,
        input_: torch.Tensor,
        *,
        prev_op_grad_output_quantizer=None,
        next_op_input_quantizer=None,
        **kwargs,
    ) -> torch.Tensor:
        x = self.cast_input(ctx, input_)
        ctx.grad_input_quantizer = prev_op_grad_output_quantizer
        if self.cache_quantized_input:
            # as TransformerEngine: x is FP8-quantized (current scaling, E4M3) first; the forward
            # uses those values and the backward keeps only the FP8 buffers
            xq = _cache_quantizer().quantize_storage(x)
            ctx.cached_quantized = (xq.metadata(), x.dtype)
            x = xq.dequantize_rowwise(x.dtype)
            if ctx.requires_grad:
                ctx.save_for_backward(*xq.buffers())
        elif ctx.requires_grad:
            ctx.save_for_backward(x)
        return _quantized.emit(self._fwd_op(x, *self._op_args()), next_op_input_quantizer)

    def save_bias_input(self, ctx: ActivationContext, x: torch.Tensor, bias: torch.Tensor,
                        dtype: torch.dtype) -> None:
        """For a forward fusion with the Bias before this op (ForwardBiasActivation): this op's
        input z = x + bias (in ``dtype``) was never stored; the context keeps x and bias and the
        backward recomputes z, rounded as bias_fwd rounds it. (No grad-input quantizer: the
        Bias before it is in the fusion.)"""
        ctx.input_dtype = dtype
        if ctx.requires_grad:
            ctx.bias_input = True
            ctx.save_for_backward(x, bias)

    def save_fused_input(self, ctx: ActivationContext, act_input: torch.Tensor) -> None:
        """For a forward fusion that computed this op's input and output
        (ForwardLinearBiasActivation's epilogue): the context as this op's forward would fill
        it, with ``act_input`` saved as its input (no grad-input quantizer: the op before it is
        in the fusion)."""
        ctx.input_dtype = act_input.dtype
        if ctx.requires_grad:
            ctx.save_for_backward(act_input)

    def saved_operands(self, ctx: ActivationContext):
        """(x, bias): with ``bias`` None, x is the activation's input as saved in forward
        (dequantized if it was cached in FP8); otherwise the input is x + bias, recomputed by
        the caller (see :meth:`save_bias_input`)."""
        if ctx.bias_input:
            x, bias = ctx.saved_tensors
            return x, bias
        cached = ctx.cached_quantized
        if cached is None:
            return ctx.saved_tensors[0], None
        meta, dtype = cached
        return (QuantizedTensorStorage.from_buffers(ctx.saved_tensors, meta)
                .dequantize_rowwise(dtype), None)

    def saved_input(self, ctx: ActivationContext) -> torch.Tensor:
        """The activation's input as saved in forward (dequantized if it was cached in FP8;
        recomputed as x + bias if its Bias was fused into the forward)."""
        x, bias = self.saved_operands(ctx)
        return x if bias is None else torch.ops.te_cpp.bias_fwd.default(x, bias)

    def cast_input(self, ctx: ActivationContext, input_: torch.Tensor) -> torch.Tensor:
        """The input in the compute dtype (the autocast dtype when autocast is on, else the
        input's own), recording the input dtype for the backward."""
        ctx.input_dtype = input_.dtype
        dtype = autocast_dtype(input_, input_.dtype)
        return input_ if input_.dtype == dtype else input_.to(dtype)

    def op_backward(self, ctx: ActivationContext, grad_output: torch.Tensor):
        x = self.saved_input(ctx)
        dx = self._bwd_op(grad_output, x, *self._op_args())
        dx = dx if dx.dtype == ctx.input_dtype else dx.to(ctx.input_dtype)
        return _quantized.emit(dx, ctx.grad_input_quantizer), ()


class GELU(_ActivationOperation):
    """GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""

    op_stem = "gelu"
    fuses_linear_bias_act = fuses_bias_act = fuses_dbias_dact = True


class ReLU(_ActivationOperation):
    """max(x, 0)."""

    op_stem = "relu"
    fuses_linear_bias_act = fuses_bias_act = fuses_dbias_dact = True


class SiLU(_ActivationOperation):
    """x * sigmoid(x)."""

    op_stem = "silu"
    fuses_linear_bias_act = fuses_bias_act = fuses_dbias_dact = True


class QGELU(_ActivationOperation):
    """Quick GELU: x * sigmoid(1.702 x)."""

    op_stem = "qgelu"
    fuses_linear_bias_act = fuses_bias_act = fuses_dbias_dact = True


class SReLU(_ActivationOperation):
    """Squared ReLU: max(x, 0)^2."""

    op_stem = "srelu"
    fuses_linear_bias_act = fuses_bias_act = fuses_dbias_dact = True


def _check_interleave(op: str, size: Optional[int]) -> int:
    """glu_interleave_size as the ops' int argument (0 for None); the ops read blocks of
    2 * size features, which must fit in int64."""
    size = check_size(op, "glu_interleave_size", size, optional=True, maximum=INT64_MAX // 2,
                      limit_reason="2 * glu_interleave_size must fit in int64")
    return 0 if size is None else size


class _GatedActivation(_ActivationOperation):
    """Gated activation y = act(a) * lin(b), (a, b) the halves of the last dim (or, with
    ``glu_interleave_size=s``, alternating runs of s features).

    TransformerEngine's convention: the activation applies to the *first* half, y = act(a) * b
    (the opposite of ``torch.nn.functional.glu``).
    """

    gated = True

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

    op_stem = "glu"

    def __init__(self, *, cache_quantized_input: bool = False) -> None:
        super().__init__(cache_quantized_input=cache_quantized_input)


class GEGLU(_GatedActivation):
    """gelu_tanh(a) * b."""

    op_stem = "geglu"

    def __init__(self, *, cache_quantized_input: bool = False) -> None:
        super().__init__(cache_quantized_input=cache_quantized_input)


class QGEGLU(_GatedActivation):
    """a * sigmoid(1.702 a) * b."""

    op_stem = "qgeglu"

    def __init__(self, *, cache_quantized_input: bool = False) -> None:
        super().__init__(cache_quantized_input=cache_quantized_input)


class ReGLU(_GatedActivation):
    """relu(a) * b."""

    op_stem = "reglu"

    def __init__(self, *, cache_quantized_input: bool = False) -> None:
        super().__init__(cache_quantized_input=cache_quantized_input)


class SReGLU(_GatedActivation):
    """relu(a)^2 * b."""

    op_stem = "sreglu"

    def __init__(self, *, cache_quantized_input: bool = False) -> None:
        super().__init__(cache_quantized_input=cache_quantized_input)


def _check_bool(op: str, name: str, value) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{op}: {name} must be a bool, got {type(value).__name__}")
    return value


@dataclasses.dataclass
class ScaledActivationContext(OperationContext):
    """What a scaled activation's backward reads besides its saved (x, scales)."""

    #: whether the scales needed a gradient in the forward pass (d(scales) is computed then)
    scales_requires_grad: bool = False


class _ScaledActivation(BasicOperation):
    """Base of the scaled activations: ``torch.ops.te_cpp.<stem>_fwd(x, scales, *args)``
    forward and ``<stem>_bwd(dy, x, scales, compute_dscales, *args) -> (dx, dscales)``
    backward, where ``args`` is :meth:`_op_args` and ``op_stem`` is ``scaled_<name>`` (also
    the name of the float64 reference). ``gated`` as for :class:`_ActivationOperation`; no
    fused kernel takes a scaled activation.

    A scaled activation multiplies its output rows by per-row scales,
    ``y = scales[..., None] * act(x)`` (the middle op of TransformerEngine's grouped MLP).
    ``scales`` is the op's one extra input, of shape ``x.shape[:-1]``. The ops save
    ``(x, scales)`` and, in backward, return ``dx`` and ``d(scales)``; ``d(scales)`` is computed
    only when ``scales`` required grad in the forward pass (recorded on the op context there,
    never read from the gradients).
    """

    accepts_forward_kwargs = False
    context_type = ScaledActivationContext

    num_extra_inputs = 1
    op_stem: str = ""
    gated: bool = False
    fuses_linear_bias_act = fuses_bias_act = fuses_dbias_dact = False

    def __init__(self, *, activation_recompute_in_mlp: bool = False) -> None:
        super().__init__()
        self.activation_recompute_in_mlp = _check_bool(
            self.__class__.__name__, "activation_recompute_in_mlp", activation_recompute_in_mlp
        )
        self._fwd_op = getattr(torch.ops.te_cpp, f"{self.op_stem}_fwd")
        self._bwd_op = getattr(torch.ops.te_cpp, f"{self.op_stem}_bwd")

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
                f"{name}(activation_recompute_in_mlp=True) needs the fused grouped MLP path "
                "(GroupedMLP: between two GroupedLinear ops whose features match)"
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

    gated = True

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


class ScaledSReLU(_ScaledActivation):
    """``scales[..., None] * max(x, 0)^2``.

    ``activation_recompute_in_mlp=True`` is accepted as configuration (as in
    TransformerEngine) but running the op then raises RuntimeError: recomputation needs the
    fused grouped MLP path.
    """

    op_stem = "scaled_srelu"
