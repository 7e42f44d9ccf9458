"""The base class and argument checks shared by LayerNorm and RMSNorm."""

from __future__ import annotations

import dataclasses
import numbers
from typing import Iterable, Optional, Union

import torch

from .._common import (autocast_dtype, canonicalize_device, canonicalize_dtype, check_float_dtype,
                       check_numel, init_parameter, materialize_device)
from ..op import BasicOperation, OperationContext

SmMargin = Union[int, dict]


def _normalized_shape(op: str, shape) -> tuple[int, ...]:
    if isinstance(shape, numbers.Integral) and not isinstance(shape, bool):
        shape = (int(shape),)
    try:
        shape = tuple(shape)
    except TypeError:
        raise TypeError(f"{op}: normalized_shape must be an int or a sequence of ints, "
                        f"got {shape!r}") from None
    if not shape or not all(isinstance(d, numbers.Integral) and not isinstance(d, bool) and d > 0
                            for d in shape):
        raise ValueError(f"{op}: normalized_shape must be positive ints, got {shape!r}")
    return tuple(int(d) for d in shape)


def _check_sm_margin(op: str, sm_margin: SmMargin) -> None:
    """TransformerEngine's SM margin (an int, or a dict with forward/backward/inference keys): SMs
    left free for communication kernels. Validated; it has no effect on CPU."""
    values = sm_margin.values() if isinstance(sm_margin, dict) else [sm_margin]
    if isinstance(sm_margin, dict):
        unknown = set(sm_margin) - {"forward", "backward", "inference"}
        if unknown:
            raise ValueError(f"{op}: unknown sm_margin keys {sorted(unknown)} "
                             "(expected forward, backward, inference)")
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"{op}: sm_margin must be a non-negative int or a dict of them, "
                             f"got {sm_margin!r}")


@dataclasses.dataclass
class NormContext(OperationContext):
    """What LayerNorm's and RMSNorm's backwards read besides their saved tensors."""

    #: the input's dtype, dx's dtype
    input_dtype: Optional[torch.dtype] = None
    #: the compute dtype (the autocast dtype, else the weight's)
    dtype: Optional[torch.dtype] = None
    #: per parameter (weight, then bias), whether its gradient is returned
    grads_needed: tuple = ()


class _Norm(BasicOperation):
    """Common constructor, parameters and deferred init of LayerNorm and RMSNorm.

    Both normalize over the trailing ``normalized_shape`` dims. Forward calls
    ``torch.ops.te_cpp.layernorm_fwd`` / ``rmsnorm_fwd``, which also return the per-row
    statistics (mean and rstd in float32, float64 for fp64 inputs) that the backward ops reuse.
    The compute dtype is the autocast dtype when autocast is on, else the weight's dtype; the
    input is cast to it, as in TransformerEngine.
    """

    accepts_forward_kwargs = False
    context_type = NormContext

    _has_bias = False

    def __init__(
        self,
        normalized_shape: Union[int, Iterable[int]],
        *,
        eps: float = 1e-5,
        device: Optional[torch.device | str] = None,
        dtype: Optional[torch.dtype] = None,
        zero_centered_gamma: bool = False,
        sm_margin: SmMargin = 0,
    ) -> None:
        super().__init__()
        name = self.__class__.__name__
        self.normalized_shape = _normalized_shape(name, normalized_shape)
        if isinstance(eps, bool) or not isinstance(eps, numbers.Real) or not (eps >= 0) \
                or eps == float("inf"):
            raise ValueError(f"{name}: eps must be a finite number >= 0, got {eps!r}")
        if not isinstance(zero_centered_gamma, bool):
            raise TypeError(f"{name}: zero_centered_gamma must be a bool, got "
                            f"{type(zero_centered_gamma).__name__}")
        _check_sm_margin(name, sm_margin)
        self.eps = float(eps)
        self.zero_centered_gamma = zero_centered_gamma
        self.sm_margin = sm_margin
        self.device = canonicalize_device(device)
        dtype = canonicalize_dtype(dtype)
        check_float_dtype(name, dtype)
        check_numel(name, "weight", self.normalized_shape, dtype)
        self.weight = torch.nn.Parameter(torch.empty(self.normalized_shape, device="meta",
                                                     dtype=dtype))
        if self._has_bias:
            self.bias = torch.nn.Parameter(torch.empty(self.normalized_shape, device="meta",
                                                       dtype=dtype))
        if self.device.type != "meta":
            self.reset_parameters()

    def reset_parameters(self) -> None:
        """weight = 1 (0 with zero_centered_gamma), bias = 0; materialises meta parameters."""
        self.device = materialize_device(self.device)
        fill = torch.nn.init.zeros_ if self.zero_centered_gamma else torch.nn.init.ones_
        init_parameter(self, "weight", fill, self.device)
        if self._has_bias:
            init_parameter(self, "bias", torch.nn.init.zeros_, self.device)

    # deferred initialisation: parameters built on the meta device materialise on first use
    pre_fuser_forward = BasicOperation.materialize_meta_parameters

    def _cast_inputs(self, ctx: NormContext, input_: torch.Tensor, kwargs: dict):
        if not input_.is_floating_point():
            raise TypeError(f"{self.__class__.__name__}: input must be floating point, "
                            f"got {input_.dtype}")
        weight = self._parameters["weight"]
        dtype = autocast_dtype(input_, weight.dtype)
        ctx.input_dtype = input_.dtype
        ctx.dtype = dtype
        x = input_ if input_.dtype == dtype else input_.to(dtype)
        w = weight if weight.dtype == dtype else weight.to(dtype)
        return x, w

    @staticmethod
    def _param_grad(g: torch.Tensor, param: torch.nn.Parameter, needed: bool):
        if not needed:
            return None
        return g if g.dtype == param.dtype else g.to(param.dtype)

    def extra_repr(self) -> str:
        return (f"{self.normalized_shape}, eps={self.eps}, "
                f"zero_centered_gamma={self.zero_centered_gamma}")
