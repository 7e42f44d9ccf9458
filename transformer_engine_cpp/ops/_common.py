"""Helpers shared by the op implementations."""

from __future__ import annotations

from typing import Optional

import torch

SUPPORTED_FLOAT_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def canonicalize_device(device: Optional[torch.device | str]) -> torch.device:
    """``None`` means torch's default device (CPU unless changed): unlike the anchor, which
    defaults to CUDA, CPU is a first-class device here."""
    if device is None:
        return torch.get_default_device()
    return torch.device(device)


def canonicalize_dtype(dtype: Optional[torch.dtype]) -> torch.dtype:
    if dtype is None:
        return torch.get_default_dtype()
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype, got {type(dtype).__name__}")
    return dtype


def check_float_dtype(op_name: str, dtype: torch.dtype) -> None:
    if dtype not in SUPPORTED_FLOAT_DTYPES:
        raise ValueError(
            f"{op_name}: unsupported dtype {dtype} (expected float32, float64, bfloat16 or float16)"
        )


def is_compiling() -> bool:
    return torch.compiler.is_compiling()
