"""The type of one conformance case (tests/cases.py lists them; tests/inplace_cases.py
generates the in-place placements)."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Optional

import torch


@dataclasses.dataclass
class OpCase:
    id: str
    #: Builds the ops under test (run as ``te.ops.Sequential(*make(dtype))``).
    make: Callable[[torch.dtype], list]
    #: reference(params, x, *extra_inputs) -> output or tuple of outputs, evaluated in float64.
    #: ``params`` maps "<op index>.<param name>" to float64 copies that require grad, and
    #: ``params.round(t)`` rounds an intermediate to the working dtype (harness.RefParams).
    reference: Callable[..., Any]
    #: Width of the input's last dim.
    features: int
    num_extra_inputs: int = 0
    #: opcheck samples: sample(dtype) -> list of (custom op, args).
    opcheck_samples: Optional[Callable[[torch.dtype], list]] = None
    #: Expected fused op classes in the (forward, backward) plan, if any.
    fused_forward: tuple = ()
    fused_backward: tuple = ()
    #: bad inputs: list of (label, thunk, exception type, regex the message must match).
    bad_inputs: tuple = ()
    #: scale of the random inputs (e.g. to reach the clamps of ClampedSwiGLU).
    input_scale: float = 1.0
    #: trailing shape of the input (default: (features,)); the harness adds leading dims.
    input_tail: Optional[tuple] = None
    #: trailing shape of the extra inputs (default: the input's).
    extra_input_tail: Optional[tuple] = None

    @property
    def tail(self) -> tuple:
        return self.input_tail or (self.features,)
    #: shape of every extra input from (leading dims, features); None: the input's shape.
    #: Extra inputs with their own shape are standard normal and follow the layout's
    #: non-contiguity (e.g. the per-row scales of the scaled activations).
    extra_shape: Optional[Callable[[tuple, int], tuple]] = None
    #: whether the extra inputs require grad (False: the op must not compute their grad).
    extra_requires_grad: bool = True
    #: fit_blocks(block) -> the same case with every dim its quantized GEMMs read (features,
    #: out_features) a multiple of ``block``, for the recipes whose scale blocks must tile
    #: both dims of a GEMM operand (MXFP8BlockScaling: 32, NVFP4BlockScaling: 16), which
    #: refuse other shapes as TransformerEngine does. Required of a case with a quantized GEMM.
    fit_blocks: Optional[Callable[[int], "OpCase"]] = None


def _fitted(make_cases, sizes_for_block, index, block):
    return make_cases(*sizes_for_block(block))[index]


def with_fit_blocks(make_cases, sizes, sizes_for_block):
    """The cases ``make_cases(*sizes)``, each given ``fit_blocks``: the case at the same
    position in ``make_cases(*sizes_for_block(block))`` (same id, block-multiple sizes)."""
    return [dataclasses.replace(case, fit_blocks=functools.partial(
                _fitted, make_cases, sizes_for_block, i))
            for i, case in enumerate(make_cases(*sizes))]
