"""Linear: BasicLinear followed by an optional Bias, as one FusedOperation (TransformerEngine's
``te.ops.Linear``). Its state_dict keys are the basic ops' (``basic_ops.0.weight``,
``basic_ops.1.bias``); ``weight`` and ``bias`` are aliases of those parameters."""

from __future__ import annotations

from typing import Callable, Optional

import torch

from ._common import canonicalize_dtype, check_numel, check_size
from .basic import BasicLinear, Bias
from .op import FusedOperation


class Linear(FusedOperation):
    """y = x W^T + b.

    The fuser sees the basic ops, so the forward runs as ForwardLinearBiasActivation (one GEMM
    whose epilogue adds the bias, and applies a following activation too) and the backward as
    the basic ops' or the backward fusions'.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        bias: bool = True,
        device: Optional[torch.device | str] = None,
        dtype: Optional[torch.dtype] = None,
        tensor_parallel_mode: Optional[str] = None,
        tensor_parallel_group=None,
        sequence_parallel: bool = False,
        rng_state_tracker_function: Optional[Callable] = None,
        accumulate_into_main_grad: bool = False,
    ) -> None:
        if not isinstance(bias, bool):
            raise TypeError(f"Linear: bias must be a bool, got {type(bias).__name__}")
        in_features = check_size("Linear", "in_features", in_features)
        out_features = check_size("Linear", "out_features", out_features)
        if dtype is None or isinstance(dtype, torch.dtype):
            check_numel("Linear", "weight", (out_features, in_features), canonicalize_dtype(dtype))
        linear = BasicLinear(
            in_features, out_features, device=device, dtype=dtype,
            tensor_parallel_mode=tensor_parallel_mode, tensor_parallel_group=tensor_parallel_group,
            sequence_parallel=sequence_parallel,
            rng_state_tracker_function=rng_state_tracker_function,
            accumulate_into_main_grad=accumulate_into_main_grad,
        )
        ops = [linear]
        if bias:
            ops.append(Bias(out_features, device=device, dtype=linear.weight.dtype))
        super().__init__(ops)
        self.in_features = in_features
        self.out_features = out_features

    @property
    def weight(self) -> torch.nn.Parameter:
        return self.basic_ops[0].weight

    @property
    def bias(self) -> Optional[torch.nn.Parameter]:
        return self.basic_ops[1].bias if len(self.basic_ops) > 1 else None

    def __setattr__(self, name: str, value) -> None:
        # the aliases write through to the basic ops
        if name == "weight" and "basic_ops" in self._modules:
            self.basic_ops[0].weight = value
        elif name == "bias" and "basic_ops" in self._modules:
            if len(self.basic_ops) < 2:
                raise AttributeError("Linear was built with bias=False")
            self.basic_ops[1].bias = value
        else:
            super().__setattr__(name, value)

    def reset_parameters(self) -> None:
        for op in self.basic_ops:
            op.reset_parameters()

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}")
