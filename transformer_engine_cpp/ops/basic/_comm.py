"""The base of the communication ops (AllGather, ReduceScatter, AllReduce)."""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

from ... import _comm
from ...quantization.tensor import QuantizedTensorStorage
from ..op import BasicOperation, OperationContext


def plain(tensor) -> torch.Tensor:
    """A quantized tensor's values in its nominal dtype (the collectives move plain tensors);
    any other tensor as is."""
    if isinstance(tensor, QuantizedTensorStorage):
        return tensor.dequantize()
    return tensor


class CommunicationOperation(BasicOperation):
    """A collective over ``process_group`` (the default group when None). The group and its
    size are resolved when the op is built, or on first use if torch.distributed is not
    initialized yet; the collectives are functional (``transformer_engine_cpp._comm``), eager
    and compiled."""

    accepts_forward_kwargs = False
    # a quantized tensor: passed on as it is by a one-rank group (the identity), its
    # dequantization communicated otherwise (plain)
    accepts_quantized_input = accepts_quantized_grad_output = passes_input_on = True
    # the default group, looked up again after a pickle or deepcopy
    _derived_state = (*BasicOperation._derived_state, "_group", "_group_size")

    def __init__(self, process_group: Optional[dist.ProcessGroup] = None) -> None:
        super().__init__()
        self.process_group = process_group
        self._group: Optional[dist.ProcessGroup] = None
        self._group_size: Optional[int] = None
        if dist.is_available() and dist.is_initialized():
            self._resolved()

    def _resolved(self) -> tuple[dist.ProcessGroup, int]:
        """The process group and its size (looked up once)."""
        if self._group is None:
            who = type(self).__name__
            self._group = _comm.resolve_group(who, self.process_group)
            self._group_size = _comm.group_size(who, self.process_group)
        return self._group, self._group_size

    @property
    def process_group_size(self) -> int:
        """The number of ranks of the op's process group."""
        return self._resolved()[1]

    def op_forward(
        self,
        ctx: OperationContext,
        input_: torch.Tensor,
        *,
        prev_op_grad_output_quantizer=None,
        next_op_input_quantizer=None,
        **kwargs,
    ) -> torch.Tensor:
        group, size = self._resolved()
        if size == 1:
            return input_
        return _comm.wait(self._forward_collective(plain(input_), group, size))

    def op_backward(self, ctx: OperationContext, grad_output: torch.Tensor):
        group, size = self._resolved()
        if size == 1:
            return grad_output, ()
        return _comm.wait(self._backward_collective(plain(grad_output), group, size)), ()

    def _forward_collective(self, x: torch.Tensor, group, size: int) -> torch.Tensor:
        """The forward collective of ``x`` over a group of ``size`` > 1 ranks."""
        raise NotImplementedError

    def _backward_collective(self, dy: torch.Tensor, group, size: int) -> torch.Tensor:
        """The backward collective (the forward one's dual) of ``dy``."""
        raise NotImplementedError
