"""FP8 dtype handling shared by quantizers and tensors: the public ``fp8_dtype`` is a torch
float8 dtype (``torch.float8_e4m3fn`` or ``torch.float8_e5m2``); the custom ops take the format
as an int (0 = E4M3, 1 = E5M2)."""

from __future__ import annotations

import torch

E4M3 = 0
E5M2 = 1

_TO_FORMAT = {torch.float8_e4m3fn: E4M3, torch.float8_e5m2: E5M2}
_TO_DTYPE = {E4M3: torch.float8_e4m3fn, E5M2: torch.float8_e5m2}
FP8_MAX = {E4M3: 448.0, E5M2: 57344.0}


def format_of(fp8_dtype) -> int:
    """The op-level format int of a torch float8 dtype (ValueError for anything else)."""
    try:
        return _TO_FORMAT[fp8_dtype]
    except (KeyError, TypeError):
        raise ValueError("fp8_dtype must be torch.float8_e4m3fn or torch.float8_e5m2, "
                         f"got {fp8_dtype!r}") from None


def dtype_of(fmt: int) -> torch.dtype:
    return _TO_DTYPE[fmt]
