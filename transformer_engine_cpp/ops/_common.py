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


def init_parameter(op: torch.nn.Module, name: str, fill, device: torch.device) -> None:
    """(Re)initialise ``op.<name>`` with ``fill(tensor)``: in place where it lives (also after
    a ``.to()``), or, for a parameter still on the meta device (deferred init), as a new
    Parameter on ``device`` that keeps the old one's dtype and requires_grad."""
    param = getattr(op, name)
    if param.device.type == "meta":
        data = torch.empty(param.shape, dtype=param.dtype, device=device)
        with torch.no_grad():
            fill(data)
        setattr(op, name, torch.nn.Parameter(data, requires_grad=param.requires_grad))
    else:
        with torch.no_grad():
            fill(param)


def materialize_device(op_device: torch.device) -> torch.device:
    """Where a parameter built on ``op_device`` lives once materialised."""
    return op_device if op_device.type != "meta" else torch.get_default_device()


def has_meta_parameters(op: torch.nn.Module) -> bool:
    for p in op._parameters.values():
        if p is not None and p.is_meta:
            return True
    return False


def compute_dtype(device_type: str, default: Optional[torch.dtype]) -> Optional[torch.dtype]:
    """The autocast dtype when autocast is on for this device type, else ``default``."""
    if torch.amp.is_autocast_available(device_type) and torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return default


def autocast_dtype(t: torch.Tensor, default: Optional[torch.dtype]) -> Optional[torch.dtype]:
    """``compute_dtype(t.device.type, default)``, cheaper for CPU tensors (per-call path: CPU
    autocast is always available, and ``t.is_cpu`` skips building a device object)."""
    if t.is_cpu:
        return torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else default
    return compute_dtype(t.device.type, default)


def storage_address(t) -> Optional[int]:
    """The address of a plain tensor's storage, or None (not a tensor, or a wrapper subclass
    without storage of its own)."""
    if not isinstance(t, torch.Tensor):
        return None
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return None


def shares_storage(a, b) -> bool:
    """Whether two tensors with elements live in the same storage (an in-place write into one
    may change the other)."""
    if a is None or b is None or a.numel() == 0 or b.numel() == 0:
        return False
    ptr = storage_address(a)
    return ptr is not None and ptr == storage_address(b)
