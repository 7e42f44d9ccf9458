"""Bias: y = x + b, b broadcast over the leading dims."""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import torch

from .._common import (autocast_dtype, canonicalize_device, canonicalize_dtype, check_float_dtype,
                       check_numel, check_size, init_parameter, materialize_device)
from ... import _comm
from .. import _quantized
from ..op import BasicOperation, OperationContext

# the custom ops' OpOverloads (host cost: docs/architecture.md)
_bias_fwd = torch.ops.te_cpp.bias_fwd.default
_bias_bwd = torch.ops.te_cpp.bias_bwd.default


@dataclasses.dataclass
class BiasContext(OperationContext):
    """What Bias' backward reads besides its saved tensors (it saves none)."""

    #: the input's dtype, dx's dtype (None: dx is dy unchanged, as after a GEMM fusion)
    input_dtype: Optional[torch.dtype] = None
    #: the previous op's grad-output quantizer: dx is handed back already quantized
    grad_input_quantizer: Any = None


class Bias(BasicOperation):
    """Adds a learnable bias of shape ``(size,)`` to the last dim of the input.

    Args:
        size: number of features.
        device, dtype: of the bias parameter (defaults: torch's default device and dtype).
        tensor_parallel, tensor_parallel_group: with ``tensor_parallel`` and a group of more
            than one rank (the default group when None), the bias is split along its features
            as a column-parallel linear's output: this rank holds ``size / group size``
            elements (``size`` must divide). Otherwise the whole bias.
    """

    accepts_forward_kwargs = False
    context_type = BiasContext

    def __init__(
        self,
        size: int,
        *,
        device: Optional[torch.device | str] = None,
        dtype: Optional[torch.dtype] = None,
        tensor_parallel: bool = False,
        tensor_parallel_group=None,
    ) -> None:
        super().__init__()
        size = check_size("Bias", "size", size)
        if not isinstance(tensor_parallel, bool):
            raise TypeError(f"Bias: tensor_parallel must be a bool, got {tensor_parallel!r}")
        tp_size = _comm.group_size("Bias", tensor_parallel_group) if tensor_parallel else 1
        if tp_size > 1 and size % tp_size != 0:
            raise ValueError(f"Bias: invalid configuration for tensor parallelism: size={size} "
                             f"is split over {tp_size} ranks, which does not divide it")
        self.tensor_parallel = tp_size > 1
        self.tensor_parallel_group = (_comm.resolve_group("Bias", tensor_parallel_group)
                                      if self.tensor_parallel else None)
        self.tensor_parallel_size = tp_size
        size //= tp_size
        self.local_size = size
        self.device = canonicalize_device(device)
        dtype = canonicalize_dtype(dtype)
        check_float_dtype("Bias", dtype)
        check_numel("Bias", "bias", (size,), dtype)
        self.bias = torch.nn.Parameter(torch.empty(size, device="meta", dtype=dtype))
        if self.device.type != "meta":
            self.reset_parameters()

    def reset_parameters(self) -> None:
        """Zero the bias, materialising it on ``self.device`` (or the default device, if the
        op was built on the meta device)."""
        self.device = materialize_device(self.device)
        init_parameter(self, "bias", torch.nn.init.zeros_, self.device)

    # deferred initialisation: parameters built on the meta device materialise on first use
    pre_fuser_forward = BasicOperation.materialize_meta_parameters

    @property
    def bias_dtype(self) -> torch.dtype:
        """The bias parameter's dtype (for the fusion functions' plan-time checks)."""
        return self._parameters["bias"].dtype

    def op_forward(
        self,
        ctx: BiasContext,
        input_: torch.Tensor,
        *,
        prev_op_grad_output_quantizer=None,
        next_op_input_quantizer=None,
        **kwargs,
    ) -> torch.Tensor:
        ctx.input_dtype = input_.dtype
        ctx.grad_input_quantizer = prev_op_grad_output_quantizer
        dtype = autocast_dtype(input_, None)
        if dtype is None:  # no autocast: the input and bias dtypes promote
            return _bias_fwd(input_, self._parameters["bias"])
        return _bias_fwd(input_.to(dtype), self.bias_in(dtype))

    def fused_forward_operands(self, ctx: BiasContext, input_: torch.Tensor,
                               prev_op_grad_output_quantizer=None):
        """For a forward fusion of this op with the op after it (ForwardBiasActivation): the
        input and the bias as this op's forward adds them (cast to the autocast dtype under
        autocast, else as they are, for the kernel to promote), its context filled as that
        forward fills it."""
        ctx.input_dtype = input_.dtype
        ctx.grad_input_quantizer = prev_op_grad_output_quantizer
        dtype = autocast_dtype(input_, None)
        if dtype is None:
            return input_, self._parameters["bias"]
        return input_.to(dtype), self.bias_in(dtype)

    def gemm_bias(self, ctx: BiasContext, dtype: torch.dtype) -> torch.Tensor:
        """For a forward fusion that adds the bias inside the GEMM of the linear before it: the
        bias in the GEMM's ``dtype``. The context keeps its defaults, which is what the backward
        then needs: dx is dy unchanged (the plan fuses only a bias whose output has the GEMM's
        dtype) and is handed on unquantized (the linear before it is in the fusion)."""
        del ctx
        bias = self._parameters["bias"]
        return bias if bias.dtype == dtype else bias.to(dtype)

    def bias_grad_required(self, ctx: BiasContext) -> bool:
        """Whether the backward computes dbias: the op is reached and the bias is trained."""
        return ctx.requires_grad and self._parameters["bias"].requires_grad

    def bias_grad(self, grad_output: torch.Tensor) -> torch.Tensor:
        """dbias: dy summed over its leading dims, in the bias' dtype."""
        return _bias_bwd(grad_output, self._parameters["bias"].dtype)

    def input_grad(self, ctx: BiasContext, grad_output: torch.Tensor):
        """dx = dy, a pass-through, never routed through a custom op: only cast back to the
        input's dtype where autocast or promotion changed it and the forward recorded it, and
        handed back quantized where the forward recorded the previous op's grad quantizer."""
        dx = grad_output
        input_dtype = ctx.input_dtype
        if input_dtype is not None and dx.dtype != input_dtype:
            dx = dx.to(input_dtype)
        return _quantized.emit(dx, ctx.grad_input_quantizer)

    def bias_in(self, dtype: torch.dtype) -> torch.Tensor:
        """The bias in ``dtype``."""
        bias = self._parameters["bias"]
        return bias if bias.dtype == dtype else bias.to(dtype)

    def op_backward(self, ctx: BiasContext, grad_output: torch.Tensor):
        db = self.bias_grad(grad_output) if self.bias_grad_required(ctx) else None
        return self.input_grad(ctx, grad_output), (db,)
