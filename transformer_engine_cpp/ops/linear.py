"""Linear: BasicLinear followed by an optional Bias, as one FusedOperation (TransformerEngine's
``te.ops.Linear``). Its state_dict keys are the basic ops' (``basic_ops.0.weight``,
``basic_ops.1.bias``); ``weight`` and ``bias`` are aliases of those parameters."""

from __future__ import annotations

from typing import Callable, Optional

import torch

from .. import _comm
from ._common import canonicalize_dtype, check_numel, check_size
from .basic import AllReduce, BasicLinear, Bias, ReduceScatter
from .op import FusedOperation


class Linear(FusedOperation):
    """y = x W^T + b.

    Tensor parallelism as TransformerEngine's: without it or in column mode the basic ops are
    ``[BasicLinear, Bias?]`` (column: the bias split like the output features); in row mode
    ``[BasicLinear (this rank's input features, no communication), Bias?, AllReduce |
    ReduceScatter]``, where every rank holds a full-size bias that is added before the
    reduction: the layer's effective bias is the sum of the ranks' biases, and each rank's bias
    gradient is the full db (docs/parallelism.md).

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
        mode, group, size, sequence_parallel, local_in, local_out = \
            _comm.tensor_parallel_config("Linear", tensor_parallel_mode, tensor_parallel_group,
                                         sequence_parallel, in_features, out_features)
        if mode == "row":
            # the GEMM of this rank's input features (no communication of its own), a full-size
            # bias per rank, then the reduction of the partial outputs: the bias is added
            # before the reduction, so the layer's bias is the sum of the ranks' biases
            linear = BasicLinear(
                local_in, local_out, device=device, dtype=dtype,
                rng_state_tracker_function=rng_state_tracker_function,
                accumulate_into_main_grad=accumulate_into_main_grad)
            ops = [linear]
            if bias:
                ops.append(Bias(out_features * size, device=device, dtype=linear.weight.dtype,
                                tensor_parallel=True, tensor_parallel_group=group))
            ops.append(ReduceScatter(group) if sequence_parallel else AllReduce(group))
        else:
            linear = BasicLinear(
                in_features, out_features, device=device, dtype=dtype,
                tensor_parallel_mode=mode, tensor_parallel_group=group,
                sequence_parallel=sequence_parallel,
                rng_state_tracker_function=rng_state_tracker_function,
                accumulate_into_main_grad=accumulate_into_main_grad)
            ops = [linear]
            if bias:  # column: split as the output features
                ops.append(Bias(out_features, device=device, dtype=linear.weight.dtype,
                                tensor_parallel=mode is not None, tensor_parallel_group=group))
        super().__init__(ops)
        self.in_features = in_features
        self.out_features = out_features
        self._has_bias = bias

    @property
    def weight(self) -> torch.nn.Parameter:
        return self.basic_ops[0].weight

    @property
    def bias(self) -> Optional[torch.nn.Parameter]:
        return self.basic_ops[1].bias if self._has_bias else None

    def __setattr__(self, name: str, value) -> None:
        # the aliases write through to the basic ops
        if name == "weight" and "basic_ops" in self._modules:
            self.basic_ops[0].weight = value
        elif name == "bias" and "basic_ops" in self._modules:
            if not self._has_bias:
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
