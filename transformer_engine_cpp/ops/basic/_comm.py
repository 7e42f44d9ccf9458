"""Shared helpers of the communication ops (AllGather, ReduceScatter, AllReduce): the group's
size, dequantizing a quantized input, and the two dim-0 collectives on the current stream."""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

from ...quantization.tensor import QuantizedTensorStorage
from ..op import BasicOperation

# torch >= 2.10 names the single-tensor collectives *_single; the older names still work but warn.
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def group_size(op_name: str, process_group: Optional[dist.ProcessGroup]) -> int:
    """The number of ranks in ``process_group`` (the default group when None)."""
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            f"{op_name}: torch.distributed is not initialized; call "
            "torch.distributed.init_process_group first (or run under torchrun)"
        )
    return dist.get_world_size(process_group)


def plain(tensor: torch.Tensor) -> torch.Tensor:
    """A quantized tensor's values in its nominal dtype (collectives move plain tensors);
    any other tensor as is, made contiguous."""
    if isinstance(tensor, QuantizedTensorStorage):
        tensor = tensor.dequantize()
    return tensor.contiguous()


def _check_dim0(op_name: str, what: str, shape, size: int) -> None:
    if len(shape) == 0 or shape[0] % size != 0:
        raise RuntimeError(  # RuntimeError, as TransformerEngine raises
            f"{op_name}: cannot reduce-scatter the {what} of shape {list(shape)} over {size} "
            f"processes: dim 0 ({shape[0] if len(shape) else 'none, a 0-d tensor'}) must be a "
            f"multiple of the process group size {size}"
        )


def gather_dim0(op_name: str, what: str, tensor: torch.Tensor, group, size: int) -> torch.Tensor:
    """Concatenation along dim 0 of every rank's ``tensor`` (rank order)."""
    if tensor.dim() == 0:
        raise RuntimeError(f"{op_name}: cannot all-gather the {what}, a 0-d tensor, along dim 0")
    x = plain(tensor)
    out = torch.empty((x.shape[0] * size, *x.shape[1:]), dtype=x.dtype, device=x.device)
    _all_gather(out, x, group=group)
    return out


def reduce_scatter_dim0(op_name: str, what: str, tensor: torch.Tensor, group,
                        size: int) -> torch.Tensor:
    """This rank's dim-0 chunk of the sum over ranks of ``tensor``."""
    _check_dim0(op_name, what, tuple(tensor.shape), size)
    x = plain(tensor)
    out = torch.empty((x.shape[0] // size, *x.shape[1:]), dtype=x.dtype, device=x.device)
    _reduce_scatter(out, x, group=group)
    return out


class CommunicationOperation(BasicOperation):
    """Base of the communication ops: the process group (the default group when None), its size
    looked up on each call (so an op may be built before ``init_process_group``), and no
    torch.compile support yet."""

    accepts_forward_kwargs = False

    def __init__(self, process_group: Optional[dist.ProcessGroup] = None) -> None:
        super().__init__()
        self.process_group = process_group

    @property
    def process_group_size(self) -> int:
        """The number of ranks of the op's process group."""
        return group_size(type(self).__name__, self.process_group)

    def compile_unsupported_reason(self) -> Optional[str]:
        return ("the communication ops run eagerly only for now (their collectives are not yet "
                "traced as functional collectives)")
