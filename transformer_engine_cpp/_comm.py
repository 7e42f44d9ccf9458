"""The collectives of tensor and sequence parallelism, on torch.distributed.

Every collective is a functional collective (``torch.distributed._functional_collectives``):
eagerly it is launched asynchronously and returns a tensor that waits for the result on its
first use (or on :func:`wait`), so independent work issued in between overlaps with the
communication; under ``torch.compile`` it is traced as a collective node of the graph, with its
output shape, so a parallel pipeline compiles with no graph break. The same code runs on gloo
(CPU) and NCCL (CUDA); the backend is the process group's.

Collectives along dim 0 only (TransformerEngine's ``gather_along_first_dim`` /
``reduce_scatter_along_first_dim``): the outer (sequence or batch) dimension.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

# torch >= 2.10 names the single-tensor collectives *_single; the older names warn.
_all_gather = getattr(funcol, "all_gather_single", None) or funcol.all_gather_tensor
_reduce_scatter = getattr(funcol, "reduce_scatter_single", None) or funcol.reduce_scatter_tensor


def check_initialized(who: str) -> None:
    """torch.distributed must be initialized before a parallel op is built or run."""
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            f"{who}: torch.distributed is not initialized; call "
            "torch.distributed.init_process_group first (or run under torchrun)")


def resolve_group(who: str, group: Optional[dist.ProcessGroup]) -> dist.ProcessGroup:
    """``group``, or the default (world) group when None."""
    check_initialized(who)
    return group if group is not None else dist.group.WORLD


def group_size(who: str, group: Optional[dist.ProcessGroup]) -> int:
    """The number of ranks of ``group`` (the default group when None)."""
    check_initialized(who)
    return dist.get_world_size(group)


def wait(tensor):
    """The result of a collective: waits for an eager asynchronous one (a no-op when traced,
    where the graph carries the wait, and for any other tensor)."""
    if isinstance(tensor, funcol.AsyncCollectiveTensor):
        return tensor.wait()
    return tensor


def all_gather(tensor: torch.Tensor, group: dist.ProcessGroup, *, who: str,
               what: str) -> torch.Tensor:
    """Concatenation along dim 0 of every rank's ``tensor``, in rank order (asynchronous)."""
    if tensor.dim() == 0:
        raise RuntimeError(f"{who}: cannot all-gather the {what}, a 0-d tensor, along dim 0")
    return _all_gather(tensor.contiguous(), 0, group)


def reduce_scatter(tensor: torch.Tensor, group: dist.ProcessGroup, size: int, *, who: str,
                   what: str) -> torch.Tensor:
    """This rank's dim-0 chunk of the sum over ranks of ``tensor`` (asynchronous). Dim 0 must
    be a multiple of the group size."""
    shape = tuple(tensor.shape)
    if len(shape) == 0 or shape[0] % size != 0:
        raise RuntimeError(  # RuntimeError, as TransformerEngine raises
            f"{who}: cannot reduce-scatter the {what} of shape {list(shape)} over {size} "
            f"processes: dim 0 ({shape[0] if shape else 'none, a 0-d tensor'}) must be a "
            f"multiple of the process group size {size}")
    return _reduce_scatter(tensor.contiguous(), "sum", 0, group)


def all_reduce(tensor: torch.Tensor, group: dist.ProcessGroup, op: str = "sum") -> torch.Tensor:
    """The reduction (``"sum"`` or ``"max"``) over ranks of ``tensor``, into a new tensor
    (asynchronous); ``tensor`` itself is never modified."""
    return funcol.all_reduce(tensor.contiguous(), op, group)


def tensor_parallel_config(who: str, mode: Optional[str], group: Optional[dist.ProcessGroup],
                           sequence_parallel: bool, in_features: int, out_features: int):
    """TransformerEngine's tensor-parallel configuration of a linear layer: ``(mode, group,
    size, sequence_parallel, local_in_features, local_out_features)``. A group of one rank
    turns tensor parallelism off (mode None, no group, no sequence parallelism). Column mode
    splits the output features over the ranks, row mode the input features; the split dim must
    be a multiple of the group size (ValueError otherwise)."""
    if mode not in (None, "column", "row"):
        raise ValueError(f"{who}: tensor_parallel_mode must be None, 'column' or 'row', "
                         f"got {mode!r}")
    if not isinstance(sequence_parallel, bool):
        raise TypeError(f"{who}: sequence_parallel must be a bool, got {sequence_parallel!r}")
    size = 1 if mode is None else group_size(who, group)
    if size == 1:
        return None, None, 1, False, in_features, out_features
    group = resolve_group(who, group)
    split, name = (out_features, "out_features") if mode == "column" else (in_features,
                                                                           "in_features")
    if split % size != 0:
        raise ValueError(f"{who}: invalid configuration for tensor parallelism: "
                         f"tensor_parallel_mode={mode!r} splits {name}={split} over "
                         f"{size} ranks, which does not divide it")
    if mode == "column":
        out_features //= size
    else:
        in_features //= size
    return mode, group, size, sequence_parallel, in_features, out_features
